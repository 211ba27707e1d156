"""plan → one lane per device, all running at once; one device's failure is that device's alone.

A lane's inputs are plain data (the device's settings, its cells, the content hashes of its models) and
its outputs go to the one ledger (rows, artifacts, statuses), so a lane can later be placed on another
machine. The orchestrator itself holds no per-device state: each lane opens its own DeviceSession."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import kinds, recipes
from .. import lab as labmod
from ..errors import DevicelabError, RetryableError
from ..ledger import DONE, SKIPPED, Ledger
from ..plan import Cell, expand
from .cell import run_cell
from .host import HostWork
from .session import DeviceSession

# errors that may pass by themselves (the device went away, the link dropped): their cells are retryable
TRANSIENT = (RetryableError, ConnectionError, TimeoutError, EOFError)


@dataclass
class RunReport:
    run_id: str
    total: int
    skipped: int
    ran: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    status: str = "done"


class Events:
    """What the run tells the user; the CLI renders it with rich (one live line per device). Called from
    every lane's thread."""

    def stage(self, text: str) -> None: ...
    def build_progress(self, pct: float, line: str) -> None: ...
    def progress(self, what: str, pct: float) -> None: ...     # a long host step: a conversion, a download
    def cells(self, total: int) -> None: ...
    def lane(self, device: str, text: str) -> None: ...
    def cell_start(self, cell: Cell) -> None: ...
    def cell_done(self, cell: Cell, ok: bool, note: str = "") -> None: ...


def one_line(e: BaseException) -> str:
    if isinstance(e, DevicelabError):
        return str(e)
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:500] if text else type(e).__name__


class Lane:
    """One device's cells, in order, in its own thread."""

    def __init__(self, device: labmod.Device, cells: list[Cell], run_id: str, ledger: Ledger, host: HostWork,
                 events: Events, telemetry, stop: threading.Event):
        self.device, self.cells, self.run_id, self.ledger, self.host = device, cells, run_id, ledger, host
        self.ev, self.telemetry, self.stop = events, telemetry, stop
        self.ran = 0
        self.failed: list[str] = []
        self.session: DeviceSession | None = None
        self.thread = threading.Thread(target=self.run, name=f"lane {device.name}", daemon=True)

    def _fail(self, cells: list[Cell], reason: str, retryable: bool) -> None:
        for c in cells:
            self.ledger.fail_cell(c.cell_id, reason, retryable=retryable)
            self.failed.append(c.cell_id)
            self.ev.cell_done(c, False, reason)

    def run(self) -> None:
        name = self.device.name
        tools = {t for c in self.cells for t in kinds.get(c.payload).tools(c.params)}
        todo = list(self.cells)
        try:
            with DeviceSession(self.device, self.ledger, self.host, self.ev, self.telemetry, tools) as s:
                self.session = s
                while todo:
                    c = todo.pop(0)
                    if self.stop.is_set():
                        self._fail([c, *todo], "interrupted by the user", retryable=True)
                        todo = []
                        break
                    self.ev.cell_start(c)
                    self.ev.lane(name, c.label())
                    try:
                        run_cell(s, c, self.run_id, self.telemetry.interval_ms)
                        self.ran += 1
                        st = self.ledger.status(c.cell_id)
                        self.ev.cell_done(c, True, f"skipped: {self.ledger.cell(c.cell_id)['error']}"
                                          if st == SKIPPED else "")
                    except Exception as e:  # noqa: BLE001 - any error of one cell is that cell's
                        if self.stop.is_set():
                            self._fail([c], "interrupted by the user", retryable=True)
                            continue
                        retry = isinstance(e, TRANSIENT)
                        self._fail([c], f"{name}: {one_line(e)}", retryable=retry)
                        if retry and not s.alive():
                            self._fail(todo, f"{name}: the device went away ({one_line(e)}); run again once it "
                                       "is back", retryable=True)
                            todo = []
        except Exception as e:  # noqa: BLE001 - setup (connect, kit, facts, target, build) or teardown
            why = f"{name}: {one_line(e)}"
            if self.session is None or todo:
                self._fail(todo, why, retryable=isinstance(e, TRANSIENT))
            else:
                self.ev.stage(f"warning: {why} (while putting the device back)")
        finally:
            # nothing of this lane is left running, whatever happened
            for c in self.cells:
                if self.ledger.status(c.cell_id) == "running":
                    self._fail([c], f"{name}: the lane ended while this cell ran", retryable=True)
            self.ev.lane(name, "finished" if not self.failed else f"{len(self.failed)} cell(s) failed")


class Orchestrator:
    def __init__(self, recipe_path: Path, lab_path: Path | None, lab_dir: Path, events: Events | None = None,
                 source_override: str | None = None, jobs: int | None = None, cluster: str | None = None):
        self.recipe, self.recipe_sha = recipes.load(recipe_path)
        self.recipe_dir = Path(recipe_path).resolve().parent
        self.lab = labmod.load(lab_path)
        for d in self.recipe.devices:
            self.lab.device(d)      # unknown device: fail before anything runs
        self.ledger = Ledger(Path(lab_dir) / "ledger.sqlite")
        self.ev = events or Events()
        self.source_spec = source_override or self.recipe.source
        self.jobs = jobs
        self.cluster = cluster or self.lab.cluster       # a Ray head's HOST:PORT: lanes on their devices' hosts
        self.lanes: list[Lane] = []
        self.host: HostWork | None = None

    def host_kwargs(self) -> dict:
        r = self.recipe
        return dict(source_spec=self.source_spec, models={m.name: m.source for m in r.models},
                    recipe_dir=self.recipe_dir, jobs=self.jobs,
                    imatrix={m.name: m.imatrix for m in r.models if m.imatrix},
                    lora={m.name: m.lora for m in r.models if m.lora})

    def run(self) -> RunReport:
        t0 = time.time()
        r = self.recipe
        host = self.host = HostWork(**self.host_kwargs(), events=self.ev)
        shas = {m.name: host.model_sha(m.name) for m in r.models}
        cells = expand(r, host.src.commit, shas)
        self.ledger.register(cells)
        todo = [c for c in cells if self.ledger.status(c.cell_id) not in (DONE, SKIPPED)]
        placement = None
        if self.cluster and todo:
            from ..cluster.placement import ClusterPlacement
            placement = ClusterPlacement(self, self.cluster)      # connects and checks before the run starts
        run_id = self.ledger.start_run(r.name, self.recipe_sha, len(cells))
        rep = RunReport(run_id, len(cells), len(cells) - len(todo))
        self.ev.cells(len(todo))
        lanes = [(self.lab.device(d), [c for c in todo if c.device == d]) for d in r.devices
                 if any(c.device == d for c in todo)]
        try:
            (placement.run if placement is not None else self._run_here)(lanes, run_id, rep)
        except KeyboardInterrupt:
            rep.status = "interrupted"
            raise
        finally:
            self.ledger.fail_running(run_id, "the run ended while this cell ran")
            rep.seconds = time.time() - t0
            if rep.failed and rep.status == "done":
                rep.status = "failed"
            self.ledger.finish_run(run_id, rep.status, rep.ran, rep.skipped)
        return rep

    def _run_here(self, lanes, run_id: str, rep: RunReport) -> None:
        """Every lane a thread of this process; rep gets what ran and what failed, however it ends."""
        stop = threading.Event()
        self.lanes = [Lane(d, cells, run_id, self.ledger, self.host, self.ev, self.recipe.telemetry, stop)
                      for d, cells in lanes]
        try:
            for lane in self.lanes:
                lane.thread.start()
            for lane in self.lanes:
                while lane.thread.is_alive():
                    lane.thread.join(0.2)
        except KeyboardInterrupt:
            stop.set()
            for lane in self.lanes:            # stop the running payloads; each lane puts its device back
                if lane.session is not None:
                    lane.session.interrupt()
            deadline = time.time() + 120
            for lane in self.lanes:
                lane.thread.join(max(0.0, deadline - time.time()))
            raise
        finally:
            rep.ran = sum(lane.ran for lane in self.lanes)
            rep.failed = [c for lane in self.lanes for c in lane.failed]
