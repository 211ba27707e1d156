"""A lab host joining the lab's Ray cluster: `devicelab head` starts the head node, `devicelab worker` joins
another host to it. Each advertises the devices the lab file places on it (`lab_host:`) as custom resources,
after checking they are there; a worker whose devicelab code or llama.cpp source differs from the head's is
refused before it joins. The head records its identity in the cluster's key-value store (Ray's GCS)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import lab as labmod
from .. import paths
from ..errors import DevicelabError
from ..lab import LAB_HOST_ENV, this_host  # this_host: the cluster's name for it
from ..transports import open_transport
from . import IDENTITY_KEY, KV_NAMESPACE, NODE_CACHE_ENV, blobs, claim_key, resource, tls


def code_digest() -> str:
    """What this devicelab is: the digest of its package and device payloads (a version string would hide an
    edited checkout)."""
    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parents[1]
    files = sorted(pkg.rglob("*.py")) + sorted(p for p in paths.device_payloads_dir().rglob("*") if p.is_file())
    for p in files:
        if "__pycache__" in p.parts:
            continue
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def identity(source_spec: str | None = None) -> dict:
    from ..build import source as sourcemod

    src = sourcemod.resolve(source_spec)
    return {
        "code": code_digest(),
        "llama_cpp": src.commit,
        "llama_tree": sourcemod.tree_digest(src.path),
        "source": src.origin,
    }


def mismatch(mine: dict, head: dict, who: str = "this host's") -> str | None:
    """Why this host cannot join (or this run cannot run) against that head, in one line; None when they match."""
    if mine["code"] != head.get("code"):
        return (
            f"{who} devicelab (code {mine['code']}) differs from the head's ({head.get('code')}): install "
            "the same devicelab commit on every lab host"
        )
    if mine["llama_cpp"] != head.get("llama_cpp"):
        return (
            f"{who} llama.cpp source is {mine['llama_cpp'][:12]}, the head's "
            f"{str(head.get('llama_cpp'))[:12]} ({head.get('source')}): give both the same --source"
        )
    if mine.get("llama_tree") and head.get("llama_tree") and mine["llama_tree"] != head["llama_tree"]:
        return (
            f"{who} llama.cpp tree at {mine['llama_cpp'][:12]} differs from the head's (an edited file?): give both "
            "the same tree"
        )
    return None


def need_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise DevicelabError("a lab across several hosts needs Ray on each: pip install -e '.[cluster]'") from None


_insecure = False  # --insecure was given to this process: authentication stays off


def use_auth_token(make: bool = False, insecure: bool = False, listens: bool = False) -> None:
    """Ray's token authentication, on for every lab host: the head makes a token (~/.ray/auth_token, 0600 in a
    0700 folder) when it has none; every other lab host needs a copy of it (that file, or RAY_AUTH_TOKEN) —
    without it, anyone who reaches a node's port could run code on the lab's hosts and phones. A token file
    other users can read is refused; a process that listens (`head`, `worker`) refuses RAY_AUTH_MODE=disabled
    unless it was started with --insecure."""
    global _insecure
    need_ray()
    from ray._private.authentication import authentication_token_setup as ats

    mode = os.environ.get(ats.AUTH_MODE_ENV_VAR)
    if insecure or _insecure:
        _insecure = True
        os.environ[ats.AUTH_MODE_ENV_VAR] = "disabled"
        return
    if mode is not None and mode.lower() != "token" and listens:
        raise DevicelabError(
            f"{ats.AUTH_MODE_ENV_VAR}={mode} is set in this shell: it would turn the lab's "
            f"authentication off; unset it (or start with --insecure, for a lab nobody else can "
            "reach)"
        )
    path = Path(ats._get_default_token_path())
    if make and not path.exists() and not os.environ.get("RAY_AUTH_TOKEN"):
        _write_token(path, ats.generate_new_authentication_token())
    _check_token_file(path)
    have = ats.AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    if have:
        ats._enable_token_auth()  # for this process and the Ray processes it starts


def _write_token(path: Path, token: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)


def _check_token_file(path: Path) -> None:
    """The token is the key to every lab host: refused when a user other than its owner may read it."""
    if not path.exists():
        return
    for p, want in ((path, 0o600), (path.parent, 0o700)):
        mode = p.stat().st_mode & 0o777
        if mode & 0o077:
            raise DevicelabError(
                f"{p} is readable by other users (mode {mode:o}): anyone with a login here could run "
                f"code on every lab host; chmod {want:o} {path.parent} and chmod 600 {path}"
            )


def gcs(address: str):
    if not os.environ.get("RAY_USE_TLS"):
        tls.use(None, this_host(), client=True)  # the lab's TLS folder from DEVICELAB_TLS, where it is set
    import ray._raylet

    use_auth_token()
    return ray._raylet.GcsClient(address=address)  # type: ignore[attr-defined]  # ray's _raylet.pyi leaves out GcsClient, which the compiled module has


def head_identity(address: str, timeout: float = 10) -> dict:
    need_ray()
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError) as e:  # ValueError: a port that is no number
        why = (e.strerror if isinstance(e, OSError) else None) or e
        raise DevicelabError(
            f"no Ray head answers at {address} ({why}): start it with `devicelab head` on "
            "the head host, or check the address"
        ) from None
    try:
        raw = gcs(address).internal_kv_get(IDENTITY_KEY, KV_NAMESPACE, timeout=timeout)
    except Exception as e:  # any failure to reach the GCS is "no head there"
        if "auth" in str(e).lower():
            raise DevicelabError(
                f"the Ray head at {address} refused this host's authentication token: copy the head's "
                "~/.ray/auth_token to this host (or set RAY_AUTH_TOKEN to it)"
            ) from None
        raise DevicelabError(
            f"no Ray head answers at {address} ({type(e).__name__}): start it with `devicelab head` "
            "on the head host, or check the address"
        ) from None
    if not raw:
        raise DevicelabError(
            f"the Ray cluster at {address} has no devicelab head (its identity is not recorded): "
            "start the head with `devicelab head`"
        )
    return json.loads(raw)


def advertised(address: str) -> dict[str, str]:
    """device -> the lab host (node) advertising it, among the cluster's live nodes."""
    out = {}
    for info in gcs(address).get_all_node_info(timeout=10).values():
        if info.state != 0:  # ALIVE
            continue
        host = dict(info.labels).get("devicelab.host", info.node_manager_address)
        for r in dict(info.resources_total):
            if r.startswith("device:"):
                out[r[len("device:") :]] = host
    return out


def check_devices(devices, host: str) -> None:
    """Every device placed on this host answers through its transport; else one line naming it."""
    for d in devices:
        t = open_transport(d)
        try:
            t.connect()
            if not t.alive(timeout=30):
                raise DevicelabError("connected, but it did not answer a command")
        except Exception as e:  # one line per device, whatever the transport said
            from ..runner.lane import one_line

            raise DevicelabError(
                f"device {d.name} is not reachable from lab host {host}: {one_line(e)}; plug it in "
                "here or fix its lab_host in the lab file"
            ) from None
        finally:
            try:
                t.close()
            except Exception:
                pass


def _ray_cli() -> str:
    here = Path(sys.executable).parent / "ray"
    cli = str(here) if here.exists() else shutil.which("ray")
    if not cli:
        raise DevicelabError("Ray is not installed: pip install -e '.[cluster]'")
    return cli


def _node_env(host: str, cache: Path | None) -> dict:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1", RAY_USAGE_STATS_ENABLED="0")
    env[LAB_HOST_ENV] = host
    env[NODE_CACHE_ENV] = str(cache or paths.sub("node-cache"))
    return env


def _start(argv: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)


# every port a lab host's Ray node opens, pinned from one base (the head's GCS port) so a firewall can name them:
# (what it is, `ray start` option, offset from the base); the worker processes take a range
PORTS = (
    ("GCS (head only)", "--port", 0),
    ("Ray client server (head only)", "--ray-client-server-port", 1),
    ("raylet", "--node-manager-port", 2),
    ("object manager", "--object-manager-port", 3),
    ("runtime-env agent", "--runtime-env-agent-port", 4),
    ("metrics export", "--metrics-export-port", 5),
    ("dashboard agent gRPC", "--dashboard-agent-grpc-port", 6),
    ("dashboard agent HTTP", "--dashboard-agent-listen-port", 7),
)
WORKER_PORTS = (10, 60)  # offsets of the worker processes' range: one port per Ray worker (lanes, prestarted)
HEAD_ONLY = ("--port", "--ray-client-server-port")


def _ray_client_installed() -> bool:
    """Ray's client server runs on a head only where `ray[client]` is installed (and `ray start` refuses its port
    otherwise)."""
    try:
        from ray._private.utils import get_ray_client_dependency_error

        return get_ray_client_dependency_error() is None
    except ImportError:
        return False


def node_ports(base: int, head: bool) -> list[tuple[str, str, int | tuple[int, int]]]:
    """(what, option, port or (first, last)) of every port this node opens."""
    out: list[tuple[str, str, int | tuple[int, int]]] = [
        (what, opt, base + off)
        for what, opt, off in PORTS
        if (head or opt not in HEAD_ONLY) and (opt != "--ray-client-server-port" or _ray_client_installed())
    ]
    out.append(("Ray workers", "--min-worker-port/--max-worker-port", (base + WORKER_PORTS[0], base + WORKER_PORTS[1])))
    return out


def port_args(base: int, head: bool) -> list[str]:
    argv = []
    for _, opt, port in node_ports(base, head):
        if isinstance(port, tuple):
            argv += [f"--min-worker-port={port[0]}", f"--max-worker-port={port[1]}"]
        else:
            argv.append(f"{opt}={port}")
    return argv


def ports_line(base: int, head: bool) -> str:
    parts = [
        f"{what} {p[0]}-{p[1]}" if isinstance(p, tuple) else f"{what} {p}" for what, _, p in node_ports(base, head)
    ]
    return "TCP ports: " + ", ".join(parts)


def _common(devices, host: str, node_ip: str | None, ray_args: tuple[str, ...]) -> list[str]:
    res = {resource(d.name): 1 for d in devices}
    argv = ["--block", "--disable-usage-stats", f"--resources={json.dumps(res)}", f"--labels=devicelab.host={host}"]
    return argv + ([f"--node-ip-address={node_ip}"] if node_ip else []) + list(ray_args)


def _listeners(p: subprocess.Popen) -> set[tuple[str, int]]:
    """(address, port) every process of this node listens on (its `ray start` and everything under it)."""
    import psutil

    try:
        procs = psutil.Process(p.pid)
        pids = {p.pid, *(c.pid for c in procs.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()
    return {
        (c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in pids and c.laddr
    }


def other_addresses(node_ip: str | None) -> list[str]:
    """This host's addresses other than loopback and the node's own: where a listener on every address is also
    reachable."""
    import ipaddress

    import psutil

    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = a.address.split("%")[0]
            if (
                ip != node_ip
                and not ipaddress.ip_address(ip).is_loopback
                and not ipaddress.ip_address(ip).is_link_local
            ):
                out.append(ip)
    return sorted(set(out))


def check_exposure(p: subprocess.Popen, node_ip: str | None, base: int, head: bool, any_address: bool) -> str | None:
    """Where Ray listens, checked once the node is up: on every address (Ray 2.60's gRPC servers bind 0.0.0.0
    whatever --node-ip says) while this host has other addresses than the node's, it is refused in one line unless
    --any-address says the ports are firewalled; a port outside the pinned ones is named. Returns a warning."""
    seen = _listeners(p)
    wild = sorted(port for ip, port in seen if ip in ("0.0.0.0", "::"))
    others = other_addresses(node_ip)
    if wild and others and not any_address:
        raise DevicelabError(
            f"Ray listens on every address of this host (ports {', '.join(map(str, wild[:8]))}"
            f"{'…' if len(wild) > 8 else ''}), so also on {', '.join(others[:3])}, which --node-ip did not name: "
            "firewall the printed ports to the lab's network and pass --any-address, or run this lab host in a "
            "network namespace that holds only the lab's address"
        )
    pinned = set()
    for _, _, port in node_ports(base, head):
        pinned |= set(range(port[0], port[1] + 1)) if isinstance(port, tuple) else {port}
    stray = sorted({port for _, port in seen} - pinned)
    if stray:
        return f"warning: Ray also listens on ports devicelab could not pin: {', '.join(map(str, stray))}"
    return None


CLAIM_STALE_S = 120  # a claim whose worker never brought its node up (it died joining) may be taken after


def claim_devices(address: str, host: str, names: list[str]) -> str:
    """Claim this host's devices in the cluster's key-value store before advertising them: the claim is an atomic
    put that fails when the key exists, so of two workers started at once for one device exactly one goes on. A
    claim is stale — and taken over — once its node is dead, or when its worker never brought a node up. Returns
    this worker's claim token."""
    import secrets

    g, token = gcs(address), secrets.token_hex(8)
    mine = json.dumps({"host": host, "token": token, "at": time.time(), "node": None}).encode()
    for name in names:
        key = claim_key(name)
        if g.internal_kv_put(key, mine, False, KV_NAMESPACE, timeout=10):
            continue
        raw = g.internal_kv_get(key, KV_NAMESPACE, timeout=10)
        held = json.loads(raw) if raw else {}
        why = _claim_live(g, held)
        if why:
            raise DevicelabError(f"device {name} is {why}: stop that worker first")
        g.internal_kv_put(key, mine, True, KV_NAMESPACE, timeout=10)
    live = advertised(address)  # a live node that advertises one without a claim (the head restarted since)
    taken = [n for n in names if n in live]
    if taken:
        release_devices(address, names, token)
        raise DevicelabError(
            f"device {taken[0]} is already advertised by lab host {live[taken[0]]}: stop that worker first"
        )
    return token


def _claim_live(g, held: dict) -> str | None:
    """Why a claim still holds (in words), or None when it is stale."""
    if not held:
        return None
    owner = held.get("host", "?")
    if held.get("node"):
        alive = {nid.hex() if isinstance(nid, bytes) else str(nid) for nid, info in _nodes(g) if info.state == 0}
        return f"already advertised by lab host {owner}" if held["node"] in alive else None
    if time.time() - held.get("at", 0) < CLAIM_STALE_S:
        return f"being claimed by a worker of lab host {owner} that is joining now"
    return None


def _nodes(g):
    return list(g.get_all_node_info(timeout=10).items())


def confirm_claims(address: str, host: str, names: list[str], token: str, node_ip: str | None) -> None:
    """This worker's node is up: its claims name the node, so they hold exactly as long as the node lives."""
    g = gcs(address)
    mine = [
        nid
        for nid, info in _nodes(g)
        if info.state == 0
        and dict(info.labels).get("devicelab.host") == host
        and (node_ip is None or info.node_manager_address == node_ip)
        and all(resource(n) in dict(info.resources_total) for n in names)
    ]
    if len(mine) != 1:
        return  # cannot tell which node is this one: the claims keep their joining age
    node = mine[0].hex() if isinstance(mine[0], bytes) else str(mine[0])
    for name in names:
        raw = g.internal_kv_get(claim_key(name), KV_NAMESPACE, timeout=10)
        held = json.loads(raw) if raw else {}
        if held.get("token") == token:
            g.internal_kv_put(
                claim_key(name), json.dumps({**held, "node": node}).encode(), True, KV_NAMESPACE, timeout=10
            )


def release_devices(address: str, names, token: str) -> None:
    """This worker's claims removed as it leaves (best effort: a dead head keeps nothing anyway)."""
    try:
        g = gcs(address)
        for name in names:
            raw = g.internal_kv_get(claim_key(name), KV_NAMESPACE, timeout=5)
            if raw and json.loads(raw).get("token") == token:
                g.internal_kv_del(claim_key(name), False, KV_NAMESPACE, timeout=5)
    except Exception:  # the head may be gone
        pass


INSECURE_WARNING = (
    "WARNING: --insecure: this lab's Ray cluster has no authentication; anyone who can reach its "
    "ports can run code on every lab host and drive every device. Use it only on a network nobody "
    "else can reach."
)


@dataclass(frozen=True)
class NodeOptions:
    """How this lab host's Ray node starts, as `devicelab head` and `devicelab worker` are told (their shared
    options): its name, the address the others reach it at, the llama.cpp source, `ray start`'s extra arguments,
    authentication and TLS, its ports' base and whether every address may listen, and where it says what it does."""

    host: str
    node_ip: str | None = None
    source_spec: str | None = None
    ray_args: tuple[str, ...] = ()
    insecure: bool = False
    tls_dir: str | Path | None = None
    port: int = 6379
    any_address: bool = False
    say: Callable[[str], object] = print


def secure(o: NodeOptions, *, make_certs: bool, head: bool) -> None:
    """The node's token and TLS, before any Ray process starts: the token (made on the head), refused when others
    can read it; TLS from the lab's folder (its CA and this host's certificate made first on a head asked to)."""
    host, say = o.host, o.say
    if make_certs:
        if not o.tls_dir:
            raise DevicelabError("--make-certs needs --tls DIR: the folder for the lab's CA and certificates")
        folder = Path(o.tls_dir).expanduser()
        made = tls.make_ca(folder)
        tls.issue(folder, host, [o.node_ip] if o.node_ip else [])
        say(
            f"{'made the lab CA and ' if made else ''}{host}'s certificate in {folder}; for each other lab host: "
            f"devicelab cert --tls {folder} --host NAME --ip ADDRESS, then copy ca.crt, NAME.crt, NAME.key to it"
        )
    if tls.use(o.tls_dir, host):  # first: Ray reads its TLS settings once, when its config is first read
        say(f"TLS on between lab hosts (CA {os.environ['RAY_TLS_CA_CERT']})")
    use_auth_token(make=head, insecure=o.insecure, listens=True)
    if o.insecure:
        say(INSECURE_WARNING)


def _up_or_stop(p: subprocess.Popen, check) -> None:
    """Run `check` on a node that is up; a refusal stops the node before it is raised."""
    try:
        check()
    except BaseException:
        _stop(p)
        raise


def run_head(lab: labmod.Lab, o: NodeOptions, *, make_certs: bool = False) -> int:
    """Start the head node in the foreground, advertising the lab file's devices that have no lab_host."""
    _stop_on_signals()
    host, node_ip, port = o.host, o.node_ip, o.port
    secure(o, make_certs=make_certs, head=True)
    blobs.clean_leftovers()
    mine = identity(o.source_spec)
    devices = lab.hosted_by(None)
    check_devices(devices, host)
    argv = [
        _ray_cli(),
        "start",
        "--head",
        *port_args(port, head=True),
        "--include-dashboard=false",
        *_common(devices, host, node_ip, o.ray_args),
    ]
    p = _start(argv, _node_env(host, None))
    address = f"{node_ip or '127.0.0.1'}:{port}"
    deadline = time.time() + 120
    while True:
        try:
            gcs(address).internal_kv_put(
                IDENTITY_KEY, json.dumps({**mine, "head": host}).encode(), True, KV_NAMESPACE, timeout=5
            )
            break
        except Exception:  # not up yet
            if p.poll() is not None or time.time() > deadline:
                p.kill()
                raise DevicelabError(f"the Ray head did not start at {address} (ray start exited {p.poll()})") from None
            time.sleep(0.5)
    _up_or_stop(p, lambda: _say_exposure(p, o, head=True))
    o.say(
        f"devicelab head {host} at {address}: devices {', '.join(d.name for d in devices) or 'none'}; on each "
        f"other lab host: devicelab worker --address {address} --lab LAB --host NAME"
    )
    return _wait(p)


def _say_exposure(p: subprocess.Popen, o: NodeOptions, *, head: bool) -> None:
    o.say(ports_line(o.port, head))
    warning = check_exposure(p, o.node_ip, o.port, head, o.any_address)
    if warning:
        o.say(warning)


def run_worker(lab: labmod.Lab, address: str, o: NodeOptions, *, cache: Path | None = None) -> int:
    """Join this host to the head at `address` in the foreground, advertising its devices; refused in one line
    when its devicelab or llama.cpp differs from the head's, or a device of it is missing or taken."""
    _stop_on_signals()
    host, node_ip, port = o.host, o.node_ip, o.port
    secure(o, make_certs=False, head=False)
    blobs.clean_leftovers(Path(cache).expanduser() if cache else None)
    head = head_identity(address)
    why = mismatch(identity(o.source_spec), head)
    if why:
        raise DevicelabError(f"lab host {host} refused: {why}")
    devices = lab.hosted_by(host)
    if not devices:
        raise DevicelabError(
            f"the lab file places no device on lab host {host}: give its devices `lab_host: {host}`"
            " (or start this worker with the --host its devices name)"
        )
    names = sorted(d.name for d in devices)
    token = claim_devices(address, host, names)
    try:
        check_devices(devices, host)
        p = _start(
            [
                _ray_cli(),
                "start",
                f"--address={address}",
                *port_args(port, head=False),
                *_common(devices, host, node_ip, o.ray_args),
            ],
            _node_env(host, cache),
        )
        deadline = time.time() + 120
        while not set(names) <= {d for d, h in advertised(address).items() if h == host}:
            if p.poll() is not None or time.time() > deadline:
                p.kill()
                raise DevicelabError(
                    f"lab host {host} did not join {address}: `ray start` exited {p.wait()} (its output is above)"
                )
            time.sleep(0.5)
        confirm_claims(address, host, names, token, node_ip)
        _up_or_stop(p, lambda: _say_exposure(p, o, head=False))
        o.say(f"lab host {host} joined {address}: devices {', '.join(names)}")
        return _wait(p)
    finally:
        release_devices(address, names, token)


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP (a service manager, a closed terminal) stop the node like Ctrl-C: `ray start --block`
    is stopped with it, and the cluster does not stay up behind a process that is gone."""
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def _stop(p: subprocess.Popen) -> int:
    p.terminate()
    try:
        return p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait()


def _wait(p: subprocess.Popen) -> int:
    try:
        return p.wait()
    except KeyboardInterrupt:
        return _stop(p)
