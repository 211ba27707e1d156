"""Import llama-bench JSON (array) or JSONL output produced outside the lab into the same schema."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import DevicelabError
from .ledger import Ledger
from .payloads import bench as benchp
from .plan import Cell


def _records(text: str, path: Path) -> list[dict]:
    text = text.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise DevicelabError(f"{path}: not valid llama-bench JSON ({e.msg} at line {e.lineno})") from e
    recs = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DevicelabError(f"{path}:{i}: not valid llama-bench JSONL ({e.msg})") from e
    return recs


def import_files(files, device: str, recipe: str, lab_dir: Path) -> int:
    led = Ledger(Path(lab_dir) / "ledger.sqlite")
    n = 0
    for f in files:
        f = Path(f)
        recs = _records(f.read_text(errors="replace"), f)
        if not recs or "avg_ts" not in recs[0]:
            raise DevicelabError(f"{f}: no llama-bench results (expected -o json or -o jsonl output)")
        by_model: dict[str, list] = {}
        for r in recs:
            by_model.setdefault(r.get("model_filename", "?"), []).append(r)
        for mfile, rs in by_model.items():
            digest = hashlib.sha256((device + recipe + json.dumps(rs, sort_keys=True)).encode()).hexdigest()[:16]
            r0 = rs[0]
            model = Path(mfile).stem
            quant = (r0.get("model_type", "").split()[-1] or "?").lower()
            cell = Cell(recipe, device, model, quant, "bench", {"imported_from": str(f)}, digest)
            led.register([cell])
            rows = benchp.rows([benchp.BenchTest(r, None) for r in rs])
            ctx = {"cell_id": digest, "recipe": recipe, "device": device, "model": model, "quant": quant,
                   "payload": "bench", "run_id": "import", "model_bytes": r0.get("model_size"),
                   "n_params": r0.get("model_n_params"),
                   "bpw": (r0["model_size"] * 8 / r0["model_n_params"]) if r0.get("model_n_params") else None,
                   "build_commit": r0.get("build_commit"), "device_facts": {"cpu_info": r0.get("cpu_info"),
                                                                            "gpu_info": r0.get("gpu_info")},
                   "base_note": f"imported from {f.name}"}
            for row in rows:
                row.context = ctx
            led.finish_cell(digest, rows)
            n += len(rows)
    return n
