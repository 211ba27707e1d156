"""Expansion of a recipe into cells: device × model × quant × payload variant (a kind says its variants).

A cell's id is a hash of everything that makes its result what it is (recipe, device, model file,
quant, payload parameters, llama.cpp commit, and its round where the recipe has `rounds:`), so re-running an
unchanged recipe finds every finished cell by id, and changing any of those makes new cells rather than
overwriting old results.

`schedule` says the order they run in: without rounds, source after source, each device's cells in recipe order;
with rounds, round after round, and within a round the sources and each device's cells in an order drawn from the
recipe's seed (the same order every time the recipe runs, so a resumed run goes on inside its round)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Collection
from dataclasses import asdict, dataclass, field

from . import kinds
from .recipes import AUTO_MIN_ROUNDS, Recipe


@dataclass(frozen=True)
class Cell:
    recipe: str
    device: str
    model: str
    quant: str
    payload: str  # a registered kind's name
    params: dict = field(hash=False)
    cell_id: str = ""
    # where the schedule put it: its place in its device's round and the seed of that order (not its identity)
    position: int | None = field(default=None, compare=False)
    seed: int | None = field(default=None, compare=False)

    @property
    def round(self) -> int | None:
        return self.params.get(ROUND)

    def label(self) -> str:
        extra = kinds.get(self.payload).label(self.params) if self.payload in kinds.REGISTRY else ""
        b = f" [{self.params['backend']}]" if self.params.get("backend") else ""
        r = f" round {self.round}" if self.round is not None else ""
        return f"{self.device} {self.model} {self.quant} {self.payload}{b}" + (f" {extra}" if extra else "") + r

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Cell":
        return cls(**d)


ROUND = "round"  # a cell's round, in its params (its identity) as a backend is: kinds' typed params ignore it


def cell_id(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def expand(recipe: Recipe, source_commit: str, model_sha: dict[str, str]) -> list[Cell]:
    cells = []
    backends: list[str | None] = [*(recipe.backends or [])] or [None]  # each, or the device's default build once
    for dev in recipe.devices:
        for m in recipe.models:
            for q in recipe.quants:
                for p, b in [(p, b) for p in recipe.payloads for b in backends]:
                    kind = kinds.get(p.kind)
                    if not kind.per_model:
                        continue
                    for params in kind.variants(p):
                        if b is not None:  # a recipe without backends keeps the ids it always had
                            if kind.where(params) == "host" and b != backends[0]:
                                continue  # runs on this host's llama.cpp: once
                            params = {**params, "backend": b}
                        ident = {
                            "recipe": recipe.name,
                            "device": dev,
                            "model": m.name,
                            "model_sha256": model_sha[m.name],
                            "quant": q,
                            "payload": p.kind,
                            "params": params,
                            "source_commit": source_commit,
                        }
                        if m.imatrix is not None:  # its quants are other files
                            ident["imatrix"] = m.imatrix.model_dump()
                        for rp in _rounds(recipe, params):
                            cells.append(
                                Cell(recipe.name, dev, m.name, q, p.kind, rp, cell_id({**ident, "params": rp}))
                            )
        for p in recipe.payloads:
            kind = kinds.get(p.kind)
            if kind.per_model:
                continue
            for params in kind.variants(p):  # a device property: once per device
                for rp in _rounds(recipe, params):
                    ident = {"recipe": recipe.name, "device": dev, "payload": p.kind, "params": rp}
                    cells.append(Cell(recipe.name, dev, "-", "-", p.kind, rp, cell_id(ident)))
    return cells


def _rounds(recipe: Recipe, params: dict) -> list[dict]:
    """A cell's params once per round (a recipe without rounds: as they are, so its cells keep their ids)."""
    if recipe.rounds is None:
        return [params]
    n = AUTO_MIN_ROUNDS if recipe.rounds == "auto" else recipe.rounds  # auto: its first rounds (more may follow)
    return [{**params, ROUND: k} for k in range(1, n + 1)]


def seed(recipe: Recipe) -> int:
    """The seed of a recipe's round orders: its own `round_seed`, else drawn from its name (stable across runs)."""
    if recipe.round_seed is not None:
        return recipe.round_seed
    return int(hashlib.sha256(recipe.name.encode()).hexdigest()[:8], 16)


def schedule(
    recipe: Recipe, by_source: list[tuple[str, list[Cell]]], done: Collection[str] = ()
) -> list[tuple[str, list[Cell]]]:
    """The steps a run takes, each one source's cells (less those in `done`) on every device at once: without
    rounds, one step per source with its cells in recipe order; with rounds, round after round, the sources of a
    round in a random order and each device's cells of a (round, source) in a random order, their places recorded
    on the cells (`position`, counted over the device's whole round, and `seed`). The orders come from the recipe's
    seed, the round and the recipe's cells, never from what is done: a resumed run goes on inside its round in the
    order it began."""
    if recipe.rounds is None:
        return [(spec, todo) for spec, cells in by_source if (todo := [c for c in cells if c.cell_id not in done])]
    s = seed(recipe)
    everything = [c for _, cells in by_source for c in cells]
    steps: list[tuple[str, list[Cell]]] = []
    for r in sorted({c.round for c in everything if c.round is not None}):
        rng = random.Random(f"{s}:{r}")
        specs = [spec for spec, _ in by_source]
        rng.shuffle(specs)
        place: dict[str, int] = {}  # device -> cells of this round placed so far
        for spec in specs:
            mine = [c for sp, cells in by_source if sp == spec for c in cells if c.round == r]
            rng.shuffle(mine)  # every device's at once: each device's own order is a random one
            todo = []
            for c in sorted(mine, key=lambda c: c.device):  # stable: each device's cells in their shuffled order
                place[c.device] = place.get(c.device, 0) + 1
                if c.cell_id not in done:
                    todo.append(dataclasses.replace(c, position=place[c.device], seed=s))
            if todo:
                steps.append((spec, todo))
    return steps
