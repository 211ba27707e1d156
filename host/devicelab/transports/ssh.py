"""SSH transport (paramiko) for Linux boards and Macs.

Host keys are verified against known_hosts — never AutoAddPolicy: an unknown or changed key is refused
with one line saying how to trust it (`devicelab devices trust NAME`). ~/.ssh/config is honoured (Host
aliases, HostName, User, Port, IdentityFile, ProxyJump), as are ssh-agent keys. Every command is an
argument list, quoted with shlex before it reaches the remote shell."""

from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import paramiko

from ..errors import DevicelabError, RetryableError
from .base import CommandResult, Commit, Platform, Transport, put_script, quote_argv, shell_command

CHUNK = 1 << 20
OPENSSH_MIN_BYTES = 8 << 20  # larger pushes go through the system's OpenSSH client when it has one
# device_payloads/put.sh hashes a big push after writing it, or while writing it on a device with this many CPUs
HASH_WHILE_WRITING_MIN_CPUS = 3
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")
# for OpenSSH when both ends have AES instructions (x86 AES-NI, ARMv8 crypto extensions, Apple silicon):
# AES-GCM costs about half of the default chacha20-poly1305 there; where a core lacks them (Raspberry
# Pi 4's A72) chacha20 is the faster one, so the default order stays
OPENSSH_AES_FIRST = (
    "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr"
)
_DEVICE_CPU = (
    "n=$(getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null); a=0; "
    'grep -qw aes /proc/cpuinfo 2>/dev/null && a=1; [ "$(uname -s)" = Darwin ] && a=1; echo "${n:-1} $a"'
)


def host_has_aes() -> bool:
    if os.uname().sysname == "Darwin":
        return True
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features") and "aes" in value.split():  # x86 / arm64
                    return True
    except OSError:
        pass
    return False


class _FastTransport(paramiko.Transport):
    """GCM ciphers first: no separate HMAC pass, ~30% faster in paramiko (measured: bench/push_throughput.py)."""

    _preferred_ciphers = PREFERRED_CIPHERS + tuple(
        c
        for c in paramiko.Transport._preferred_ciphers  # type: ignore[attr-defined]  # types-paramiko leaves out this class attribute paramiko has
        if c not in PREFERRED_CIPHERS
    )


WINDOW = 1 << 27  # a large channel window: paramiko's 2 MiB default starves fast links


def _known_hosts_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _transport_of(c: paramiko.SSHClient) -> paramiko.Transport:
    """A connected client's transport (None only before it connects)."""
    tr = c.get_transport()
    assert tr is not None, "a connected client has its transport"
    return tr


def fingerprint(key: paramiko.PKey) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class SSHTransport(Transport):
    platform = Platform.UNIX

    def __init__(
        self,
        name: str,
        host: str,
        port: int | None = None,
        user: str | None = None,
        key_file: str | None = None,
        known_hosts: str | None = None,
        ssh_config: str | None = None,
        workdir: str | None = None,
        connect_timeout: float = 15.0,
    ):
        self.name = name
        self.alias = host
        cfg: dict[str, Any] = {}
        cfg_path = Path(ssh_config or "~/.ssh/config").expanduser()
        if cfg_path.exists():
            cfg = paramiko.SSHConfig.from_path(str(cfg_path)).lookup(host)
        self.host = cfg.get("hostname", host)
        self.port = int(port or cfg.get("port", 22))
        self.user = user or cfg.get("user") or os.environ.get("USER", "root")
        ids = [key_file] if key_file else cfg.get("identityfile", [])
        self.key_files = [str(Path(k).expanduser()) for k in ids if k and Path(k).expanduser().exists()]
        self.proxy_jump = cfg.get("proxyjump")
        self.known_hosts = str(Path(known_hosts or "~/.ssh/known_hosts").expanduser())
        self.ssh_config = str(cfg_path) if cfg_path.exists() else None
        self._workdir = workdir
        self.timeout = connect_timeout
        self.client: paramiko.SSHClient | None = None
        self._jump: paramiko.SSHClient | None = None
        self._cpu: tuple[int, bool] | None = None
        self._mux: str | None = None  # folder of the OpenSSH control socket, once a big push made one

    def host_key(self):
        try:
            key = scan_host_key(self.host, self.port)
        except OSError as e:
            raise DevicelabError(f"cannot reach {self.host}:{self.port}: {e}") from e
        return key, f"{self.host}:{self.port} presents {key.get_name()} {fingerprint(key)}"

    def trust_host_key(self, key) -> str:
        trust(self.host, self.port, self.known_hosts, key)
        return self.known_hosts

    @classmethod
    def from_device(cls, d) -> "SSHTransport":
        if not d.host:
            raise DevicelabError(f"device {d.name!r} uses ssh but has no host: set host: in the lab file")
        return cls(d.name, d.host, d.port, d.user, d.key_file, d.known_hosts, d.ssh_config, d.workdir)

    # ---------------------------------------------------------------- connection
    def _client(self) -> paramiko.SSHClient:
        c = paramiko.SSHClient()
        if os.path.exists(self.known_hosts):
            c.load_host_keys(self.known_hosts)
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        return c

    def connect(self) -> None:
        if self.client is not None:
            return
        sock = None
        if self.proxy_jump:
            jhost = self.proxy_jump.split(",")[0]
            juser, _, jhp = jhost.rpartition("@")
            jh, _, jp = jhp.partition(":")
            jt = SSHTransport(
                f"{self.name} (jump {jhost})",
                jh,
                int(jp) if jp else None,
                juser or None,
                key_file=self.key_files[0] if self.key_files else None,
                known_hosts=self.known_hosts,
                ssh_config=self.ssh_config,
            )
            self._jump = jt._connected()
            sock = _transport_of(self._jump).open_channel("direct-tcpip", (self.host, self.port), ("127.0.0.1", 0))
        c = self._client()
        entry = _known_hosts_entry(self.host, self.port)
        try:
            c.connect(
                self.host,
                self.port,
                username=self.user,
                key_filename=self.key_files or None,  # type: ignore[arg-type]  # paramiko takes a list of files too (its docs: "the filename, or list of filenames"); types-paramiko says str
                allow_agent=True,
                look_for_keys=not self.key_files,
                timeout=self.timeout,
                banner_timeout=self.timeout,
                auth_timeout=self.timeout,
                sock=sock,
                transport_factory=_FastTransport,  # type: ignore[arg-type]  # types-paramiko's transport factory still takes gss_kex and gss_deleg_creds, which paramiko 5 neither passes nor has
            )
        except paramiko.BadHostKeyException as e:
            raise DevicelabError(
                f"HOST KEY CHANGED for {entry} ({self.name}): got {fingerprint(e.key)}, known_hosts has "
                f"{fingerprint(e.expected_key)}; refusing to connect. If the device was reinstalled, remove the old "
                f"key (ssh-keygen -f {self.known_hosts} -R '{entry}') and run `devicelab devices trust {self.name}`"
            ) from e
        except paramiko.SSHException as e:
            if "not found in known_hosts" in str(e):
                raise DevicelabError(
                    f"host key of {entry} ({self.name}) is not in {self.known_hosts}; check it and "
                    f"trust it with `devicelab devices trust {self.name}`"
                ) from e
            if isinstance(e, paramiko.AuthenticationException):
                raise DevicelabError(
                    f"ssh authentication to {self.user}@{entry} failed; set key_file in the lab "
                    "file or load the key into ssh-agent"
                ) from e
            if "No authentication methods available" in str(e):  # no key file, none in ~/.ssh, no agent
                raise DevicelabError(
                    f"ssh authentication to {self.user}@{entry} failed: no key to offer; set key_file "
                    "in the lab file or load the key into ssh-agent"
                ) from e
            raise RetryableError(f"ssh to {entry} ({self.name}) failed: {e}") from e
        except (OSError, EOFError, socket.timeout) as e:
            raise RetryableError(f"cannot reach {entry} ({self.name}): {e}; is the device on and sshd running?") from e
        tr = _transport_of(c)
        tr.set_keepalive(15)
        tr.default_window_size = WINDOW
        self.client = c

    def _connected(self) -> paramiko.SSHClient:
        """The client, connected first where it is not."""
        if self.client is None:
            self.connect()
        assert self.client is not None, "connect() sets the client"
        return self.client

    def close(self) -> None:
        for c in (self.client, self._jump):
            if c is not None:
                c.close()
        self.client = self._jump = None
        if self._mux is not None:
            self._mux_finalizer()
            self._mux = None

    def _session(self, timeout: float | None) -> paramiko.Channel:
        tr = self._connected().get_transport()
        if tr is None or not tr.is_active():
            self.client = None
            raise RetryableError(f"lost the ssh connection to {self.name}")
        try:
            ch = tr.open_session(window_size=WINDOW, max_packet_size=1 << 15)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.client = None
            raise RetryableError(f"lost the ssh connection to {self.name}: {e}") from e
        ch.settimeout(timeout)
        return ch

    # ---------------------------------------------------------------- port forwarding
    @contextmanager
    def forward(self, remote_port: int, host: str = "127.0.0.1") -> Iterator[int]:
        """`ssh -L`: a listener on 127.0.0.1:<free port> here; each connection to it becomes a
        direct-tcpip channel to host:remote_port as the device sees it (its loopback by default, or an address
        only it reaches: a phone's tunnel address seen from its Mac), over the verified connection."""
        tr = _transport_of(self._connected())
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(64)
        stop = threading.Event()

        def pump(a: socket.socket | paramiko.Channel, b: socket.socket | paramiko.Channel, done: list) -> None:
            try:
                while True:
                    data = a.recv(1 << 16)
                    if not data:
                        break
                    b.sendall(data)
                # EOF one way is a half-close (the client may still read the answer)
                (b.shutdown_write if isinstance(b, paramiko.Channel) else lambda: b.shutdown(socket.SHUT_WR))()
            except (OSError, EOFError, paramiko.SSHException):
                pass
            finally:
                done.append(1)
                if len(done) == 2:  # both directions ended
                    for x in (a, b):
                        try:
                            x.close()
                        except (OSError, EOFError):
                            pass

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, peer = lsock.accept()
                except OSError:
                    return
                try:
                    ch = tr.open_channel("direct-tcpip", (host, remote_port), peer)
                except (paramiko.SSHException, EOFError, OSError):
                    conn.close()  # the device refused (nothing listening yet): the client retries
                    continue
                done: list = []
                for a, b in ((conn, ch), (ch, conn)):
                    threading.Thread(target=pump, args=(a, b, done), daemon=True).start()

        th = threading.Thread(target=serve, daemon=True, name=f"ssh-forward-{self.name}-{remote_port}")
        th.start()
        try:
            yield lsock.getsockname()[1]
        finally:
            stop.set()
            try:
                lsock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone leaves it listening)
            except OSError:
                pass
            lsock.close()
            th.join(5)

    # ---------------------------------------------------------------- commands
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        cmd = shell_command(argv, cwd=cwd, env=env)
        ch = self._session(timeout)
        out, err = bytearray(), bytearray()
        deadline = time.time() + timeout if timeout else None
        try:
            ch.exec_command(cmd)
            while True:
                if ch.recv_ready():
                    out += ch.recv(CHUNK)
                elif ch.recv_stderr_ready():
                    err += ch.recv_stderr(CHUNK)
                elif (
                    (ch.exit_status_ready() and not ch.recv_ready() and not ch.recv_stderr_ready())
                    or ch.closed
                    or (ch.eof_received and ch.exit_status_ready())
                ):
                    break
                else:
                    if deadline and time.time() > deadline:
                        ch.close()
                        return CommandResult(
                            list(argv), 124, out.decode(errors="replace"), f"timed out after {timeout}s"
                        )
                    if not ch.get_transport().is_active():  # the client's, which _session opened it on
                        raise RetryableError(f"lost the ssh connection to {self.name} while running {argv[0]}")
                    select.select([ch], [], [], 0.2)
            rc = ch.recv_exit_status()
        except (socket.timeout, paramiko.SSHException, EOFError, OSError) as e:
            self.client = None
            raise RetryableError(f"lost the ssh connection to {self.name} while running {argv[0]}: {e}") from e
        finally:
            ch.close()
        if rc == -1:
            self.client = None
            raise RetryableError(f"lost the ssh connection to {self.name} while running {argv[0]}")
        return CommandResult(list(argv), rc, out.decode(errors="replace"), err.decode(errors="replace"))

    # ---------------------------------------------------------------- files
    def put(self, local: Path, remote: str) -> None:
        self.put_verified(local, remote)

    def put_verified(self, local: Path, remote: str, commit: Commit | None = None) -> str | None:
        """Send a file and return the sha256 the device computed of what it wrote; with `commit`, a match
        is also made final there, in the same round trip (no separate mkdir, hash or rename commands:
        each costs a round trip). Large files go through the system's OpenSSH client when present —
        with the same host key check (StrictHostKeyChecking=yes against the same known_hosts), AES-GCM
        first where both ends have AES instructions — since paramiko's pure-Python packet path is
        CPU-bound at about half of scp's rate; the device hashes the file while it is written when it has
        cores to spare (≥ 3), else right after, from the page cache. Small files: one paramiko channel
        with a large window, which beats paramiko's SFTP (it waits on 32 KiB requests)."""
        size = os.path.getsize(local)
        c = [commit.sha, commit.dst, commit.marker, commit.mode or ""] if commit else []
        if size >= OPENSSH_MIN_BYTES and shutil.which("ssh") and not os.environ.get("DEVICELAB_NO_OPENSSH"):
            ncpu, aes = self.device_cpu()
            how = "follow" if ncpu >= HASH_WHILE_WRITING_MIN_CPUS else "after"
            cmd = quote_argv(["sh", "-c", put_script(), "devicelab", how, remote, str(size), *c])
            return self._put_openssh(local, cmd, ["-c", OPENSSH_AES_FIRST] if aes and host_has_aes() else [])
        cmd = quote_argv(["sh", "-c", put_script(), "devicelab", "after", remote, str(size), *c])
        ch = self._session(None)
        out, err = bytearray(), bytearray()
        try:
            ch.exec_command(cmd)
            try:
                with open(local, "rb") as fh:
                    while b := fh.read(CHUNK):
                        ch.sendall(b)
                        while ch.recv_ready():
                            out += ch.recv(CHUNK)
                ch.shutdown_write()
            except OSError:
                if not ch.exit_status_ready():  # the device script stopped reading (a full disk) and said why
                    raise
            while True:
                b = ch.recv(CHUNK)
                if not b:
                    break
                out += b
            while ch.recv_stderr_ready():
                err += ch.recv_stderr(CHUNK)
            rc = ch.recv_exit_status()
        except (socket.timeout, paramiko.SSHException, EOFError, OSError) as e:
            self.client = None
            raise RetryableError(f"push of {Path(local).name} to {self.name} broke off: {e}") from e
        finally:
            ch.close()
        return self._put_result(local, rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def _put_result(self, local: Path, rc: int, out: str, err: str) -> str | None:
        if rc == 28:
            raise DevicelabError(
                f"push of {Path(local).name} to {self.name} wrote a short file ({err.strip()[:120]}); "
                "free space on the device (its workdir's filesystem) and run again"
            )
        if rc != 0:
            raise RetryableError(
                f"push of {Path(local).name} to {self.name} failed (exit {rc}: {err.strip()[:160]}); "
                "is the device's storage full or the link down?"
            )
        return out.split()[0].lower() if out.strip() else None

    def device_cpu(self) -> tuple[int, bool]:
        """(online CPUs, AES instructions) of the device, asked once: they choose how a big push is hashed
        and ciphered."""
        if self._cpu is None:
            out = self.sh(_DEVICE_CPU).stdout.split()
            self._cpu = (int(out[0]) if out and out[0].isdigit() else 1, len(out) > 1 and out[1] == "1")
        return self._cpu

    def openssh_argv(self, extra: Sequence[str] = (), mux: bool = True) -> list[str]:
        """The system ssh client's command line for this device. With `mux`, the first call leaves a
        master connection (ControlPersist) that later pushes reuse, like paramiko's: each push then
        skips the key exchange and authentication (~0.25 s on this VM's loopback); close() ends it."""
        a = [
            "ssh",
            "-p",
            str(self.port),
            "-l",
            self.user,
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            f"ConnectTimeout={int(self.timeout)}",
            "-o",
            "Compression=no",
            *extra,
        ]
        if mux and not os.environ.get("DEVICELAB_NO_SSH_MUX"):
            a += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self._mux_dir()}/%C", "-o", "ControlPersist=120"]
        if self.ssh_config:
            a += ["-F", self.ssh_config]
        for k in self.key_files:
            a += ["-i", k]
        if self.proxy_jump:
            a += ["-J", self.proxy_jump]
        return a + [self.host, "--"]

    def _mux_dir(self) -> str:
        if self._mux is None:
            # a private folder; under /tmp, since a socket path may not exceed 104 bytes (macOS's $TMPDIR is long)
            self._mux = tempfile.mkdtemp(prefix="dl-ssh-", dir="/tmp" if os.path.isdir("/tmp") else None)
            stop = [*self.openssh_argv(mux=False)[:-2], "-o", f"ControlPath={self._mux}/%C", "-O", "exit", self.host]
            self._mux_finalizer = weakref.finalize(self, _stop_mux, stop, self._mux)
        return self._mux

    def _put_openssh(self, local: Path, cmd: str, extra: Sequence[str] = ()) -> str | None:
        with open(local, "rb") as fh:
            p = subprocess.run(self.openssh_argv(extra) + [cmd], stdin=fh, capture_output=True, text=True)
        if p.returncode == 255:  # ssh's own failure (connection, auth), not the device script's
            why = " ".join(p.stderr.split())[:160] or "the connection closed without a message"
            raise RetryableError(f"push of {Path(local).name} to {self.name} broke off (ssh: {why})")
        return self._put_result(local, p.returncode, p.stdout, p.stderr)

    def get(self, remote: str, local: Path) -> None:
        ch = self._session(None)
        tmp = Path(str(local) + ".part")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            ch.exec_command("cat " + quote_argv([remote]))
            with open(tmp, "wb") as fh:
                while True:
                    b = ch.recv(CHUNK)
                    if not b:
                        break
                    fh.write(b)
            rc = ch.recv_exit_status()
        except (socket.timeout, paramiko.SSHException, EOFError, OSError) as e:
            self.client = None
            tmp.unlink(missing_ok=True)
            raise RetryableError(f"pull of {remote} from {self.name} broke off: {e}") from e
        finally:
            ch.close()
        if rc != 0:
            tmp.unlink(missing_ok=True)
            raise OSError(f"{remote} not readable on {self.name}")
        tmp.replace(local)

    def workdir(self) -> str:
        if self._workdir is None:
            r = self.sh('printf "%s" "$HOME"')
            home = r.stdout.strip() or "/tmp"
            self._workdir = posixpath.join(home, ".cache", "devicelab-device")
        return self._workdir


def _stop_mux(argv: list[str], folder: str) -> None:
    """End a transport's OpenSSH master connection (if one was started) and remove its socket folder."""
    if any(Path(folder).iterdir()):
        try:
            subprocess.run(argv, capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
    shutil.rmtree(folder, ignore_errors=True)


def scan_host_key(host: str, port: int, timeout: float = 10.0) -> paramiko.PKey:
    """Fetch a server's host key without authenticating (for `devicelab devices trust`)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    t = paramiko.Transport(sock)
    try:
        t.start_client(timeout=timeout)
        return t.get_remote_server_key()
    finally:
        t.close()


def trust(host: str, port: int, known_hosts: str, key: paramiko.PKey) -> None:
    p = Path(known_hosts).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as fh:
        fh.write(f"{_known_hosts_entry(host, port)} {key.get_name()} {key.get_base64()}\n")
