"""Expansion of a recipe into cells: device × model × quant × payload (× bench thread count).

A cell's id is a hash of everything that makes its result what it is (recipe, device, model file,
quant, payload parameters, llama.cpp commit), so re-running an unchanged recipe finds every finished
cell by id, and changing any of those makes new cells rather than overwriting old results."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from .recipes import BenchSpec, KLDSpec, Recipe


@dataclass(frozen=True)
class Cell:
    recipe: str
    device: str
    model: str
    quant: str
    payload: str            # bench | kld
    params: dict = field(hash=False)
    cell_id: str = ""

    def label(self) -> str:
        extra = f" t={self.params['threads']}" if self.payload == "bench" else ""
        return f"{self.device} {self.model} {self.quant} {self.payload}{extra}"


def cell_id(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def expand(recipe: Recipe, source_commit: str, model_sha: dict[str, str]) -> list[Cell]:
    cells = []
    for dev in recipe.devices:
        for m in recipe.models:
            for q in recipe.quants:
                for p in recipe.payloads:
                    if isinstance(p, BenchSpec):
                        variants = [{"threads": t} for t in p.threads]
                        base = p.model_dump(exclude={"threads", "kind"})
                    elif isinstance(p, KLDSpec):
                        variants = [{}]
                        base = p.model_dump(exclude={"kind"})
                    else:  # pragma: no cover - the recipe schema admits only these
                        raise TypeError(p)
                    for v in variants:
                        params = {**base, **v}
                        ident = {"recipe": recipe.name, "device": dev, "model": m.name,
                                 "model_sha256": model_sha[m.name], "quant": q, "payload": p.kind,
                                 "params": params, "source_commit": source_commit}
                        cells.append(Cell(recipe.name, dev, m.name, q, p.kind, params, cell_id(ident)))
    return cells
