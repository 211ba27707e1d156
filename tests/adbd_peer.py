"""A device-side peer that speaks the real adb transport protocol over TCP, for the real adb host server
to `adb connect` to. It is a protocol-faithful stand-in for adbd, NOT Android: no SELinux, no bionic,
no zygote — commands run with this machine's /bin/sh, or, with userland="android", with Android's shell
and coreutils (Debian's mksh as `sh`, Debian's toybox applets as the only commands, and
qemu-aarch64-static standing in for the phone's CPU). What it implements, from AOSP's
system/core/adb/protocol.txt, SERVICES.TXT and SYNC.TXT:

  messages   CNXN AUTH OPEN OKAY WRTE CLSE (24-byte header, checksum, magic), one-packet flow control
  auth       AUTH TOKEN → SIGNATURE verified (RSA, PKCS#1 v1.5/SHA-1 DigestInfo) against an adb_keys file in
             Android's RSAPublicKey format; an unknown key gets another TOKEN, so the device stays
             `unauthorized` exactly as a phone whose prompt nobody accepted
  services   shell:, shell,v2: (shell protocol: stdout/stderr/exit packets), exec:, sync: (STAT LIST SEND
             RECV QUIT), tcp:PORT (port forwarding)
  getprop    answered from a props file (a `getprop` script on the PATH of the commands it runs)

Fault knobs for tests: kill() drops the TCP connection and stops listening (the phone is unplugged);
mute=True accepts connections but answers nothing while it is set, CNXN included (adb shows the device `offline`):
what it is sent meanwhile waits, and is answered once it is unset, as a stalled adbd that recovers would."""

from __future__ import annotations

import base64
import contextlib
import os
import queue
import shutil
import socket
import stat
import struct
import subprocess
import threading
import time
from pathlib import Path

A_SYNC, A_CNXN, A_AUTH, A_OPEN = 0x434E5953, 0x4E584E43, 0x48545541, 0x4E45504F
A_OKAY, A_CLSE, A_WRTE = 0x59414B4F, 0x45534C43, 0x45545257
A_VERSION, MAX_PAYLOAD = 0x01000001, 256 * 1024
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3
SHA1_DIGESTINFO = bytes.fromhex("3021300906052b0e03021a05000414")


def parse_adb_pubkey(line: str) -> tuple[int, int]:
    """Android's RSAPublicKey: u32 len(words), u32 n0inv, u32 n[len], u32 rr[len], u32 exponent (LE)."""
    raw = base64.b64decode(line.split()[0])
    words = struct.unpack_from("<I", raw, 0)[0]
    n = int.from_bytes(raw[8 : 8 + 4 * words], "little")
    e = struct.unpack_from("<I", raw, 8 + 8 * words)[0]
    return n, e


def verify(sig: bytes, token: bytes, n: int, e: int) -> bool:
    k = (n.bit_length() + 7) // 8
    if len(sig) != k:
        return False
    em = pow(int.from_bytes(sig, "big"), e, n).to_bytes(k, "big")
    t = SHA1_DIGESTINFO + token
    return em == b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t


class Stream:
    def __init__(self, peer: "AdbdPeer", conn: "Conn", local: int, remote: int):
        self.peer, self.conn, self.local, self.remote = peer, conn, local, remote
        self.inbox: "queue.Queue[bytes | None]" = queue.Queue()
        self.acked = threading.Event()
        self.acked.set()
        self.closed = False
        self.buf = b""

    def write(self, data: bytes):
        for i in range(0, len(data), self.conn.maxdata):
            if self.closed:
                raise ConnectionError("stream closed")
            if not self.acked.wait(60):
                raise ConnectionError("no OKAY from host")
            self.acked.clear()
            self.conn.send(A_WRTE, self.local, self.remote, data[i : i + self.conn.maxdata])

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.inbox.get()
            if chunk is None:
                raise ConnectionError("stream closed by host")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_some(self) -> bytes:
        if self.buf:
            out, self.buf = self.buf, b""
            return out
        chunk = self.inbox.get()
        if chunk is None:
            raise ConnectionError("stream closed by host")
        return chunk

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self.conn.send(A_CLSE, self.local, self.remote)
            except OSError:
                pass


class Conn:
    def __init__(self, peer: "AdbdPeer", sock: socket.socket):
        self.peer, self.sock = peer, sock
        self.lock = threading.Lock()
        self.streams: dict[int, Stream] = {}
        self.next_id = 1
        self.maxdata = 4096
        self.token = b""

    def send(self, cmd, a0, a1, data=b""):
        hdr = struct.pack("<6I", cmd, a0, a1, len(data), sum(data) & 0xFFFFFFFF, cmd ^ 0xFFFFFFFF)
        with self.lock:
            self.sock.sendall(hdr + data)

    def recv_exact(self, n):
        b = b""
        while len(b) < n:
            c = self.sock.recv(n - len(b))
            if not c:
                raise ConnectionError("host closed")
            b += c
        return b

    def new_token(self):
        self.token = os.urandom(20)
        self.send(A_AUTH, AUTH_TOKEN, 0, self.token)

    def serve(self):
        try:
            while True:
                cmd, a0, a1, ln, _chk, _magic = struct.unpack("<6I", self.recv_exact(24))
                data = self.recv_exact(ln) if ln else b""
                while self.peer.mute and self.peer.srv is not None:  # stalled; kill() unplugs it
                    time.sleep(0.02)
                self.handle(cmd, a0, a1, data)
        except (ConnectionError, OSError, struct.error):
            pass
        finally:
            for st in self.streams.values():
                st.closed = True
                st.inbox.put(None)
            try:
                self.sock.close()
            except OSError:
                pass

    def handle(self, cmd: int, a0: int, a1: int, data: bytes):
        """One message from the host."""
        p = self.peer
        if cmd == A_CNXN:
            self.maxdata = min(a1, MAX_PAYLOAD)
            if p.require_auth:
                self.new_token()
            else:
                self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, p.banner())
        elif cmd == A_AUTH:
            if a0 == AUTH_SIGNATURE and any(verify(data, self.token, n, e) for n, e in p.authorized_keys()):
                self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, p.banner())
            elif a0 == AUTH_SIGNATURE:
                self.new_token()  # not this key: the host tries the next one, then RSAPUBLICKEY
            # AUTH_RSAPUBLICKEY: a phone would now show "Allow USB debugging?"; nobody accepts here
        elif cmd == A_OPEN:
            local = self.next_id
            self.next_id += 1
            st = Stream(p, self, local, a0)
            self.streams[local] = st
            threading.Thread(target=p.service, args=(st, data.rstrip(b"\0").decode()), daemon=True).start()
        elif cmd == A_OKAY:
            st = self.streams.get(a1)
            if st:
                st.acked.set()
        elif cmd == A_WRTE:
            st = self.streams.get(a1)
            if st:
                self.send(A_OKAY, st.local, st.remote)
                st.inbox.put(data)
        elif cmd == A_CLSE:
            st = self.streams.pop(a1, None)
            if st:
                st.closed = True
                st.inbox.put(None)


def android_userland(d: Path, extra: tuple[str, ...] = ()) -> Path:
    """A folder to be a whole PATH, Android's userland: `sh` -> mksh, every toybox applet -> toybox (Debian's
    packages), plus the named host programs (e.g. qemu-aarch64-static standing in for the phone's CPU)."""
    d.mkdir(parents=True, exist_ok=True)
    toybox = shutil.which("toybox")
    links = {a: toybox for a in subprocess.run([toybox], capture_output=True, text=True, check=True).stdout.split()}
    links["sh"] = shutil.which("mksh")
    links.update({x: shutil.which(x) for x in extra if shutil.which(x)})
    for name, target in links.items():
        if not (d / name).exists():
            (d / name).symlink_to(target)
    return d


def _sync_reply(st: Stream, tag: bytes, *vals):
    st.write(tag + struct.pack(f"<{len(vals)}I", *vals))


def _sync_fail(st: Stream, why: str):
    msg = why.encode()
    st.write(b"FAIL" + struct.pack("<I", len(msg)) + msg)


def _sync_stat(st: Stream, arg: str):
    try:
        s = os.stat(arg)
        _sync_reply(st, b"STAT", s.st_mode, s.st_size & 0xFFFFFFFF, int(s.st_mtime))
    except OSError:
        _sync_reply(st, b"STAT", 0, 0, 0)


def _sync_list(st: Stream, arg: str):
    try:
        for name in sorted(os.listdir(arg)):
            s = os.lstat(os.path.join(arg, name))
            nb = name.encode()
            st.write(b"DENT" + struct.pack("<4I", s.st_mode, s.st_size & 0xFFFFFFFF, int(s.st_mtime), len(nb)) + nb)
    except OSError:
        pass
    st.write(b"DONE" + struct.pack("<4I", 0, 0, 0, 0))


def _sync_send(st: Stream, arg: str):
    """A pushed file: DATA frames until DONE, written unless the file cannot be opened (then FAIL, frames read)."""
    path, _, mode = arg.rpartition(",")
    err = None
    with contextlib.ExitStack() as stack:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fh = stack.enter_context(open(path, "wb"))
        except OSError as e:
            fh, err = None, str(e)
        while True:
            t2, n2 = st.read(4), struct.unpack("<I", st.read(4))[0]
            if t2 == b"DATA":
                chunk = st.read(n2)
                if fh:
                    fh.write(chunk)
            elif t2 == b"DONE":
                break
            else:
                raise ConnectionError(f"bad sync SEND frame {t2!r}")
    if fh:
        os.chmod(path, int(mode) & 0o7777)
        _sync_reply(st, b"OKAY", 0)
    else:
        _sync_fail(st, err)


def _sync_recv(st: Stream, arg: str):
    try:
        with open(arg, "rb") as fh:
            while b := fh.read(64 * 1024):
                st.write(b"DATA" + struct.pack("<I", len(b)) + b)
        _sync_reply(st, b"DONE", 0)
    except OSError as e:
        _sync_fail(st, str(e))


class AdbdPeer:
    def __init__(
        self,
        d: Path,
        port: int,
        adb_keys: Path,
        props: dict[str, str],
        require_auth: bool = True,
        userland: str = "host",
    ):
        self.d = Path(d)
        self.d.mkdir(parents=True, exist_ok=True)
        self.port, self.adb_keys, self.require_auth = port, Path(adb_keys), require_auth
        self.props = props
        self.mute = False
        self.srv: socket.socket | None = None
        self.conns: list[Conn] = []
        self.procs: list[subprocess.Popen] = []
        bindir = self.d / "bin"
        bindir.mkdir(exist_ok=True)
        (self.d / "build.prop").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        gp = bindir / "getprop"
        gp.write_text(
            f"#!/bin/sh\nf={self.d}/build.prop\n"
            f'if [ $# -eq 0 ]; then sed "s/^\\([^=]*\\)=\\(.*\\)$/[\\1]: [\\2]/" "$f"; '
            f'else v=$(grep -m1 "^$1=" "$f" | cut -d= -f2-); echo "${{v:-$2}}"; fi\n'
        )
        gp.chmod(gp.stat().st_mode | stat.S_IEXEC)
        self.sh = "sh"
        path = os.environ["PATH"]
        if userland == "android":
            system = android_userland(self.d / "system-bin", extra=("qemu-aarch64-static",))
            self.sh, path = str(system / "sh"), str(system)
        self.env = dict(os.environ, PATH=f"{bindir}:{path}", ANDROID_ROOT="/system")

    def authorized_keys(self):
        if not self.adb_keys.exists():
            return []
        return [parse_adb_pubkey(l) for l in self.adb_keys.read_text().splitlines() if l.strip()]

    def banner(self) -> bytes:
        props = "".join(
            f"{k}={self.props[k]};"
            for k in ("ro.product.name", "ro.product.model", "ro.product.device")
            if k in self.props
        )
        return f"device::{props}features=shell_v2,cmd,fixed_push_mkdir\0".encode()

    # ---------------------------------------------------------------- lifecycle
    def start(self):
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", self.port))
        self.srv.listen(8)
        threading.Thread(target=self._accept, args=(self.srv,), daemon=True).start()
        return self

    def _accept(self, srv):
        while True:
            try:
                s, _ = srv.accept()
            except OSError:
                return
            c = Conn(self, s)
            self.conns.append(c)
            threading.Thread(target=c.serve, daemon=True).start()

    def kill(self):
        """Unplug: drop every connection, stop listening, kill what the 'device' was running."""
        if self.srv:
            try:
                self.srv.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread: close alone keeps listening
            except OSError:
                pass
            self.srv.close()
            self.srv = None
        for c in self.conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
                c.sock.close()
            except OSError:
                pass
        self.conns = []
        for p in self.procs:
            try:
                os.killpg(p.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass

    # ---------------------------------------------------------------- services
    def service(self, st: Stream, name: str):
        try:
            st.conn.send(A_OKAY, st.local, st.remote)
            if name.startswith("shell"):
                head, _, cmd = name.partition(":")
                self._shell(st, cmd, v2="v2" in head.split(","))
            elif name.startswith("exec:"):
                self._shell(st, name[5:], v2=False, exec_=True)
            elif name == "sync:":
                self._sync(st)
            elif name.startswith("tcp:"):
                self._tcp(st, int(name.split(":")[1]))
        except (ConnectionError, OSError):
            pass
        finally:
            st.close()

    def _shell(self, st: Stream, cmd: str, v2: bool, exec_: bool = False):
        if not cmd:
            return
        p = subprocess.Popen(
            [self.sh, "-c", cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if (v2 or exec_) else subprocess.STDOUT,
            env=self.env,
            cwd="/",
            start_new_session=True,
        )
        self.procs.append(p)
        threading.Thread(target=self._feed, args=(st, p, v2), daemon=True).start()

        def pump(f, pid):
            while True:
                b = os.read(f.fileno(), 65536)
                if not b:
                    return
                st.write(struct.pack("<BI", pid, len(b)) + b if v2 else b)

        errt = None
        if v2:
            errt = threading.Thread(target=pump, args=(p.stderr, 2), daemon=True)
            errt.start()
        elif exec_:
            threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()
        pump(p.stdout, 1)
        if errt:
            errt.join()
        rc = p.wait()
        if v2:
            st.write(struct.pack("<BI", 3, 1) + bytes([rc & 0xFF]))

    @staticmethod
    def _feed(st: Stream, p: subprocess.Popen, v2: bool):
        """The host's stdin to the process (shell v2: framed, until the close-stdin frame)."""
        try:
            while True:
                if v2:
                    hdr = st.read(5)
                    data = st.read(struct.unpack("<I", hdr[1:])[0])
                    if hdr[0] == 0:
                        p.stdin.write(data)
                        p.stdin.flush()
                    elif hdr[0] == 3:
                        break
                else:
                    data = st.read_some()
                    p.stdin.write(data)
                    p.stdin.flush()
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            try:
                p.stdin.close()
            except OSError:
                pass

    def _sync(self, st: Stream):
        requests = {b"STAT": _sync_stat, b"LIST": _sync_list, b"SEND": _sync_send, b"RECV": _sync_recv}
        while True:
            tag, ln = st.read(4), struct.unpack("<I", st.read(4))[0]
            if tag == b"QUIT":
                return
            arg = st.read(ln).decode()
            if tag not in requests:
                raise ConnectionError(f"unknown sync request {tag!r}")
            requests[tag](st, arg)

    def _tcp(self, st: Stream, port: int):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.settimeout(None)

        def up():
            try:
                while True:
                    s.sendall(st.read_some())
            except (ConnectionError, OSError):
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        threading.Thread(target=up, daemon=True).start()
        while True:
            b = s.recv(65536)
            if not b:
                break
            st.write(b)
        s.close()


class AdbServer:
    """The real adb host server (Debian's `adb`), on its own port and with its own HOME (so its RSA key
    is the test's, in $HOME/.android/adbkey)."""

    def __init__(self, d: Path, port: int):
        import shutil

        self.adb = shutil.which("adb") or "adb"
        self.home = Path(d) / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.env = dict(os.environ, HOME=str(self.home), ANDROID_USER_HOME=str(self.home / ".android"))

    def cmd(self, *args, timeout=30) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.adb, "-P", str(self.port), *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )

    def start(self):
        r = self.cmd("start-server")
        if r.returncode != 0:
            raise RuntimeError(f"adb start-server failed: {r.stderr}")
        return self

    @property
    def pubkey(self) -> Path:
        return self.home / ".android" / "adbkey.pub"

    def connect(self, serial: str) -> str:
        r = self.cmd("connect", serial)
        return r.stdout + r.stderr

    def state(self, serial: str) -> str | None:
        for line in self.cmd("devices").stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == serial:
                return parts[1]
        return None

    def stop(self):
        self.cmd("kill-server")


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if not 5555 <= p <= 5585:  # the adb server scans these for emulators
            return p


def fake_dumpsys(peer: AdbdPeer, battery: Path, thermal: Path, meminfo: Path | None = None) -> Path:
    """Android's dumpsys does not exist here: this stand-in answers from fixture files and logs every call,
    so the charging hygiene (unplug … reset) can be checked."""
    log = peer.d / "dumpsys.log"
    p = peer.d / "bin" / "dumpsys"
    mem = f'  "meminfo ") cat {meminfo} ;;\n' if meminfo else ""
    p.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\ncase "$1 $2" in\n'
        f'  "battery unplug"|"battery reset") ;;\n  "battery ") cat {battery} ;;\n'
        f'  "thermalservice ") cat {thermal} ;;\n{mem}esac\n'
    )
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return log


# the stand-in phone's properties (what `getprop` answers)
PROPS = {
    "ro.product.model": "Peer 7",
    "ro.product.manufacturer": "devicelab",
    "ro.product.name": "peer",
    "ro.product.device": "peer",
    "ro.build.version.release": "14",
    "ro.build.version.sdk": "34",
    "ro.product.cpu.abi": "arm64-v8a",
    "ro.soc.model": "SM8550",
    "ro.board.platform": "kalama",
}


# the stand-in phone's battery (its /sys/class/power_supply/battery files, in the ABI's units)
BATTERY = {
    "type": "Battery",
    "status": "Discharging",
    "current_now": "-350000",
    "voltage_now": "3912000",
    "capacity": "77",
    "temp": "301",
    "charge_full": "4410000",
}
