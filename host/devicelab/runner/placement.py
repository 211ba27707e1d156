"""Where a run's lanes run: a strategy the CLI gives the orchestrator.

`LocalPlacement` runs every lane as a thread of this process. The cluster's placement (cluster/placement.py)
puts each lane on the lab host its device is plugged into; the runner never imports it."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .lane import Events, Lane

if TYPE_CHECKING:  # pragma: no cover
    from ..lab import Device
    from ..ledger import Ledger
    from ..plan import Cell
    from ..precision import Interval
    from ..recipes import TelemetrySpec
    from .host import HostWork


@dataclass
class RunReport:
    run_id: str
    total: int
    skipped: int
    ran: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    status: str = "done"
    # `rounds: auto`: the rounds taken, every compared ratio's interval, those wider than the target, and what
    # stopped the rounds before they all met it (max_rounds, max_minutes), if anything did
    rounds: int | None = None
    intervals: list[Interval] = field(default_factory=list)
    unmet: list[Interval] = field(default_factory=list)
    stopped: str = ""


@dataclass
class RunSetup:
    """What a placement is given to run lanes with: the one ledger, the host's shared work (and the arguments
    that make it, for a head that makes its own), the event sink, the recipe's telemetry settings."""

    ledger: Ledger
    ledger_path: Path
    host: HostWork
    host_kwargs: dict
    events: Events
    telemetry: TelemetrySpec
    recipe_name: str


class Placement(Protocol):
    sweeps_sources: bool  # may open and run again and again: a sweep of llama.cpp sources, a recipe in rounds

    def open(self, setup: RunSetup) -> None:
        """Connect and check before the run starts (a DevicelabError refuses the run in one line)."""

    def run(self, lanes: list[tuple[Device, list[Cell]]], run_id: str, rep: RunReport, prepare: bool = False) -> None:
        """Run every lane to its end; `rep` gets what ran and what failed, however it ends. KeyboardInterrupt
        stops every lane, puts every device back and is raised again. `prepare`: each lane only makes ready what
        its cells run with (builds included) and runs none (a placement that runs its lanes once may do nothing)."""


LANE_STOP_S = 120.0  # Ctrl-C: how long the lanes are given to stop their payloads and put their devices back


def where(thread: threading.Thread) -> str:
    """The innermost devicelab function a thread is in, as file:function:line (a lane that does not stop)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if "devicelab" in code.co_filename:
            return f"{Path(code.co_filename).name}:{code.co_name}:{frame.f_lineno}"
        frame = frame.f_back
    return "an unknown place"


class LocalPlacement:
    """Every lane a thread of this process."""

    sweeps_sources = True

    def __init__(self) -> None:
        self.setup: RunSetup | None = None
        self.lanes: list[Lane] = []

    def open(self, setup: RunSetup) -> None:
        self.setup = setup

    def run(self, lanes: list[tuple[Device, list[Cell]]], run_id: str, rep: RunReport, prepare: bool = False) -> None:
        su = self.setup
        assert su is not None, "open() comes first"
        stop = threading.Event()
        running = self.lanes = [
            Lane(d, cells, run_id, su.ledger, su.host, su.events, su.telemetry, stop, prepare) for d, cells in lanes
        ]
        try:
            for lane in self.lanes:
                lane.thread.start()
            for lane in self.lanes:
                while not lane.finished.wait(0.2):
                    pass
        except KeyboardInterrupt:
            stop.set()
            su.host.cpu.cancel()  # a lane waiting for another run's use of the host's CPUs stops waiting
            # stop the running payloads, every lane at once (one may wait for a payload that is just starting);
            # each lane then puts its device back
            for lane in self.lanes:
                if lane.session is not None:
                    threading.Thread(
                        target=lane.session.interrupt, name=f"interrupt {lane.thread.name}", daemon=True
                    ).start()
            deadline = time.time() + LANE_STOP_S
            for lane in self.lanes:
                lane.finished.wait(max(0.0, deadline - time.time()))
            for lane in self.lanes:
                if not lane.finished.is_set():
                    su.events.stage(
                        f"warning: {lane.device.name} did not stop within {LANE_STOP_S:.0f} s of Ctrl-C "
                        f"(it was in {where(lane.thread)}); its running cell is failed-retryable"
                    )
            raise
        finally:
            rep.ran += sum(lane.ran for lane in running)
            rep.failed += [c for lane in running for c in lane.failed]
