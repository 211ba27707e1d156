"""One device's lane, and the three interfaces it needs: the ledger it writes to, the host services it asks
of, and the events it emits.

A lane is the same class wherever it runs: in a thread of this process (LocalPlacement) or on the lab host
its device is plugged into (the cluster's lane actor). The local objects (`ledger.Ledger`, `host.HostWork`,
the CLI's event sink) and the cluster's remote ones implement these Protocols; the cluster derives its relays
from them (`protocol_calls`), so a call the Protocol does not name never crosses the wire."""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

from ..errors import DevicelabError, RetryableError

if TYPE_CHECKING:  # pragma: no cover
    from contextlib import AbstractContextManager

    from ..build import AnyBuild
    from ..build.source import SourceTree
    from ..build.targets import Target
    from ..lab import Device
    from ..models.ladder import QuantFile
    from ..models.store import ModelSource
    from ..plan import Cell
    from ..recipes import TelemetrySpec
    from .host import Measurement
    from .session import DeviceSession

# errors that may pass by themselves (the device went away, the link dropped): their cells are retryable
TRANSIENT = (RetryableError, ConnectionError, TimeoutError, EOFError)


class LaneLedger(Protocol):
    """What a lane reads from and writes to the one ledger."""

    @property
    def artifacts_dir(self) -> Path: ...
    def begin_cell(self, cell_id: str, run_id: str) -> tuple[int, str | None]: ...
    def set_artifacts(self, cell_id: str, artifacts: str) -> None: ...
    def finish_cell(self, cell_id: str, rows: list) -> None: ...
    def skip_cell(self, cell_id: str, reason: str) -> None: ...
    def fail_cell(self, cell_id: str, error: str, retryable: bool) -> None: ...
    def status(self, cell_id: str) -> str | None: ...
    def cell(self, cell_id: str) -> dict | None: ...
    def device_fact(self, device: str, kind: str) -> Any: ...
    def set_device_fact(self, device: str, kind: str, value: Any) -> None: ...


class HostCPU(Protocol):
    """The host's CPUs as a resource (host.HostCPUs): a measurement alone, host work beside other work."""

    def measure(self, who: str) -> AbstractContextManager[Measurement]: ...
    def work(self, label: str) -> AbstractContextManager[None]: ...
    def activity(self, label: str) -> AbstractContextManager[None]: ...
    def during(self, start: float, end: float, exclude: str = "") -> list[str]: ...
    def cancel(self) -> None: ...  # the run stops: a wait for another process's use of the CPUs ends


class HostServices(Protocol):
    """The host-side work a lane asks for, each piece made once per key however many lanes ask: builds made
    on the host, quants and bases of the ladder, a model's provenance, and the kinds' own host operations
    (`op`, see kinds/base.py). `cpu` is the CPUs of the host the lane runs on. Implemented by host.HostWork here
    and the cluster's RemoteHostWork on another lab host."""

    @property
    def cpu(self) -> HostCPU: ...
    @property
    def jobs(self) -> int | None: ...  # a build's parallel jobs (None: the machine's CPUs)
    @property
    def src(self) -> SourceTree: ...
    def build(self, tgt: Target) -> AnyBuild: ...
    def quant(self, model: str, quant: str) -> QuantFile: ...
    def base(self, model: str) -> QuantFile: ...
    def model_source(self, model: str) -> ModelSource: ...
    def op(self, name: str, *args: Any) -> Any: ...


class Events:
    """What the run tells the user; the CLI renders it with rich (one live line per device). Called from
    every lane's thread. The default is to say nothing."""

    def stage(self, text: str) -> None: ...
    def build_progress(self, pct: float, line: str) -> None: ...
    def progress(self, what: str, pct: float) -> None: ...  # a long host step: a conversion, a download
    def cells(self, total: int) -> None: ...
    def lane(self, device: str, text: str) -> None: ...
    def cell_start(self, cell: Cell) -> None: ...
    def cell_done(self, cell: Cell, ok: bool, note: str = "") -> None: ...


def protocol_calls(proto: type) -> frozenset[str]:
    """The public methods a Protocol (or the Events base) declares: what a relay of it may carry."""
    return frozenset(n for n, v in vars(proto).items() if not n.startswith("_") and inspect.isfunction(v))


EVENT_CALLS = protocol_calls(Events)
LEDGER_CALLS = protocol_calls(LaneLedger)


@contextmanager
def device_lock(name: str, run_id: str, ev: Events, stop: threading.Event | None = None) -> Iterator[None]:
    """One device, one run: an exclusive lock on a file under the device's entry in DEVICELAB_HOME, held while a
    lane drives it (released by the kernel if the process dies). A second run waits, and says who holds it."""
    import fcntl
    import json
    import os
    import time

    from .. import lab as labmod
    from .. import paths

    d = paths.sub("devices") / name
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "run.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            try:
                h = json.loads(fh.read() or "{}")
            except ValueError:
                h = {}
            since = time.strftime("%H:%M:%S", time.localtime(h.get("since", 0)))
            msg = (
                f"{name} is held by run {h.get('run', '?')} (pid {h.get('pid', '?')} on {h.get('host', '?')}, "
                f"since {since}): waiting for it"
            )
            ev.lane(name, "waiting: " + msg)
            ev.stage(msg)
            paths.flock(fh, fcntl.LOCK_EX, stop, f"{name}, which another run holds")
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"run": run_id, "pid": os.getpid(), "host": labmod.this_host(), "since": time.time()}))
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fh.flush()


def one_line(e: BaseException) -> str:
    if isinstance(e, DevicelabError):
        return str(e)
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:500] if text else type(e).__name__


class Lane:
    """One device's cells, in order."""

    def __init__(
        self,
        device: Device,
        cells: list[Cell],
        run_id: str,
        ledger: LaneLedger,
        host: HostServices,
        events: Events,
        telemetry: TelemetrySpec,
        stop: threading.Event,
        prepare: bool = False,
    ):
        self.device, self.cells, self.run_id, self.ledger, self.host = device, cells, run_id, ledger, host
        self.ev, self.telemetry, self.stop = events, telemetry, stop
        # only make ready what its cells will run with (connect, kit, facts, the build of each backend they ask
        # for), running none: a recipe in rounds has every build made before round 1
        self.prepare = prepare
        self.ran = 0
        self.failed: list[str] = []
        self.session: DeviceSession | None = None
        self.thread = threading.Thread(target=self.run, name=f"lane {device.name}", daemon=True)
        # set when run() has returned. Wait on this, not on thread.join: on Python 3.11 a Ctrl-C that lands in a
        # join marks the thread stopped while it still runs (CPython gh-90882), and its lane would not be waited for
        self.finished = threading.Event()

    def _fail(self, cells: list[Cell], reason: str, retryable: bool) -> None:
        for c in cells:
            self.ledger.fail_cell(c.cell_id, reason, retryable=retryable)
            self.failed.append(c.cell_id)
            self.ev.cell_done(c, False, reason)

    def run(self) -> None:
        from .. import kinds  # here, not at import: the CLI's event sink imports this module
        from .session import DeviceSession

        name = self.device.name
        tools = {t for c in self.cells for t in kinds.get(c.payload).tools(c.params)}
        todo = [] if self.prepare else list(self.cells)
        try:
            with (
                device_lock(name, self.run_id, self.ev, self.stop),
                DeviceSession(self.device, self.ledger, self.host, self.ev, self.telemetry, tools) as s,
            ):
                self.session = s
                if self.prepare:
                    self._make_ready(s)
                while todo:
                    c = todo.pop(0)
                    if self.stop.is_set():
                        self._fail([c, *todo], "interrupted by the user", retryable=True)
                        todo = []
                        break
                    gone = self._one(s, c)
                    if gone:
                        self._fail(
                            todo, f"{name}: the device went away ({gone}); run again once it is back", retryable=True
                        )
                        todo = []
        except Exception as e:  # setup (connect, kit, facts, target, build) or teardown
            why = "interrupted by the user" if self.stop.is_set() else f"{name}: {one_line(e)}"
            if self.session is None or todo:
                self._fail(todo, why, retryable=isinstance(e, TRANSIENT))
            else:
                self.ev.stage(f"warning: {why} (while putting the device back)")
        finally:
            # nothing of this lane is left running, whatever happened
            try:
                # (making ready runs no cell: one a killed run left "running" is taken up by a later lane)
                for c in [] if self.prepare else self.cells:
                    if self.ledger.status(c.cell_id) == "running":
                        self._fail([c], f"{name}: the lane ended while this cell ran", retryable=True)
                self.ev.lane(name, "finished" if not self.failed else f"{len(self.failed)} cell(s) failed")
            finally:
                self.finished.set()

    def _make_ready(self, s: DeviceSession) -> None:
        """The build of every backend its cells ask for (one a device cannot have is its cells' skip, later)."""
        from ..kinds.base import SkipCell

        for backend in sorted({c.params.get("backend") or "" for c in self.cells}):
            if self.stop.is_set():
                return
            try:
                s.builds.for_backend(backend or None)
            except SkipCell:
                pass

    def _one(self, s: DeviceSession, c: Cell) -> str | None:
        """Run one cell; what happened when the device went away during it (its remaining cells cannot run)."""
        from ..ledger import SKIPPED
        from .cell import run_cell

        name = self.device.name
        self.ev.cell_start(c)
        self.ev.lane(name, c.label())
        try:
            run_cell(s, c, self.run_id, self.telemetry.interval_ms)
            self.ran += 1
            skipped = self.ledger.cell(c.cell_id) if self.ledger.status(c.cell_id) == SKIPPED else None
            self.ev.cell_done(c, True, f"skipped: {skipped['error']}" if skipped is not None else "")
        except Exception as e:  # any error of one cell is that cell's
            if self.stop.is_set():
                self._fail([c], "interrupted by the user", retryable=True)
                return None
            retry = isinstance(e, TRANSIENT)
            self._fail([c], f"{name}: {one_line(e)}", retryable=retry)
            if retry and not s.alive():
                return one_line(e)
        return None
