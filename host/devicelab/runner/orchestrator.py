"""plan → one lane per device, all running at once; one device's failure is that device's alone.

A lane's inputs are plain data (the device's settings, its cells, the content hashes of its models) and
its outputs go to the one ledger (rows, artifacts, statuses), so a lane can be placed on another machine:
where the lanes run is a strategy the caller gives (`placement.LocalPlacement`, or the cluster's). The
orchestrator itself holds no per-device state: each lane opens its own DeviceSession."""

from __future__ import annotations

import time
from pathlib import Path

from .. import lab as labmod
from .. import precision, recipes
from ..build import source as sourcemod
from ..errors import DevicelabError
from ..ledger import DONE, SKIPPED, Ledger, ledger_path
from ..plan import expand, schedule
from ..recipes import AUTO_MIN_ROUNDS
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
        self._hosts: dict[str, HostWork] = {}  # source spec -> its host work
        self._cell_ids: set[str] = set()  # the recipe's cells as planned (every round so far)
        self._opened: str | None = None  # the source the placement is set up for

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
        if self.recipe.rounds is not None and not placement.sweeps_sources:
            raise DevicelabError(
                f"this placement runs the lab's lanes once; the recipe measures in {self.recipe.rounds} rounds: run "
                "it on one host (without --cluster), or without rounds:"
            )
        t0 = time.time()
        r = self.recipe
        self._opened = None  # this placement is set up by this run
        host = self.host = HostWork(**self.host_kwargs(specs[0]), events=self.ev)
        self._hosts[specs[0]] = host
        shas = {m.name: host.model_sha(m.name) for m in r.models}
        commits = [host.src.commit] + [sourcemod.commit_of(s) for s in specs[1:]]
        auto = r.rounds == "auto"
        rounds: int | None = AUTO_MIN_ROUNDS if r.rounds == "auto" else r.rounds
        steps, total, done = self._plan(r, rounds, specs, commits, shas)
        todo = [c for _, cs in steps for c in cs]
        if steps:  # connects and checks before the run starts
            self._open(placement, steps[0][0])
        run_id = self.ledger.start_run(r.name, self.recipe_sha, total)
        rep = RunReport(run_id, total, len(done))
        try:
            self.ev.cells(len(todo))
            if rounds is not None:  # every build made before round 1: none is made between two measured cells
                for spec in dict.fromkeys(spec for spec, _ in steps):
                    self._open(placement, spec)
                    self._run_source(placement, [c for sp, cs in steps if sp == spec for c in cs], run_id, rep, True)
            while True:
                for spec, cells in steps:
                    self._open(placement, spec)
                    self._run_source(placement, cells, run_id, rep)
                if not auto or rounds is None or not self._more_rounds(rep, rounds, t0):
                    break
                rounds += 1  # one more round: its cells registered and scheduled as the first ones were
                steps, rep.total, done = self._plan(r, rounds, specs, commits, shas)
                rep.skipped = len(done) - rep.ran  # done before this run (a resumed one: rounds already measured)
                self.ev.cells(sum(len(cs) for _, cs in steps))
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

    def _plan(self, r: recipes.Recipe, rounds: int | None, specs: list[str], commits: list[str], shas: dict):
        """The recipe's cells (in `rounds` rounds) registered, and the steps that run those not done yet."""
        rr = r if rounds == r.rounds else r.model_copy(update={"rounds": rounds})
        by_source: list[tuple[str, list]] = []
        for spec, commit in zip(specs, commits, strict=True):
            cells = expand(rr, commit, shas)
            self.ledger.register(cells)
            by_source.append((spec, cells))
        total = sum(len(cs) for _, cs in by_source)
        self._cell_ids = {c.cell_id for _, cs in by_source for c in cs}
        done = {c for c in self._cell_ids if self.ledger.status(c) in (DONE, SKIPPED)}
        return schedule(rr, by_source, done), total, done  # source after source, or round after round

    def _more_rounds(self, rep: RunReport, rounds: int, t0: float) -> bool:
        """`rounds: auto`: whether the lab takes one more round; when it stops, `rep` says how precise it got."""
        r = self.recipe
        assert r.precision is not None and r.max_rounds is not None
        rows = self.ledger.rows_frame(recipe=r.name)
        rows = rows[rows["cell_id"].isin(self._cell_ids)]  # this recipe's cells as they are now, every round so far
        found = precision.intervals(rows)
        wide = precision.unmet(found, r.precision)
        rep.rounds, rep.intervals, rep.unmet = rounds, found, wide
        if not wide or rep.failed:
            return False
        if rounds >= r.max_rounds:
            rep.stopped = f"max_rounds: {r.max_rounds}"
            return False
        minutes = (time.time() - t0) / 60
        per_round = minutes / max(1, rep.ran) * rep.total / rounds  # a cell's minutes so far × a round's cells
        if r.max_minutes is not None and minutes + per_round > r.max_minutes:
            rep.stopped = f"max_minutes: {r.max_minutes:g}"
            return False
        self.ev.stage(f"round {rounds}: {len(wide)} of {len(found)} compared ratios wider than ±{r.precision:g}")
        return True

    def _open(self, placement: Placement, spec: str) -> None:
        """The placement set up for one llama.cpp source: its own host work (its build); nothing to do where it is
        set up for that source already."""
        if self._opened == spec:
            return
        self._opened = spec
        r, kwargs = self.recipe, self.host_kwargs(spec)
        if self.host is None or self.host.source_spec != spec:  # each source's host work once (rounds come back)
            self.host = self._hosts.get(spec) or HostWork(**kwargs, events=self.ev)
        self._hosts[spec] = self.host
        placement.open(RunSetup(self.ledger, self.ledger.path, self.host, kwargs, self.ev, r.telemetry, r.name))

    def _run_source(self, placement: Placement, todo: list, run_id: str, rep: RunReport, prepare=False) -> None:
        """One llama.cpp source's cells on every device at once (`prepare`: only what they run with, made ready)."""
        r = self.recipe
        lanes = [
            (self.lab.device(d), [c for c in todo if c.device == d])
            for d in r.devices
            if any(c.device == d for c in todo)
        ]
        placement.run(lanes, run_id, rep, prepare)
