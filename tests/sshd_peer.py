"""A real OpenSSH server (Debian's openssh-server) started by a test on 127.0.0.1 with its own config,
host key and authorized key. This is the peer for the SSH transport: no test double."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    def __init__(self, d: Path, port: int | None = None):
        self.d = Path(d)
        self.d.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.hostkey = self.d / "ssh_host_ed25519_key"
        self.client_key = self.d / "id_ed25519"
        for k in (self.hostkey, self.client_key):
            if not k.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)
        (self.d / "authorized_keys").write_text(Path(str(self.client_key) + ".pub").read_text())
        os.chmod(self.d / "authorized_keys", 0o600)
        self.known_hosts = self.d / "known_hosts"
        pub = Path(str(self.hostkey) + ".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        self.config = self.d / "sshd_config"
        self.config.write_text(f"""Port {self.port}
ListenAddress 127.0.0.1
HostKey {self.hostkey}
PidFile {self.d}/sshd.pid
AuthorizedKeysFile {self.d}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin yes
MaxSessions 64
MaxStartups 64
Subsystem sftp internal-sftp
""")
        self.proc: subprocess.Popen | None = None

    def start(self):
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.d / "sshd.log", "ab"))
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"sshd exited: {(self.d / 'sshd.log').read_text()[-2000:]}")
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def kill(self):
        """SIGKILL the server and every session process it forked (the device 'dies')."""
        if self.proc is None:
            return
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        self.proc.kill()
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        # session processes re-parented before we listed them: find them by their command line
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] and str(self.config) in " ".join(p.info["cmdline"]):
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        self.proc.wait()
        self.proc = None

    def lab_yaml(self, name="board", extra="") -> str:
        return (f"devices:\n  - name: {name!r}\n    transport: ssh\n    host: 127.0.0.1\n    port: {self.port}\n"
                f"    user: root\n    key_file: {self.client_key}\n    known_hosts: {self.known_hosts}\n"
                f"    workdir: {self.d}/device-workdir\n{extra}")
