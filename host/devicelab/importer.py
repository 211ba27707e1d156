"""llama-bench's output formats, both ways: results produced outside the lab (`-o json`, `-o jsonl`, `-o csv`,
`-o sql`) imported into the same schema, and the lab's bench rows exported as llama-bench's SQLite table, which
llama.cpp's `scripts/compare-llama-bench.py` reads."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sqlite3
from pathlib import Path

import pandas as pd

from .errors import DevicelabError
from .kinds import bench as benchp
from .ledger import Ledger, ledger_path
from .plan import Cell
from .validation import read_text

NEEDED = ("avg_ts", "n_prompt", "n_gen", "n_threads")
# llama-bench's field types (llama-bench.cpp test::get_field_type), for the text formats
INT_FIELDS = {
    "build_number",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "poll",
    "model_size",
    "model_n_params",
    "n_gpu_layers",
    "main_gpu",
    "n_prompt",
    "n_gen",
    "n_depth",
    "avg_ns",
    "stddev_ns",
    "no_op_offload",
    "n_cpu_moe",
    "fit_target",
    "fit_min_ctx",
    "flash_attn",
}
BOOL_FIELDS = {"f16_kv", "no_kv_offload", "cpu_strict", "embeddings", "no_host", "repack"}
FLOAT_FIELDS = {"avg_ts", "stddev_ts"}
FORMATS = "llama-bench -o json, -o jsonl, -o csv or -o sql output"

# llama.cpp's file-type names (llama-model-loader.cpp llama_ftype_name) -> the quant names llama-quantize takes
FTYPE_QUANT = {
    "all F32": "f32",
    "F16": "f16",
    "BF16": "bf16",
    "Q1_0": "q1_0",
    "Q2_0": "q2_0",
    "Q4_0": "q4_0",
    "Q4_1": "q4_1",
    "Q5_0": "q5_0",
    "Q5_1": "q5_1",
    "Q8_0": "q8_0",
    "MXFP4 MoE": "mxfp4_moe",
    "NVFP4": "nvfp4",
    "Q2_K - Medium": "q2_k",
    "Q2_K - Small": "q2_k_s",
    "Q3_K - Small": "q3_k_s",
    "Q3_K - Medium": "q3_k_m",
    "Q3_K - Large": "q3_k_l",
    "Q4_K - Small": "q4_k_s",
    "Q4_K - Medium": "q4_k_m",
    "Q5_K - Small": "q5_k_s",
    "Q5_K - Medium": "q5_k_m",
    "Q6_K": "q6_k",
    "TQ1_0 - 1.69 bpw ternary": "tq1_0",
    "TQ2_0 - 2.06 bpw ternary": "tq2_0",
    "IQ2_XXS - 2.0625 bpw": "iq2_xxs",
    "IQ2_XS - 2.3125 bpw": "iq2_xs",
    "IQ2_S - 2.5 bpw": "iq2_s",
    "IQ2_M - 2.7 bpw": "iq2_m",
    "IQ3_XS - 3.3 bpw": "iq3_xs",
    "IQ3_XXS - 3.0625 bpw": "iq3_xxs",
    "IQ1_S - 1.5625 bpw": "iq1_s",
    "IQ1_M - 1.75 bpw": "iq1_m",
    "IQ4_NL - 4.5 bpw": "iq4_nl",
    "IQ4_XS - 4.25 bpw": "iq4_xs",
    "IQ3_S - 3.4375 bpw": "iq3_s",
    "IQ3_S mix - 3.66 bpw": "iq3_m",
}


def quant_of(model_type: str) -> str:
    """The quant of llama-bench's `model_type` ('llama 256M Q4_K - Medium' -> 'q4_k_m'), by llama.cpp's own
    file-type names; an unknown one keeps its words, lowercased."""
    t = str(model_type).replace("(guessed) ", "").strip()
    for name in sorted(FTYPE_QUANT, key=len, reverse=True):
        if t.endswith(" " + name) or t == name:
            return FTYPE_QUANT[name]
    parts = t.split(" ", 2)
    return (parts[2] if len(parts) == 3 else t).lower().replace(" - ", "_").replace(" ", "_") or "?"


def _typed(rec: dict) -> dict:
    """A text format's record with llama-bench's own field types."""
    out: dict = {}
    for k, v in rec.items():
        if v is None or v == "":
            out[k] = None if k in INT_FIELDS | FLOAT_FIELDS else v
        elif k in INT_FIELDS:
            out[k] = int(float(v))
        elif k in FLOAT_FIELDS:
            out[k] = float(v)
        elif k in BOOL_FIELDS:
            out[k] = str(v).strip().lower() in ("1", "true")
        else:
            out[k] = v
    return out


def _json(text: str, path: Path) -> list:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DevicelabError(f"{path}: not valid llama-bench JSON ({e.msg} at line {e.lineno})") from e


def _jsonl(text: str, path: Path) -> list:
    recs = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DevicelabError(f"{path}:{i}: not valid llama-bench JSONL ({e.msg})") from e
    return recs


def _csv(text: str, path: Path) -> list:
    try:
        return [_typed(r) for r in csv.DictReader(io.StringIO(text))]
    except (csv.Error, ValueError) as e:
        raise DevicelabError(f"{path}: not valid llama-bench CSV ({e})") from e


def _only_llama_bench(action, arg1, arg2, db, trigger):
    """The SQL of `-o sql` creates one table and inserts into it; nothing else runs (no ATTACH, no PRAGMA)."""
    ok = {
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_INSERT,
        sqlite3.SQLITE_TRANSACTION,
        sqlite3.SQLITE_READ,
        sqlite3.SQLITE_SELECT,
        sqlite3.SQLITE_UPDATE,
    }
    if action in ok and (arg1 in (None, "llama_bench", "sqlite_master") or action == sqlite3.SQLITE_TRANSACTION):
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _sql(text: str, path: Path) -> list:
    db = sqlite3.connect(":memory:")
    try:
        db.set_authorizer(_only_llama_bench)
        db.executescript(text)
        db.set_authorizer(None)
        db.row_factory = sqlite3.Row
        return [_typed(dict(r)) for r in db.execute("SELECT * FROM llama_bench")]
    except sqlite3.Error as e:
        raise DevicelabError(f"{path}: not valid llama-bench SQL ({e})") from e
    finally:
        db.close()


def _records(text: str, path: Path) -> list[dict]:
    """llama-bench's output in any of its machine formats, each record checked."""
    text = text.strip()
    head = text.lstrip("\ufeff")[:200]
    if head.startswith("["):
        recs = _json(text, path)
    elif head.startswith("{"):
        recs = _jsonl(text, path)
    elif head.upper().startswith(("CREATE TABLE", "INSERT INTO")):
        recs = _sql(text, path)
    elif head.startswith(("build_commit,", '"build_commit",')):
        recs = _csv(text, path)
    elif head.startswith("|"):
        raise DevicelabError(
            f"{path}: llama-bench's markdown table has no machine-readable figures; run it again "
            f"with -o json (or -o jsonl, csv, sql)"
        )
    else:
        raise DevicelabError(f"{path}: no llama-bench results (expected {FORMATS})")
    if not isinstance(recs, list) or not recs or not all(isinstance(r, dict) for r in recs):
        raise DevicelabError(f"{path}: no llama-bench results (expected {FORMATS})")
    for i, r in enumerate(recs, 1):
        missing = [k for k in NEEDED if k not in r]
        if missing:
            raise DevicelabError(f"{path}: result {i} has no {', '.join(missing)} (expected {FORMATS})")
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
            quant = quant_of(r0.get("model_type", ""))
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


# ---- the other way: the lab's bench rows as llama-bench's SQLite table ----
# llama-bench's own defaults for what devicelab does not set (read off `llama-bench -o csv` of the pinned tree), so
# that compare-llama-bench.py, which pairs rows on equality of all its key properties, pairs them
LLAMA_BENCH_DEFAULTS = {
    "build_number": 0,
    "gpu_info": "",
    "n_batch": 2048,
    "n_ubatch": 512,
    "cpu_mask": "0x0",
    "cpu_strict": 0,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": 0,
    "flash_attn": -1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": 0,
    "no_op_offload": 0,
    "no_host": 0,
    "repack": 1,
    "fit_target": 0,
    "fit_min_ctx": 0,
}
SPEED_METRICS = ("prefill_tps", "decode_tps", "pg_tps")
QUANT_FTYPE = {q: name for name, q in FTYPE_QUANT.items()}


def _export_record(r, params: dict) -> dict:
    tokens = int(r["n_prompt"] or 0) + int(r["n_gen"] or 0)
    avg_ts = float(r["value"])
    sd_ts = float(r["stddev"]) if pd.notna(r["stddev"]) else 0.0
    avg_ns = tokens / avg_ts * 1e9 if avg_ts else 0.0
    facts = json.loads(r["device_facts"]) if isinstance(r.get("device_facts"), str) else {}
    fa = {"on": 1, "off": 0}.get(str(r.get("flash_attn")), -1)
    ngl = r.get("n_gpu_layers")
    rec = dict(LLAMA_BENCH_DEFAULTS)
    rec.update(
        {
            "build_commit": str(r["build_commit"] or "")[:7],
            "cpu_info": f"{r['device']} ({facts.get('cpu.model', '?')})",
            "gpu_info": r.get("gpu_device") or "",
            "backends": str(r.get("backend") or "").upper(),
            "model_filename": f"{r['model']}-{r['quant']}.gguf",
            "model_type": f"{r['model']} {QUANT_FTYPE.get(str(r['quant']), str(r['quant']).upper())}",
            "model_size": int(r["model_bytes"]) if pd.notna(r.get("model_bytes")) else 0,
            "model_n_params": int(r["n_params"]) if pd.notna(r.get("n_params")) else 0,
            "n_threads": int(r["threads"]),
            "n_prompt": int(r["n_prompt"] or 0),
            "n_gen": int(r["n_gen"] or 0),
            "n_depth": int(r["n_depth"] or 0),
            "test_time": r.get("recorded_at") or "",
            "avg_ns": int(avg_ns),
            "stddev_ns": int(avg_ns * sd_ts / avg_ts) if avg_ts else 0,
            "avg_ts": avg_ts,
            "stddev_ts": sd_ts,
            "flash_attn": fa,
            "n_gpu_layers": int(ngl) if pd.notna(ngl) else -1,
        }
    )
    if r.get("cpu_mask"):
        rec["cpu_mask"] = str(r["cpu_mask"])
    for k, p in (("type_k", "cache_type_k"), ("type_v", "cache_type_v")):
        if params.get(p):
            rec[k] = params[p]
    return rec


def export_llama_bench(rows, ledger: Ledger | None, out: Path) -> int:
    """The bench rows' speeds as llama-bench's `llama_bench` table in a new SQLite file (what `llama-bench -o sql |
    sqlite3` makes), one record per (cell, test): llama.cpp's scripts/compare-llama-bench.py reads it."""
    from .kinds.bench import Bench

    sel = rows[(rows["payload"] == Bench.name) & rows["metric"].isin(SPEED_METRICS)]
    sel = sel[sel["value"].notna()]
    if sel.empty:
        raise DevicelabError("no bench speeds to export; run a recipe with a bench payload first")
    params = {}
    for cid in sel["cell_id"].unique():
        c = ledger.cell(cid) if ledger is not None else None
        params[cid] = json.loads(c["params"]) if c and c.get("params") else {}
    recs = [_export_record(r, params[r["cell_id"]]) for r in sel.to_dict("records")]
    out = Path(out)
    if out.exists():
        raise DevicelabError(f"{out} exists; give a new file name")
    fields = list(recs[0])
    db = sqlite3.connect(out)
    try:
        db.execute(f"CREATE TABLE llama_bench ({', '.join(fields)})")
        db.executemany(
            f"INSERT INTO llama_bench ({', '.join(fields)}) VALUES ({', '.join('?' for _ in fields)})",
            [tuple(r[f] for f in fields) for r in recs],
        )
        db.commit()
    finally:
        db.close()
    return len(recs)
