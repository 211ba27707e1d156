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
from ..build import source as sourcemod
from ..errors import DevicelabError
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
        self.source_override = source_override
        self.jobs = jobs
        self.host: HostWork | None = None

    def host_kwargs(self, source_spec: str | None = None) -> dict:
        r = self.recipe
        return dict(
            source_spec=source_spec or self.source_specs()[0],
            models={m.name: m.source for m in r.models},
            recipe_dir=self.recipe_dir,
            jobs=self.jobs,
            imatrix={m.name: m.imatrix for m in r.models if m.imatrix},
            lora={m.name: m.lora for m in r.models if m.lora},
        )

    def source_specs(self) -> list[str]:
        return [self.source_override] if self.source_override else self.recipe.source_specs()

    def run(self, placement: Placement | None = None) -> RunReport:
        """Expand the recipe, register its cells, run what is not done yet by `placement` (default: every
        lane a thread here). A sweep of llama.cpp sources runs them one after the other, each with its own host
        work (its build), on every device at once."""
        placement = placement or LocalPlacement()
        specs = self.source_specs()
        if len(specs) > 1 and not placement.sweeps_sources:
            raise DevicelabError(
                f"this placement runs one llama.cpp source; the recipe sweeps {len(specs)}: run "
                "the sweep on one host (without --cluster), or one source at a time with --source"
            )
        t0 = time.time()
        r = self.recipe
        host = self.host = HostWork(**self.host_kwargs(specs[0]), events=self.ev)
        shas = {m.name: host.model_sha(m.name) for m in r.models}
        commits = [host.src.commit] + [sourcemod.commit_of(s) for s in specs[1:]]
        todo_by: list[tuple[str, list]] = []
        total = 0
        for spec, commit in zip(specs, commits, strict=True):
            cells = expand(r, commit, shas)
            self.ledger.register(cells)
            total += len(cells)
            todo_by.append((spec, [c for c in cells if self.ledger.status(c.cell_id) not in (DONE, SKIPPED)]))
        todo = [c for _, cs in todo_by for c in cs]
        first = next((spec for spec, cs in todo_by if cs), None)
        if first is not None:  # connects and checks before the run starts
            self._open(placement, first)
        run_id = self.ledger.start_run(r.name, self.recipe_sha, total)
        rep = RunReport(run_id, total, total - len(todo))
        try:
            self.ev.cells(len(todo))
            for spec, cells in todo_by:
                if cells:
                    if spec != first:
                        self._open(placement, spec)
                    self._run_source(placement, cells, run_id, rep)
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

    def _open(self, placement: Placement, spec: str) -> None:
        """The placement set up for one llama.cpp source: its own host work (its build)."""
        r, kwargs = self.recipe, self.host_kwargs(spec)
        if self.host is None or self.host.source_spec != spec:
            self.host = HostWork(**kwargs, events=self.ev)
        placement.open(RunSetup(self.ledger, self.ledger.path, self.host, kwargs, self.ev, r.telemetry, r.name))

    def _run_source(self, placement: Placement, todo: list, run_id: str, rep: RunReport) -> None:
        """One llama.cpp source's cells on every device at once."""
        r = self.recipe
        lanes = [
            (self.lab.device(d), [c for c in todo if c.device == d])
            for d in r.devices
            if any(c.device == d for c in todo)
        ]
        placement.run(lanes, run_id, rep)
