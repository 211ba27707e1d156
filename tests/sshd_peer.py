"""A real OpenSSH server (Debian's openssh-server) started by a test on 127.0.0.1 with its own config,
host key and authorized key. This is the peer for the SSH transport: no test double."""

from __future__ import annotations

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


class Netns:
    """A network namespace the test creates, joined to this machine by a veth pair: the "board" has its
    own address (10.a.b.2) and reaches the host at 10.a.b.1. Needs CAP_NET_ADMIN; create() says whether
    the machine allowed it."""

    def __init__(self):
        tag = os.urandom(3).hex()
        self.name, self.host_if, self.dev_if = f"dl-{tag}", f"dlh{tag}", f"dld{tag}"
        a, b = 16 + int(tag[:2], 16) % 200, int(tag[2:4], 16)
        self.host_ip, self.dev_ip = f"10.{a}.{b}.1", f"10.{a}.{b}.2"
        self.made = False

    def _ip(self, *args) -> bool:
        return subprocess.run(["ip", *args], capture_output=True).returncode == 0

    def create(self) -> bool:
        if not shutil.which("ip") or not self._ip("netns", "add", self.name):
            return False
        self.made = True
        ok = (
            self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.dev_if, "netns", self.name)
            and self._ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            and self._ip("link", "set", self.host_if, "up")
            and self._ip("-n", self.name, "addr", "add", f"{self.dev_ip}/30", "dev", self.dev_if)
            and self._ip("-n", self.name, "link", "set", self.dev_if, "up")
            and self._ip("-n", self.name, "link", "set", "lo", "up")
        )
        if not ok:
            self.delete()
        return ok

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def delete(self) -> None:
        if self.made:
            self._ip("link", "del", self.host_if)
            self._ip("netns", "del", self.name)
            self.made = False


class Sshd:
    def __init__(self, d: Path, port: int | None = None, netns: Netns | None = None):
        self.netns = netns
        self.host = netns.dev_ip if netns else "127.0.0.1"
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
        self.known_hosts.write_text(f"[{self.host}]:{self.port} {pub[0]} {pub[1]}\n")
        self.config = self.d / "sshd_config"
        self.config.write_text(f"""Port {self.port}
ListenAddress {self.host}
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
        prefix = self.netns.prefix() if self.netns else []
        with open(self.d / "sshd.log", "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [*prefix, SSHD, "-D", "-e", "-f", str(self.config)], stdout=subprocess.DEVNULL, stderr=log
            )
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"sshd exited: {(self.d / 'sshd.log').read_text()[-2000:]}") from None
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
        return (
            f"devices:\n  - name: {name!r}\n    transport: ssh\n    host: {self.host}\n    port: {self.port}\n"
            f"    user: root\n    key_file: {self.client_key}\n    known_hosts: {self.known_hosts}\n"
            f"    workdir: {self.d}/device-workdir\n{extra}"
        )
