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
from pathlib import Path

from .. import lab as labmod
from .. import paths
from ..errors import DevicelabError
from ..lab import LAB_HOST_ENV, this_host  # noqa: F401 - this_host: the cluster's name for it
from ..transports import open_transport
from . import IDENTITY_KEY, KV_NAMESPACE, NODE_CACHE_ENV, blobs, resource


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
    return {"code": code_digest(), "llama_cpp": src.commit, "source": src.origin}


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
    import ray._raylet

    use_auth_token()
    return ray._raylet.GcsClient(address=address)


def head_identity(address: str, timeout: float = 10) -> dict:
    need_ray()
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError) as e:
        raise DevicelabError(
            f"no Ray head answers at {address} ({e.strerror or e}): start it with `devicelab head` on "
            "the head host, or check the address"
        ) from None
    try:
        raw = gcs(address).internal_kv_get(IDENTITY_KEY, KV_NAMESPACE, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - any failure to reach the GCS is "no head there"
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
            r = t.run(["true"], timeout=30)
            if r.rc != 0:
                raise DevicelabError(f"`true` exited {r.rc}")
        except Exception as e:  # noqa: BLE001 - one line per device, whatever the transport said
            from ..runner.lane import one_line

            raise DevicelabError(
                f"device {d.name} is not reachable from lab host {host}: {one_line(e)}; plug it in "
                "here or fix its lab_host in the lab file"
            ) from None
        finally:
            try:
                t.close()
            except Exception:  # noqa: BLE001
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


def _common(devices, host: str, node_ip: str | None, ray_args: tuple[str, ...]) -> list[str]:
    res = {resource(d.name): 1 for d in devices}
    argv = ["--block", "--disable-usage-stats", f"--resources={json.dumps(res)}", f"--labels=devicelab.host={host}"]
    return argv + ([f"--node-ip-address={node_ip}"] if node_ip else []) + list(ray_args)


INSECURE_WARNING = (
    "WARNING: --insecure: this lab's Ray cluster has no authentication; anyone who can reach its "
    "ports can run code on every lab host and drive every device. Use it only on a network nobody "
    "else can reach."
)


def run_head(
    lab: labmod.Lab,
    host: str,
    port: int,
    node_ip: str | None,
    source_spec: str | None,
    ray_args: tuple[str, ...] = (),
    say=print,
    insecure: bool = False,
) -> int:
    """Start the head node in the foreground, advertising the lab file's devices that have no lab_host."""
    _stop_on_signals()
    use_auth_token(make=True, insecure=insecure, listens=True)
    blobs.clean_leftovers()
    if insecure:
        say(INSECURE_WARNING)
    mine = identity(source_spec)
    devices = lab.hosted_by(None)
    check_devices(devices, host)
    argv = [
        _ray_cli(),
        "start",
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        *_common(devices, host, node_ip, ray_args),
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
        except Exception:  # noqa: BLE001 - not up yet
            if p.poll() is not None or time.time() > deadline:
                p.kill()
                raise DevicelabError(f"the Ray head did not start at {address} (ray start exited {p.poll()})") from None
            time.sleep(0.5)
    say(
        f"devicelab head {host} at {address}: devices {', '.join(d.name for d in devices) or 'none'}; on each "
        f"other lab host: devicelab worker --address {address} --lab LAB --host NAME"
    )
    return _wait(p)


def run_worker(
    lab: labmod.Lab,
    address: str,
    host: str,
    node_ip: str | None,
    source_spec: str | None,
    cache: Path | None = None,
    ray_args: tuple[str, ...] = (),
    say=print,
    insecure: bool = False,
) -> int:
    """Join this host to the head at `address` in the foreground, advertising its devices; refused in one line
    when its devicelab or llama.cpp differs from the head's, or a device of it is missing or taken."""
    _stop_on_signals()
    use_auth_token(insecure=insecure, listens=True)
    blobs.clean_leftovers(Path(cache).expanduser() if cache else None)
    if insecure:
        say(INSECURE_WARNING)
    head = head_identity(address)
    why = mismatch(identity(source_spec), head)
    if why:
        raise DevicelabError(f"lab host {host} refused: {why}")
    devices = lab.hosted_by(host)
    if not devices:
        raise DevicelabError(
            f"the lab file places no device on lab host {host}: give its devices `lab_host: {host}`"
            " (or start this worker with the --host its devices name)"
        )
    taken = {d: h for d, h in advertised(address).items() if d in {x.name for x in devices}}
    if taken:
        d, h = next(iter(taken.items()))
        raise DevicelabError(f"device {d} is already advertised by lab host {h}: stop that worker first")
    check_devices(devices, host)
    p = _start(
        [_ray_cli(), "start", f"--address={address}", *_common(devices, host, node_ip, ray_args)],
        _node_env(host, cache),
    )
    names = {d.name for d in devices}
    deadline = time.time() + 120
    while not names <= {d for d, h in advertised(address).items() if h == host}:
        if p.poll() is not None or time.time() > deadline:
            p.kill()
            raise DevicelabError(
                f"lab host {host} did not join {address}: `ray start` exited {p.wait()} (its output is above)"
            )
        time.sleep(0.5)
    say(f"lab host {host} joined {address}: devices {', '.join(sorted(names))}")
    return _wait(p)


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP (a service manager, a closed terminal) stop the node like Ctrl-C: `ray start --block`
    is stopped with it, and the cluster does not stay up behind a process that is gone."""
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def _wait(p: subprocess.Popen) -> int:
    try:
        return p.wait()
    except KeyboardInterrupt:
        p.terminate()
        try:
            return p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()
