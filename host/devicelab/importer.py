"""llama-bench's output formats, both ways: results produced outside the lab (`-o json`, `-o jsonl`, `-o csv`,
`-o sql`, and the default markdown table people paste in issues) imported into the same schema, and the lab's bench
rows exported as llama-bench's SQLite table, which llama.cpp's `scripts/compare-llama-bench.py` reads.

Builds differ: 2023 builds name the backend by flags (`cuda`, `metal`, … true) where later ones write `backends`;
`-o sql` writes table `test` until llama.cpp #15003 (August 2025), `llama_bench` after; the markdown table rounds the
model's size (GiB/MiB) and parameters (M/B) to two decimals, so those two are left empty, never taken as exact."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .build import backends
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
# 2023-2024 builds (before the `backends` field) wrote one boolean field per ggml backend built in, named as the lab
# names its backends, plus a few the lab does not build, and the BLAS flags
BACKEND_FLAGS = (*(b for b in backends.BACKENDS if b != backends.CPU), "kompute", "sycl", "rpc")
BOOL_FIELDS = {
    "f16_kv",
    "no_kv_offload",
    "cpu_strict",
    "embeddings",
    "no_host",
    "repack",
    "use_mmap",
    "mul_mat_q",
    "gpu_blas",
    "blas",
    *BACKEND_FLAGS,
}
FLOAT_FIELDS = {"avg_ts", "stddev_ts"}
FORMATS = "llama-bench -o json, -o jsonl, -o csv, -o sql output or its markdown table"

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


# `-o sql`'s table: "test" until llama.cpp #15003 (August 2025) renamed it "llama_bench"
SQL_TABLES = ("llama_bench", "test")
_SQL_OK = {
    sqlite3.SQLITE_CREATE_TABLE,
    sqlite3.SQLITE_INSERT,
    sqlite3.SQLITE_TRANSACTION,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_UPDATE,
}
_SQL_ACTIONS = {
    sqlite3.SQLITE_ATTACH: "attaches a database",
    sqlite3.SQLITE_DETACH: "detaches a database",
    sqlite3.SQLITE_PRAGMA: "runs a PRAGMA",
    sqlite3.SQLITE_DELETE: "deletes rows",
    sqlite3.SQLITE_DROP_TABLE: "drops a table",
    sqlite3.SQLITE_CREATE_TABLE: "creates a table",
    sqlite3.SQLITE_INSERT: "inserts into a table",
    sqlite3.SQLITE_UPDATE: "updates a table",
    sqlite3.SQLITE_READ: "reads a table",
    sqlite3.SQLITE_FUNCTION: "calls a function",
    sqlite3.SQLITE_CREATE_VIEW: "creates a view",
    sqlite3.SQLITE_CREATE_TRIGGER: "creates a trigger",
    sqlite3.SQLITE_CREATE_INDEX: "creates an index",
}


def _sql(text: str, path: Path) -> list:
    """The SQL of `-o sql` creates one table (llama_bench, or test before August 2025) and inserts into it; nothing
    else runs (no ATTACH, no PRAGMA, no other table). A refusal says what the SQL tried, in one line."""
    denied: list[str] = []

    def only_llama_bench(action, arg1, arg2, db, trigger):
        if action == sqlite3.SQLITE_TRANSACTION or (action in _SQL_OK and arg1 in (None, *SQL_TABLES, "sqlite_master")):
            return sqlite3.SQLITE_OK
        what = _SQL_ACTIONS.get(action, f"runs SQLite operation {action}")
        obj = next((a for a in (arg1, arg2) if a), None)
        denied.append(what + (f" ({obj!r})" if obj else ""))
        return sqlite3.SQLITE_DENY

    db = sqlite3.connect(":memory:")
    try:
        db.set_authorizer(only_llama_bench)
        db.executescript(text)
        db.set_authorizer(None)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        table = next((t for t in SQL_TABLES if t in tables), None)
        if table is None:
            raise DevicelabError(
                f"{path}: not valid llama-bench SQL: it creates no table llama_bench (nor test, the name before "
                f"llama.cpp #15003, August 2025){'; it creates ' + ', '.join(sorted(tables)) if tables else ''}"
            )
        db.row_factory = sqlite3.Row
        return [_typed(dict(r)) for r in db.execute(f"SELECT * FROM {table}")]  # one of two names
    except sqlite3.Error as e:
        why = (
            f"it {denied[0]}; llama-bench's -o sql only creates its table (llama_bench, or test before "
            "August 2025) and inserts into it"
            if denied
            else " ".join(str(e).split())
        )
        raise DevicelabError(f"{path}: not valid llama-bench SQL: {why}") from e
    finally:
        db.close()


# ---- the markdown table (llama-bench's default output, what people paste in issues) ----
# the columns' display names (llama-bench.cpp markdown_printer::get_field_display_name) -> the record's fields
MD_FIELDS = {
    "model": "model_type",
    "backend": "backends",
    "ngl": "n_gpu_layers",
    "threads": "n_threads",
    "sm": "split_mode",
    "mg": "main_gpu",
    "nkvo": "no_kv_offload",
    "fa": "flash_attn",
    "dev": "devices",
    "ts": "tensor_split",
    "ot": "tensor_buft_overrides",
    "lm": "load_mode",
    "embd": "embeddings",
    "nopo": "no_op_offload",
    "noh": "no_host",
    "rpk": "repack",
    "fitt": "fit_target",
    "fitc": "fit_min_ctx",
    "mmap": "use_mmap",
    "mmq": "mul_mat_q",
}
_MD_ROW = re.compile(r"^\s*\|.*\|\s*$")
_MD_RULE = re.compile(r"^\s*\|(\s*:?-{2,}:?\s*\|)+\s*$")
_MD_BUILD = re.compile(r"\bbuild:?\s*([0-9a-f]{6,40})\s*\((\d+)\)")
_MD_TEST = re.compile(r"^(?:pp\s*(\d+))?\s*\+?\s*(?:tg\s*(\d+))?(?:\s*@\s*d\s*(\d+))?$")
_MD_TS = re.compile(r"^([-+]?\d+(?:\.\d+)?)\s*(?:±|\+/-|\+-|[^\s\d.+\-]{1,3})\s*(\d+(?:\.\d+)?)$")
_MD_SIZE = re.compile(r"^\d+(?:\.\d+)?\s*(?:[KMGT]iB|[KMGTB])$")


def _md_cells(line: str) -> list[str]:
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    while cells and cells[-1] == "":  # a row pasted with a doubled closing bar
        cells.pop()
    return cells


def _md_record(head: list[str], cells: list[str], build, where: str) -> dict:
    if len(cells) != len(head):
        raise DevicelabError(f"{where}: {len(cells)} cells under {len(head)} columns ({' | '.join(cells)})")
    rec: dict = {"build_commit": build[0] if build else None, "build_number": int(build[1]) if build else None}
    rec.update({"model_size": None, "model_n_params": None, "n_threads": None, "gpu_info": None})
    for name, v in zip(head, cells, strict=True):
        if name == "test":
            m = _MD_TEST.match(v)
            if not v or not m or not (m[1] or m[2]):
                raise DevicelabError(f"{where}: test {v!r} is not llama-bench's ppN, tgN, ppN+tgN (@ dN)")
            rec.update(n_prompt=int(m[1] or 0), n_gen=int(m[2] or 0), n_depth=int(m[3] or 0))
        elif name == "t/s":
            m = _MD_TS.match(v)
            if not m:
                raise DevicelabError(f"{where}: t/s {v!r} is not 'mean ± sd'")
            rec.update(avg_ts=float(m[1]), stddev_ts=float(m[2]))
        elif name in ("size", "params"):
            if not _MD_SIZE.match(v):
                raise DevicelabError(f"{where}: {name} {v!r} is not a size")
            rec["md_" + name] = v  # rounded to two decimals: kept as shown, never as a byte or parameter count
        else:
            rec[MD_FIELDS.get(name, name)] = v
    return _typed(rec)


def _markdown(text: str, path: Path) -> list:
    """Every llama-bench table in the text (other lines — the command, the device list, prose — are passed over),
    each with the `build: COMMIT (NUMBER)` footer that follows it (or, pasted above it, the nearest before)."""
    lines = text.splitlines()
    builds = [(i, m.group(1), m.group(2)) for i, line in enumerate(lines) for m in _MD_BUILD.finditer(line)]
    recs: list[dict] = []
    i = 0
    while i < len(lines):
        cells = _md_cells(lines[i]) if _MD_ROW.match(lines[i]) else []
        if not ("t/s" in cells and "test" in cells and i + 1 < len(lines) and _MD_RULE.match(lines[i + 1])):
            i += 1
            continue
        head, start = cells, i
        i += 2
        body = []
        while i < len(lines) and _MD_ROW.match(lines[i]) and not _MD_RULE.match(lines[i]):
            body.append((i, _md_cells(lines[i])))
            i += 1
        if body and body[-1][1] == head:  # the next table's header right below
            body.pop()
            i -= 1
        nxt = next((j for j in range(i, len(lines)) if "t/s" in lines[j] and _MD_ROW.match(lines[j])), len(lines))
        after = [(b, n) for j, b, n in builds if i <= j < nxt]
        before = [(b, n) for j, b, n in builds if j < start]
        build = after[0] if after else (before[-1] if before else None)
        recs += [_md_record(head, c, build, f"{path}:{n + 1}") for n, c in body]
    if not recs:
        raise DevicelabError(f"{path}: no llama-bench results (expected {FORMATS})")
    return recs


_MD_HEADER = re.compile(r"^\s*\|.*\btest\b.*\bt/s\b.*\|\s*$", re.M)


def _backends(rec: dict) -> dict:
    """`backends` as later builds write it, for a 2023-2024 record that names its backend by flags."""
    if rec.get("backends") is not None or not any(k in rec for k in (*BACKEND_FLAGS, "blas")):
        return rec
    on = [k for k in BACKEND_FLAGS if str(rec.get(k)).lower() in ("1", "true")]
    if not on:
        on = ["BLAS"] if str(rec.get("blas")).lower() in ("1", "true") else ["CPU"]
    return {**rec, "backends": ",".join(b.upper() for b in on)}


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
    elif _MD_HEADER.search(text):
        recs = _markdown(text, path)
    else:
        raise DevicelabError(f"{path}: no llama-bench results (expected {FORMATS})")
    if not isinstance(recs, list) or not recs or not all(isinstance(r, dict) for r in recs):
        raise DevicelabError(f"{path}: no llama-bench results (expected {FORMATS})")
    recs = [_backends(r) if isinstance(r, dict) else r for r in recs]
    for i, r in enumerate(recs, 1):
        missing = [k for k in NEEDED if k not in r]
        if missing:
            raise DevicelabError(f"{path}: result {i} has no {', '.join(missing)} (expected {FORMATS})")
        for k in ("model_size", "model_n_params"):
            if r.get(k) is not None and (not isinstance(r[k], (int, float)) or isinstance(r[k], bool) or r[k] < 0):
                raise DevicelabError(f"{path}: result {i}: {k} is {r[k]!r}, not a size")
    return recs


@dataclass
class ImportedCell:
    """One model's results of one llama-bench output, as the lab's cell and rows; `records[i]` gave `rows[2i]` (its
    speed) and `rows[2i + 1]` (its test_seconds)."""

    cell: Cell
    rows: list
    records: list[dict]


def read_records(path: Path) -> list[dict]:
    """llama-bench's results in one file, in any of its output formats, each checked."""
    path = Path(path)
    return _records(read_text(path, "llama-bench output"), path)


def imported_cells(recs: list[dict], source: Path, device: str, recipe: str) -> list[ImportedCell]:
    """llama-bench's records as the lab's cells and rows (one cell per model file), without a ledger: what
    `import_files` writes, and what the corpus of real captures checks."""
    source = Path(source)
    by_model: dict[str, list] = {}
    for r in recs:
        # one cell per model file; the markdown table names no file: one per model type ('llama 7B Q8_0')
        by_model.setdefault(str(r.get("model_filename") or r.get("model_type") or "?"), []).append(r)
    out = []
    for mfile, rs in by_model.items():
        digest = hashlib.sha256((device + recipe + json.dumps(rs, sort_keys=True)).encode()).hexdigest()[:16]
        r0 = rs[0]
        model = Path(mfile).stem if r0.get("model_filename") else _model_of(r0)
        quant = quant_of(r0.get("model_type", ""))
        cell = Cell(recipe, device, model, quant, benchp.Bench.name, {"imported_from": str(source)}, digest)
        try:
            rows = benchp.rows([benchp.BenchTest(r, None) for r in rs])
        except DevicelabError as e:
            raise DevicelabError(f"{source}: {e}") from None
        note = f"imported from {source.name}"
        if "md_size" in r0:
            note += (
                f" (llama-bench's markdown table: size {r0['md_size']}, params {r0.get('md_params')}, rounded there)"
            )
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
            "bpw": (r0["model_size"] * 8 / r0["model_n_params"])
            if r0.get("model_n_params") and r0.get("model_size")
            else None,
            "build_commit": r0.get("build_commit"),
            "device_facts": {"cpu_info": r0.get("cpu_info"), "gpu_info": r0.get("gpu_info")},
            "base_note": note,
        }
        for row in rows:
            row.context = ctx
        out.append(ImportedCell(cell, rows, rs))
    return out


def _model_of(r: dict) -> str:
    """A model's name where the output names no file (the markdown table): its type's architecture and size words
    ('llama 7B mostly Q4_0' -> 'llama-7B')."""
    return "-".join(str(r.get("model_type") or "?").split()[:2])


def import_files(files, device: str, recipe: str, lab_dir: Path) -> int:
    """Every file is read and checked before anything is written: a bad file imports nothing."""
    todo = []
    for f in files:
        f = Path(f)
        todo += imported_cells(read_records(f), f, device, recipe)
    led = Ledger(ledger_path(lab_dir))
    for ic in todo:
        led.register([ic.cell])
        led.finish_cell(ic.cell.cell_id, ic.rows)
    return sum(len(ic.rows) for ic in todo)


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
