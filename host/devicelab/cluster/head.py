"""The head's services and the lane that calls them.

`Head` is one actor on the head node (where `devicelab run --cluster` runs). It holds the one ledger and the
one HostWork — builds, quants, base logits and host evals made once — and the head's CPUs as a resource.
Every device's lane is a `LaneActor` on the node it is plugged into, holding its `device:NAME` resource: the
process that holds the device in Ray is the one that drives it (and holds its lock file), so when it dies the
device is free and nothing of it drives on. Its ledger, host work and events reach the head through Ray. A
lane on the head node measures on the head's CPUs: it takes them from the Head (`SharedCPUs`), so it still
measures alone beside the builds, and uses the head's files where they are. The lane writes its cells'
artifacts into a local staging folder; they go to the head, into the ledger's artifacts, before the cell's rows
are recorded — so results, `reparse` and resume work as on one host. Files the head hands out come by content
hash into another node's cache (blobs.py)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import shutil
import tempfile
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import ray

from ..build.cache import Build
from ..errors import DevicelabError
from ..hashing import sha256_file
from ..kinds import get_op
from ..kinds.base import FILE, TREE
from ..lab import device_from, this_host
from ..ledger import Ledger
from ..runner.host import HostCPUs, HostWork, measured
from ..runner.lane import LEDGER_CALLS, Events, Lane, LaneLedger, protocol_calls
from . import KV_NAMESPACE, blobs, lease_key

if TYPE_CHECKING:  # pragma: no cover
    from ..build.source import SourceTree
    from ..build.targets import Target
    from ..models.ladder import QuantFile
    from ..models.store import ModelSource


def relay(proto: type) -> type:
    """A class implementing every call `proto` declares by `self._forward(name, args, kwargs)`: a relay of it
    to another process, that carries nothing the Protocol does not name."""

    def method(name):
        sig = inspect.signature(getattr(proto, name))

        @functools.wraps(getattr(proto, name))
        def call(self, *a, **kw):
            bound = sig.bind(self, *a, **kw)  # by position, defaults filled: what the far side takes
            bound.apply_defaults()
            return self._forward(name, bound.args[1:], {})

        return call

    return type(f"_{proto.__name__}Relay", (), {n: method(n) for n in sorted(protocol_calls(proto))})


if TYPE_CHECKING:  # made at run time from a Protocol by relay(): its calls are the Protocol's, typed there
    _EventsRelay: Any
    _LedgerRelay: Any
else:
    _EventsRelay = relay(Events)
    _LedgerRelay = relay(LaneLedger)


class RelayEvents(_EventsRelay, Events):
    """Events put on the driver's queue, in order (each put returns before the next)."""

    def __init__(self, queue):
        self.q = queue

    def _forward(self, name, a, kw):
        try:
            self.q.put((name, a), timeout=30)
        except Exception:  # the driver's display is not worth a lane
            pass


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=64)  # type: ignore[call-overload]  # ray's typed remote() lacks the actor option max_concurrency its docs give
class Head:
    def __init__(self, ledger_path: str, host_kwargs: dict, queue, telemetry, run_id: str):
        self.ev = RelayEvents(queue)
        self.ledger = Ledger(Path(ledger_path))
        self.host = HostWork(**host_kwargs, events=self.ev)
        self.telemetry, self.run_id = telemetry, run_id
        self._files: dict[str, tuple] = {}  # paths handed out -> (sha256, size, mtime): the only files read()
        # serves, each hashed once while unchanged
        self._guard = threading.Lock()
        self._holds: dict[str, tuple[str, threading.Event]] = {}  # token -> (lane, its release)

    def _give(self, path, sha: str | None = None) -> tuple[str, str, int]:
        """(path, sha256, size) of a file a node may fetch; a file asked for by every cell is hashed once."""
        p = Path(path)
        st = p.stat()
        with self._guard:
            known = self._files.get(str(p))
        if sha is None and known and known[1:] == (st.st_size, st.st_mtime_ns):
            sha = known[0]
        sha = sha or sha256_file(p)
        with self._guard:
            self._files[str(p)] = (sha, st.st_size, st.st_mtime_ns)
        return str(p), sha, st.st_size

    # ---- the one ledger ----
    def ledger_call(self, name: str, a: tuple, kw: dict):
        if name not in LEDGER_CALLS:
            raise DevicelabError(f"the head's ledger has no call {name}")
        return getattr(self.ledger, name)(*a, **kw)

    def put_artifacts(self, cell_id: str, files: dict[str, bytes]) -> None:
        blobs.check_hex(cell_id, "a cell id")
        blobs.write_tree(
            self.ledger.artifacts_dir / cell_id, files, f"{cell_id}'s artifacts", within=self.ledger.artifacts_dir
        )

    # ---- host work, once ----
    def info(self) -> dict:
        from ..build.source import tree_digest

        src = self.host.src
        return {
            "node": ray.get_runtime_context().get_node_id(),  # a lane on this node shares its CPUs and files
            "jobs": self.host.jobs,
            "commit": src.commit,
            "tree": tree_digest(src.path),
            "source_spec": self.host.source_spec,
        }

    def build(self, tgt) -> tuple[dict, dict]:
        b = self.host.build(tgt)
        return b.manifest, {n: self._give(b.tool(n), sha) for n, sha in b.manifest["tools"].items()}

    def quant(self, model: str, quant: str):
        qf = self.host.quant(model, quant)
        return qf, self._give(qf.path, qf.sha256)

    def base(self, model: str):
        return self.host.base(model)

    def model_source(self, model: str):
        return self.host.model_source(model)

    def op(self, name: str, args: tuple):
        """A kind's host operation, made here once: a file as (path, sha256, size) for the node to fetch, a
        folder as (name, digest) — the node asks for its files only when its cache lacks that digest —, data
        as it is."""
        got = self.host.op(name, *args)
        result = get_op(name).result
        if result == FILE:
            return self._give(got)
        if result == TREE:
            if got is None:
                return None
            h = hashlib.sha256()
            for rel, data in blobs.read_tree(got).items():
                h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
            return got.name, h.hexdigest()[:16]
        return got

    def op_tree(self, name: str, args: tuple) -> dict[str, bytes]:
        return blobs.read_tree(self.host.op(name, *args))

    def read(self, path: str, offset: int, n: int) -> bytes:
        if path not in self._files:
            raise DevicelabError(f"the head did not hand out {path}")
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(n)

    # ---- the head's CPUs, for the lanes on the head node (SharedCPUs) ----
    def cpu_enter(self, how: str, label: str, owner: str) -> str:
        """Take the head's CPUs as `how` ("measure", "work", "activity") says; returns once granted. Held by a
        thread here until cpu_leave, or cpu_drop of its owner (a lane that ended or died)."""
        if how not in ("measure", "work", "activity"):
            raise DevicelabError(f"the head's CPUs have no use {how}")
        entered, leave = threading.Event(), threading.Event()
        token = uuid.uuid4().hex
        with self._guard:  # before it is granted: a lane that dies while it waits is dropped all the same
            self._holds[token] = (owner, leave)

        def hold():
            with getattr(self.host.cpu, how)(label):
                entered.set()
                leave.wait()

        threading.Thread(target=hold, name=f"cpu {label}", daemon=True).start()
        entered.wait()
        return token

    def cpu_leave(self, token: str) -> None:
        with self._guard:
            got = self._holds.pop(token, None)
        if got:
            got[1].set()

    def cpu_drop(self, owner: str) -> None:
        """Everything a lane still holds of the head's CPUs (it ended, or its process died)."""
        with self._guard:
            mine = [t for t, (o, _) in self._holds.items() if o == owner]
        for t in mine:
            self.cpu_leave(t)

    def cpu_during(self, start: float, end: float, exclude: str = "") -> list[str]:
        return self.host.cpu.during(start, end, exclude=exclude)


class SharedCPUs:
    """The head's CPUs (runner/host.py's HostCPUs) for a lane on the head node, taken through the Head; the
    measurement of the host beside the payload is this process's own (the payload is its child)."""

    def __init__(self, head, owner: str):
        self.head, self.owner = head, owner

    @contextmanager
    def _held(self, how: str, label: str):
        token = ray.get(self.head.cpu_enter.remote(how, label, self.owner))
        try:
            yield
        finally:
            ray.get(self.head.cpu_leave.remote(token))

    @contextmanager
    def measure(self, who: str):
        with self._held("measure", who), measured() as m:
            yield m

    def work(self, label: str):
        return self._held("work", label)

    def activity(self, label: str):
        return self._held("activity", label)

    def during(self, start: float, end: float, exclude: str = "") -> list[str]:
        return ray.get(self.head.cpu_during.remote(start, end, exclude))

    def cancel(self) -> None:
        """Nothing to end here: a wait is the head's, and cpu_drop ends this lane's when the lane is released."""


class RemoteLedger(_LedgerRelay):
    """The head's ledger from another node: artifacts are staged here and sent with the cell's outcome."""

    def __init__(self, head, staging: Path):
        self.head, self.staging = head, staging

    @property
    def artifacts_dir(self) -> Path:
        self.staging.mkdir(parents=True, exist_ok=True)
        return self.staging

    def _forward(self, name, a, kw):
        return ray.get(self.head.ledger_call.remote(name, a, kw))

    def _ship(self, cell_id: str) -> None:
        d = self.staging / cell_id
        if not d.is_dir():
            return
        files = blobs.read_tree(d)
        if files:
            ray.get(self.head.put_artifacts.remote(cell_id, files))
        shutil.rmtree(d, ignore_errors=True)

    def finish_cell(self, cell_id, rows):
        self._ship(cell_id)
        return self._forward("finish_cell", (cell_id, rows), {})

    def skip_cell(self, cell_id, reason):
        self._ship(cell_id)
        return self._forward("skip_cell", (cell_id, reason), {})

    def fail_cell(self, cell_id, error, retryable):
        self._ship(cell_id)
        return self._forward("fail_cell", (cell_id, error), {"retryable": retryable})


# a file the head hands out: (its path there, sha256, size)
FileDesc = tuple[str, str, int]


@dataclasses.dataclass(frozen=True)
class HeadBuild(Build):
    """A build made on the head: its tools come into this node's cache by content hash when first used."""

    files: dict[str, FileDesc]  # tool -> its file on the head
    fetch: Callable[[FileDesc, int | None], Path]

    def tool(self, name: str) -> Path:
        return self.fetch(self.files[name], 0o755)


class RemoteHostWork:
    """HostWork's face in a lane's process: each piece is made once on the head; files come by content hash
    into another node's cache, and are the head's own on the head node. Another node's CPUs are its own
    (`cpu`: shared with that node's other lanes, each its own process, through the host's CPU lock file), the head
    node's are the Head's; the llama.cpp source for builds on a device is this host's own,
    and must be the head's commit."""

    def __init__(self, head, info: dict, owner: str, note=None):
        self.head, self.jobs, self.info = head, info["jobs"], info
        self.here = info.get("node") == ray.get_runtime_context().get_node_id()  # on the head node
        self.cpu = SharedCPUs(head, owner) if self.here else HostCPUs(note)
        self._src: SourceTree | None = None
        self._lock = threading.Lock()

    def _call(self, name, *a):
        return ray.get(getattr(self.head, name).remote(*a))

    def _fetch(self, desc, mode: int | None = None) -> Path:
        path, sha, size = desc
        if self.here and Path(path).is_file() and Path(path).stat().st_size == size:
            return Path(path)  # the head's file, on this node: the one it just handed out
        return blobs.fetch(
            sha, Path(path).name, size, lambda off, n: ray.get(self.head.read.remote(path, off, n)), mode
        )

    @property
    def src(self) -> SourceTree:
        from ..build import source as sourcemod

        with self._lock:
            if self._src is None:
                try:
                    src = sourcemod.resolve(self.info["source_spec"])
                except DevicelabError:
                    src = sourcemod.resolve(None)
                if src.commit != self.info["commit"]:
                    raise DevicelabError(
                        f"this lab host's llama.cpp source is {src.commit[:12]}, the run's "
                        f"{self.info['commit'][:12]}: give it the same source"
                    )
                if self.info.get("tree") and sourcemod.tree_digest(src.path) != self.info["tree"]:
                    raise DevicelabError(
                        f"this lab host's llama.cpp tree at {src.commit[:12]} differs from the head's (an edited "
                        f"file in {src.path}?): give it the head's tree"
                    )
                self._src = src
            return self._src

    def build(self, tgt: Target) -> HeadBuild:
        manifest, files = self._call("build", tgt)
        return HeadBuild(Path(tempfile.gettempdir()), manifest, files, self._fetch)

    def quant(self, model: str, quant: str) -> QuantFile:
        qf, desc = self._call("quant", model, quant)
        return dataclasses.replace(qf, path=self._fetch(desc))

    def base(self, model: str) -> QuantFile:
        return self._call("base", model)

    def model_source(self, model: str) -> ModelSource:
        return self._call("model_source", model)

    def op(self, name: str, *args: Any) -> Any:
        """A kind's host operation, made on the head; its files come into this node's cache by content."""
        o = get_op(name)
        got = self._call("op", name, args)
        if o.result == FILE:
            return self._fetch(got, o.mode)
        if o.result == TREE and got is not None:
            folder, digest = got
            return blobs.tree(digest, folder, lambda: self._call("op_tree", name, args))
        return got


def _put_lease(device: str, lease: dict | None) -> None:
    """Who holds the device now, for a second run that waits on it (None: nobody)."""
    from ray.experimental import internal_kv

    if lease is None:
        internal_kv._internal_kv_del(lease_key(device), namespace=KV_NAMESPACE)
    else:
        internal_kv._internal_kv_put(
            lease_key(device), json.dumps(lease).encode(), overwrite=True, namespace=KV_NAMESPACE
        )


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=4)  # type: ignore[call-overload]  # ray's typed remote() lacks the actor option max_concurrency its docs give
class LaneActor:
    """One device's lane, on the lab host the device is plugged into (the head's included), holding its
    `device:NAME` resource for the lane's life: the process Ray hands the device to is the one that drives it."""

    def __init__(self, head: Any, queue: Any) -> None:  # the Head actor's handle, the events queue
        self.head, self.queue = head, queue
        self.stop = threading.Event()
        self.lane: Lane | None = None

    def ready(self) -> dict:
        """Where the lane runs, and the devicelab it runs (checked against the run's before the lane starts)."""
        from .node import code_digest

        return {"host": this_host(), "node": ray.get_runtime_context().get_node_id(), "code": code_digest()}

    def run(self, device: dict, cells: list, run_id: str, telemetry, info: dict, lease: dict) -> dict:
        d = device_from(device)
        _put_lease(d.name, lease)
        staging = blobs.root() / "staging" / blobs.check_name(run_id, "a run id") / blobs.check_name(d.name, "a device")
        ev = RelayEvents(self.queue)
        try:
            self.lane = Lane(
                d,
                cells,
                run_id,
                RemoteLedger(self.head, staging),
                RemoteHostWork(self.head, info, d.name, note=ev.stage),
                ev,
                telemetry,
                self.stop,
            )
            self.lane.run()
            return {"ran": self.lane.ran, "failed": self.lane.failed}
        finally:
            _put_lease(d.name, None)
            shutil.rmtree(staging, ignore_errors=True)

    def interrupt(self) -> None:
        self.stop.set()
        if self.lane is not None:
            self.lane.host.cpu.cancel()
            if self.lane.session is not None:
                self.lane.session.interrupt()
