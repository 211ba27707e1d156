"""A lab of several USB hosts on this one machine, for real: each lab host is a network namespace the test
creates (its own address on a bridge the test creates, its own loopback, its own sshd board that only it can
reach), running a real Ray node started by `devicelab worker`; the head is `devicelab head` outside them, in a
namespace of its own that holds the bridge — because Ray's GCS and raylets listen on every address of their
machine as soon as the node address is not loopback, and the only addresses there must be the test's own.
`listening()` asserts it. Needs root (ip netns, bridge, veth) and openssh-server."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from sshd_peer import SSHD, Sshd, free_port

# a node that stops answering is declared dead after ~2 s instead of Ray's default ~30 s (RayConfig from env)
FAST_DEATH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "4",
}
# small nodes: 1 CPU for Ray's own scheduling (lanes take none), a small object store
RAY_ARGS = ["--ray-arg=--num-cpus=1", "--ray-arg=--object-store-memory=120000000"]


def _ip(*args) -> bool:
    return subprocess.run(["ip", *args], capture_output=True).returncode == 0


class _InNs:
    """What Sshd needs of a namespace: the board listens on the namespace's own loopback."""

    def __init__(self, name: str):
        self.name, self.dev_ip = name, "127.0.0.1"

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]


class LabHost:
    def __init__(self, net: "LabNet", i: int, name: str):
        self.net, self.name = net, name
        self.ns = f"{net.tag}-{i}"
        self.veth_host, self.veth_ns = f"{net.tag}h{i}", f"{net.tag}d{i}"
        self.ip = f"{net.subnet}.{10 + i}"
        self.worker: subprocess.Popen | None = None
        self.board: Sshd | None = None

    def create(self) -> bool:
        hn = self.net.head_ns
        return (
            _ip("netns", "add", self.ns)
            and _ip(
                "-n", hn, "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns, "netns", self.ns
            )
            and _ip("-n", hn, "link", "set", self.veth_host, "master", self.net.bridge)
            and _ip("-n", hn, "link", "set", self.veth_host, "up")
            and _ip("-n", self.ns, "addr", "add", f"{self.ip}/24", "dev", self.veth_ns)
            and _ip("-n", self.ns, "link", "set", self.veth_ns, "up")
            and _ip("-n", self.ns, "link", "set", "lo", "up")
        )

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]

    def start_board(self, d: Path) -> Sshd:
        self.board = b = Sshd(d, netns=_InNs(self.ns))
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        with open(b.d / "sshd.log", "ab") as log:  # the child keeps its own copy of the descriptor
            b.proc = subprocess.Popen(
                [*self.prefix(), SSHD, "-D", "-e", "-f", str(b.config)], stdout=subprocess.DEVNULL, stderr=log
            )
        probe = [*self.prefix(), "bash", "-c", f"echo > /dev/tcp/127.0.0.1/{b.port}"]
        wait_for(lambda: subprocess.run(probe, capture_output=True).returncode == 0, 20, f"{self.name}'s sshd")
        return b

    def lab_entry(self, device: str) -> str:
        b = self.board
        return (
            f"  - name: {device}\n    transport: ssh\n    host: 127.0.0.1\n    port: {b.port}\n    user: root\n"
            f"    key_file: {b.client_key}\n    known_hosts: {b.known_hosts}\n    workdir: {b.d}/device-workdir\n"
            f"    lab_host: {self.name}\n"
        )

    def join(
        self, lab: Path, cache: Path, log: Path, extra: list[str] | None = None, as_host: str | None = None
    ) -> subprocess.Popen:
        """`devicelab worker` on this host (as lab host `as_host`, default its own name), in the foreground of its own
        process group."""
        with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.worker = subprocess.Popen(
                [
                    *self.prefix(),
                    sys.executable,
                    "-m",
                    "devicelab.cli",
                    "worker",
                    "--address",
                    self.net.address,
                    "--lab",
                    str(lab),
                    "--host",
                    as_host or self.name,
                    "--node-ip",
                    self.ip,
                    "--cache",
                    str(cache),
                    *RAY_ARGS,
                    # the lab hosts share this machine's /tmp/ray: their nodes' sockets must not collide
                    f"--ray-arg=--temp-dir=/tmp/{self.ns}-ray",
                    *(extra or []),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.net.env(),
            )
        return self.worker

    def kill_node(self) -> None:
        """SIGKILL every Ray process of this lab host (the host is unplugged); its board stays up."""
        board = {self.board.proc.pid} if self.board and self.board.proc else set()
        for pid in _ns_pids(self.ns):
            if pid in board:
                continue
            try:
                p = psutil.Process(pid)
                if any(w in " ".join(p.cmdline()) for w in ("ray", "devicelab")) and "sshd" not in p.name():
                    p.kill()
            except psutil.NoSuchProcess:
                pass
        if self.worker is not None:
            self.worker.wait(30)
            self.worker = None

    def delete(self) -> None:
        _kill_ns(self.ns)
        _ip("netns", "del", self.ns)
        shutil.rmtree(f"/tmp/{self.ns}-ray", ignore_errors=True)


def _ns_pids(ns: str) -> list[int]:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def _kill_ns(ns: str) -> None:
    """SIGKILL every process of a namespace."""
    for pid in _ns_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class LabNet:
    def __init__(self, hosts: list[str], tls: Path | None = None):
        """`tls`: a folder for the lab's CA and every host's certificate (made in create()): Ray's TLS on."""
        self.tls = tls
        self.tag = "dlc" + os.urandom(2).hex()
        a, b = 16 + os.getpid() % 200, int(self.tag[3:5], 16)
        self.subnet = f"10.{a}.{b}"
        self.head_ip = f"{self.subnet}.1"
        self.bridge = f"{self.tag}br"
        self.head_ns = f"{self.tag}-head"
        self.port = free_port()
        self.address = f"{self.head_ip}:{self.port}"
        self.hosts = [LabHost(self, i + 1, h) for i, h in enumerate(hosts)]
        self.head: subprocess.Popen | None = None
        self.made = False

    def env(self) -> dict:
        e = {**os.environ, **FAST_DEATH}
        if self.tls is not None:
            e["DEVICELAB_TLS"] = str(self.tls)
        return e

    def make_certs(self) -> None:
        """The lab's CA and a certificate per lab host, as `devicelab head --make-certs` and `devicelab cert` make
        them (one folder here: every host of this test is on this machine)."""
        from devicelab.cluster import tls

        tls.make_ca(self.tls)
        tls.issue(self.tls, "head", [self.head_ip])
        for h in self.hosts:
            tls.issue(self.tls, h.name, [h.ip])
        tls.issue(self.tls, platform.node(), [])  # the run's driver and the test's own GCS reads, made once here

    def create(self) -> bool:
        if not shutil.which("ip") or not _ip("netns", "add", self.head_ns):
            return False
        self.made = True
        hn = self.head_ns
        ok = (
            _ip("-n", hn, "link", "add", self.bridge, "type", "bridge")
            and _ip("-n", hn, "addr", "add", f"{self.head_ip}/24", "dev", self.bridge)
            and _ip("-n", hn, "link", "set", self.bridge, "up")
            and _ip("-n", hn, "link", "set", "lo", "up")
            and all(h.create() for h in self.hosts)
        )
        if not ok:
            self.delete()
        elif self.tls is not None:
            self.make_certs()
        return ok

    def start_head(self, lab: Path, log: Path, extra: list[str] | None = None) -> subprocess.Popen:
        with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.head = subprocess.Popen(
                [
                    *self.prefix(),
                    sys.executable,
                    "-m",
                    "devicelab.cli",
                    "head",
                    "--lab",
                    str(lab),
                    "--port",
                    str(self.port),
                    "--node-ip",
                    self.head_ip,
                    "--host",
                    "head",
                    *RAY_ARGS,
                    *(extra or []),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env(),
            )
        wait_for(lambda: self.identity() is not None or self.head.poll() is not None, 180, "the head to start")
        assert self.head.poll() is None, log.read_text()[-3000:]
        return self.head

    def restart_head(self, lab: Path, log: Path) -> subprocess.Popen:
        """The head killed (every process of it) and started again, on a fresh port."""
        _kill_tree(self.head)
        self.port = free_port()
        self.address = f"{self.head_ip}:{self.port}"
        return self.start_head(lab, log)

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.head_ns]

    def _in_head(self, code: str):
        """A few lines of Python in the head's namespace (only there is the head reachable): their JSON."""
        r = subprocess.run(
            [
                *self.prefix(),
                sys.executable,
                "-c",
                "import json, sys\n"
                "from devicelab.cluster.node import gcs\n"  # with the lab's auth token
                f"g = gcs({self.address!r})\n" + code,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=self.env(),
        )
        return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None

    def identity(self) -> dict | None:
        return self._in_head(
            "raw = g.internal_kv_get(b'identity', b'devicelab', timeout=2)\nprint(raw.decode() if raw else 'null')"
        )

    def set_identity(self, ident: dict) -> None:
        self._in_head(
            f"g.internal_kv_put(b'identity', {json.dumps(ident).encode()!r}, True, b'devicelab')\nprint('null')"
        )

    def advertised(self) -> dict[str, str]:
        return (
            self._in_head(
                f"from devicelab.cluster.node import advertised\nprint(json.dumps(advertised({self.address!r})))"
            )
            or {}
        )

    def listening(self) -> dict[str, set[str]]:
        """The addresses Ray processes listen on, by the network namespace they are in: 'root' (this machine's
        own, where its outward address is), 'head', or a lab host's name (`ss` in each: psutil sees only its own
        namespace's sockets)."""
        out: dict[str, set[str]] = {}
        for label, pre in [("root", []), ("head", self.prefix()), *((h.name, h.prefix()) for h in self.hosts)]:
            ss = subprocess.run([*pre, "ss", "-ltnpH"], capture_output=True, text=True).stdout
            for line in ss.splitlines():
                parts = line.split()
                pids = [int(x) for x in re.findall(r"pid=(\d+)", line)]
                if len(parts) < 4 or not any(_is_ray(pid) for pid in pids):
                    continue
                out.setdefault(label, set()).add(parts[3].rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:"))
        return out

    def delete(self) -> None:
        for h in self.hosts:
            if h.board is not None:
                h.board.kill()
            h.delete()
        if self.head is not None:
            _kill_tree(self.head)
            self.head = None
        if self.made:
            _kill_ns(self.head_ns)
            _ip("netns", "del", self.head_ns)
            self.made = False


CAPTURE = """
import signal, socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # every frame of every interface here
out, left = open(sys.argv[1], "wb"), int(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *a: (out.close(), sys.exit(0)))
print("ready", flush=True)
while left > 0:
    b = s.recv(65535)
    out.write(b)
    left -= len(b)
out.close()
signal.pause()
"""


class Capture:
    """Every frame in a network namespace (a raw AF_PACKET socket, as tcpdump opens), the first `limit` bytes kept:
    what crossed the lab's network, to look for what must not cross it in clear."""

    def __init__(self, ns_prefix: list[str], out: Path, limit: int = 40_000_000):
        self.out = out
        self.p = subprocess.Popen(
            [*ns_prefix, sys.executable, "-c", CAPTURE, str(out), str(limit)], stdout=subprocess.PIPE, text=True
        )
        assert self.p.stdout.readline().strip() == "ready"

    def stop(self) -> bytes:
        self.p.terminate()
        self.p.wait(30)
        return self.out.read_bytes()


def _is_ray(pid: int) -> bool:
    try:
        return "ray" in " ".join(psutil.Process(pid).cmdline())
    except psutil.NoSuchProcess:
        return False


def _kill_tree(p: subprocess.Popen) -> None:
    try:
        kids = psutil.Process(p.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for k in [*kids]:
        try:
            k.kill()
        except psutil.NoSuchProcess:
            pass
    p.kill()
    p.wait(30)


def wait_for(cond, limit: float, what: str, every: float = 0.2) -> None:
    deadline = time.time() + limit
    while time.time() < deadline:
        if cond():
            return
        time.sleep(every)
    raise AssertionError(f"waited {limit:.0f} s for {what}")
