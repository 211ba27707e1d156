"""plan → one lane per device, all running at once; one device's failure is that device's alone.

A lane's inputs are plain data (the device's settings, its cells, the content hashes of its models) and
its outputs go to the one ledger (rows, artifacts, statuses), so a lane can be placed on another machine:
where the lanes run is a strategy the caller gives (`placement.LocalPlacement`, or the cluster's). The
orchestrator itself holds no per-device state: each lane opens its own DeviceSession."""

from __future__ import annotations

import time
from pathlib import Path

from .. import lab as labmod
from .. import recipes
from ..ledger import DONE, SKIPPED, Ledger, ledger_path
from ..plan import expand
from .host import HostWork
from .lane import Events
from .placement import LocalPlacement, Placement, RunReport, RunSetup


class Orchestrator:
    def __init__(
        self,
        recipe_path: Path,
        lab_path: Path | None,
        lab_dir: Path,
        events: Events | None = None,
        source_override: str | None = None,
        jobs: int | None = None,
    ):
        self.recipe, self.recipe_sha = recipes.load(recipe_path)
        self.recipe_dir = Path(recipe_path).resolve().parent
        self.lab = labmod.load(lab_path)
        for d in self.recipe.devices:
            self.lab.device(d)  # unknown device: fail before anything runs
        self.ledger = Ledger(ledger_path(lab_dir))
        self.ev = events or Events()
        self.source_spec = source_override or self.recipe.source
        self.jobs = jobs
        self.host: HostWork | None = None

    def host_kwargs(self) -> dict:
        r = self.recipe
        return dict(
            source_spec=self.source_spec,
            models={m.name: m.source for m in r.models},
            recipe_dir=self.recipe_dir,
            jobs=self.jobs,
            imatrix={m.name: m.imatrix for m in r.models if m.imatrix},
            lora={m.name: m.lora for m in r.models if m.lora},
        )

    def run(self, placement: Placement | None = None) -> RunReport:
        """Expand the recipe, register its cells, run what is not done yet by `placement` (default: every
        lane a thread here)."""
        placement = placement or LocalPlacement()
        t0 = time.time()
        r = self.recipe
        host = self.host = HostWork(**self.host_kwargs(), events=self.ev)
        shas = {m.name: host.model_sha(m.name) for m in r.models}
        cells = expand(r, host.src.commit, shas)
        self.ledger.register(cells)
        todo = [c for c in cells if self.ledger.status(c.cell_id) not in (DONE, SKIPPED)]
        if todo:  # connects and checks before the run starts
            placement.open(
                RunSetup(self.ledger, self.ledger.path, host, self.host_kwargs(), self.ev, r.telemetry, r.name)
            )
        run_id = self.ledger.start_run(r.name, self.recipe_sha, len(cells))
        rep = RunReport(run_id, len(cells), len(cells) - len(todo))
        self.ev.cells(len(todo))
        lanes = [
            (self.lab.device(d), [c for c in todo if c.device == d])
            for d in r.devices
            if any(c.device == d for c in todo)
        ]
        try:
            placement.run(lanes, run_id, rep)
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
