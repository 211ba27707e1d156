"""Expansion of a recipe into cells: device × model × quant × payload variant (a kind says its variants).

A cell's id is a hash of everything that makes its result what it is (recipe, device, model file,
quant, payload parameters, llama.cpp commit), so re-running an unchanged recipe finds every finished
cell by id, and changing any of those makes new cells rather than overwriting old results."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from . import kinds
from .recipes import Recipe


@dataclass(frozen=True)
class Cell:
    recipe: str
    device: str
    model: str
    quant: str
    payload: str  # a registered kind's name
    params: dict = field(hash=False)
    cell_id: str = ""

    def label(self) -> str:
        extra = kinds.get(self.payload).label(self.params) if self.payload in kinds.REGISTRY else ""
        b = f" [{self.params['backend']}]" if self.params.get("backend") else ""
        return f"{self.device} {self.model} {self.quant} {self.payload}{b}" + (f" {extra}" if extra else "")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Cell":
        return cls(**d)


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
                        cells.append(Cell(recipe.name, dev, m.name, q, p.kind, params, cell_id(ident)))
        for p in recipe.payloads:
            kind = kinds.get(p.kind)
            if kind.per_model:
                continue
            for params in kind.variants(p):  # a device property: once per device
                ident = {"recipe": recipe.name, "device": dev, "payload": p.kind, "params": params}
                cells.append(Cell(recipe.name, dev, "-", "-", p.kind, params, cell_id(ident)))
    return cells
