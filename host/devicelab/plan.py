"""Expansion of a recipe into cells: device × model × quant × payload (× bench thread count).

A cell's id is a hash of everything that makes its result what it is (recipe, device, model file,
quant, payload parameters, llama.cpp commit), so re-running an unchanged recipe finds every finished
cell by id, and changing any of those makes new cells rather than overwriting old results."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import itertools

from .recipes import BatchedSpec, BenchSpec, EvalSpec, KLDSpec, MembwSpec, Recipe


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
        extra = ""
        if self.payload == "bench":
            p = self.params
            extra = f" t={p['threads']}" + (f" mask={p['cpu_mask']}" if p.get("cpu_mask") else "") + \
                (f" quota={p['quota']}" if p.get("quota") else "") + (f" load={p['contention']}" if p.get("contention") else "")
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
                        variants = [{"threads": t, "cpu_mask": m, "quota": qq, "contention": c}
                                    for t, m, qq, c in itertools.product(p.threads, p.cpu_masks, p.quota, p.contention)]
                        base = p.model_dump(exclude={"threads", "kind", "cpu_masks", "quota", "contention"})
                    elif isinstance(p, MembwSpec):
                        continue                # a device property: once per device, below
                    elif isinstance(p, EvalSpec):
                        variants = [{}]
                        base = p.cell_params()
                    elif isinstance(p, (KLDSpec, BatchedSpec)):
                        variants = [{}]
                        base = p.model_dump(exclude={"kind"})
                    else:  # pragma: no cover - the recipe schema admits only these
                        raise TypeError(p)
                    for v in variants:
                        params = {**base, **v}
                        if isinstance(p, BenchSpec) and v["cpu_mask"] is None and v["quota"] is None \
                                and v["contention"] == 0:
                            params = {k: x for k, x in params.items() if k not in ("cpu_mask", "quota", "contention")}
                        ident = {"recipe": recipe.name, "device": dev, "model": m.name,
                                 "model_sha256": model_sha[m.name], "quant": q, "payload": p.kind,
                                 "params": params, "source_commit": source_commit}
                        cells.append(Cell(recipe.name, dev, m.name, q, p.kind, params, cell_id(ident)))
        for p in recipe.payloads:
            if isinstance(p, MembwSpec):
                params = p.model_dump(exclude={"kind"})
                ident = {"recipe": recipe.name, "device": dev, "payload": "membw", "params": params}
                cells.append(Cell(recipe.name, dev, "-", "-", "membw", params, cell_id(ident)))
    return cells
