"""Where a run's lanes run: a strategy the CLI gives the orchestrator.

`LocalPlacement` runs every lane as a thread of this process. The cluster's placement (cluster/placement.py)
puts each lane on the lab host its device is plugged into; the runner never imports it."""

from __future__ import annotations

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
            for lane in self.lanes:  # stop the running payloads; each lane puts its device back
                if lane.session is not None:
                    lane.session.interrupt()
            deadline = time.time() + 120
            for lane in self.lanes:
                lane.finished.wait(max(0.0, deadline - time.time()))
            raise
        finally:
            rep.ran += sum(lane.ran for lane in running)
            rep.failed += [c for lane in running for c in lane.failed]
