"""Import llama-bench JSON (array) or JSONL output produced outside the lab into the same schema."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import DevicelabError
from .kinds import bench as benchp
from .ledger import Ledger, ledger_path
from .plan import Cell
from .validation import read_text

NEEDED = ("avg_ts", "n_prompt", "n_gen", "n_threads")


def _records(text: str, path: Path) -> list[dict]:
    text = text.strip()
    if text.startswith("["):
        try:
            recs = json.loads(text)
        except json.JSONDecodeError as e:
            raise DevicelabError(f"{path}: not valid llama-bench JSON ({e.msg} at line {e.lineno})") from e
    else:
        recs = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DevicelabError(f"{path}:{i}: not valid llama-bench JSONL ({e.msg})") from e
    if not isinstance(recs, list) or not recs or not all(isinstance(r, dict) for r in recs):
        raise DevicelabError(f"{path}: no llama-bench results (expected -o json or -o jsonl output)")
    for i, r in enumerate(recs, 1):
        missing = [k for k in NEEDED if k not in r]
        if missing:
            raise DevicelabError(
                f"{path}: result {i} has no {', '.join(missing)} (expected llama-bench -o json or -o jsonl output)"
            )
        for k in ("model_size", "model_n_params"):
            if r.get(k) is not None and (not isinstance(r[k], (int, float)) or isinstance(r[k], bool) or r[k] < 0):
                raise DevicelabError(f"{path}: result {i}: {k} is {r[k]!r}, not a size")
    return recs


def import_files(files, device: str, recipe: str, lab_dir: Path) -> int:
    """Every file is read and checked before anything is written: a bad file imports nothing."""
    todo = []
    for f in files:
        f = Path(f)
        recs = _records(read_text(f, "llama-bench output"), f)
        by_model: dict[str, list] = {}
        for r in recs:
            by_model.setdefault(str(r.get("model_filename", "?")), []).append(r)
        for mfile, rs in by_model.items():
            digest = hashlib.sha256((device + recipe + json.dumps(rs, sort_keys=True)).encode()).hexdigest()[:16]
            r0 = rs[0]
            model = Path(mfile).stem
            quant = (str(r0.get("model_type", "")).split() or ["?"])[-1].lower()
            cell = Cell(recipe, device, model, quant, benchp.Bench.name, {"imported_from": str(f)}, digest)
            try:
                rows = benchp.rows([benchp.BenchTest(r, None) for r in rs])
            except DevicelabError as e:
                raise DevicelabError(f"{f}: {e}") from None
            ctx = {
                "cell_id": digest,
                "recipe": recipe,
                "device": device,
                "model": model,
                "quant": quant,
                "payload": benchp.Bench.name,
                "run_id": "import",
                "model_bytes": r0.get("model_size"),
                "n_params": r0.get("model_n_params"),
                "bpw": (r0["model_size"] * 8 / r0["model_n_params"]) if r0.get("model_n_params") else None,
                "build_commit": r0.get("build_commit"),
                "device_facts": {"cpu_info": r0.get("cpu_info"), "gpu_info": r0.get("gpu_info")},
                "base_note": f"imported from {f.name}",
            }
            for row in rows:
                row.context = ctx
            todo.append((cell, rows))
    led = Ledger(ledger_path(lab_dir))
    for cell, rows in todo:
        led.register([cell])
        led.finish_cell(cell.cell_id, rows)
    return sum(len(rows) for _, rows in todo)
