#!/usr/bin/env python3
"""A ledger that grows for a year: what `results`, `recommend` and `report` cost at 10^5, 10^6 and 10^7 rows.

A history is synthesized from a real run's rows (the template: a lab's ledger, copied first and migrated if it
is a version-1 file; by default the quickstart's): nightly runs of several phones (5 by default) — each night one
run, each phone the template's cells and rows, its own device facts, a llama.cpp commit (and build) that changes
every week, the night's date, values jittered. The last night is the same at every size, so the latest run is the
same size at 10^5, 10^6 and 10^7 rows and only the history grows: at 10^6 rows 5 phones make a year of nights, at
10^7 ten years (or a year of a lab ten times as large: `--phones 47` packs 10^7 rows into 365 nights, and then
the latest run is ten times as large too). It is written in the database by bulk INSERT … SELECT (no Python row
objects), so 10^7 rows take about a minute.

Then each command runs in a fresh process (`python -m devicelab.cli …`): `results`, `recommend` and `report` as a
user types them (by default the latest result of each cell: last night's), and `results --device phone-00
--since <a month before the last night>`. Printed per size: seconds and peak RSS of each, the file's bytes per
row. Goals at 10^7: each command < 2 s and < 500 MB, ≤ 200 bytes per row.

usage: python bench/ledger_scale.py [--template LEDGER] [--sizes 1e5,1e6,1e7] [--keep DIR]
The last line is exactly `ledger: rows=N latest_s=X month_s=Y peak_mb=Z bytes_per_row=W` (latest_s: the
slowest of results/recommend/report on the latest run; peak_mb: the largest peak of all four)."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "host"))

from devicelab import ledger_schema as ls  # noqa: E402
from devicelab.ledger import Ledger  # noqa: E402

QUICKSTART = Path("/work/scratch/qs/lab/ledger.sqlite")
LAST_NIGHT = "2026-12-03T02:00:00Z"
PHONES = 5


def template(src: Path, work: Path) -> Path:
    """A copy of the source ledger at today's schema (the source itself is never opened for writing)."""
    dst = work / "template" / "ledger.sqlite"
    dst.parent.mkdir(parents=True)
    s = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    d = sqlite3.connect(dst)
    s.backup(d)
    s.close()
    d.close()
    Ledger(dst).close()
    return dst


def _stage_template(db: sqlite3.Connection) -> tuple[int, int, int]:
    """Temp tables of the template's done rows, their contexts (densely numbered) and cells."""
    db.execute(
        "CREATE TEMP TABLE t_ctx AS SELECT x.*, 0 AS cidx FROM t.contexts x JOIN t.cells c "
        "ON c.cell_id = x.cell_id WHERE c.status = 'done' AND EXISTS "
        "(SELECT 1 FROM t.rowdata r WHERE r.ctx = x.id) ORDER BY x.id"
    )
    db.execute("UPDATE t_ctx SET cidx = (SELECT count(*) FROM t_ctx y WHERE y.id < t_ctx.id)")
    db.execute(
        "CREATE TEMP TABLE t_rows AS SELECT r.*, x.cidx AS cidx FROM t.rowdata r JOIN t_ctx x ON x.id = r.ctx "
        "ORDER BY r.row_id"
    )
    db.execute(
        "CREATE TEMP TABLE t_cells AS SELECT c.*, min(x.cidx) AS cidx FROM t.cells c JOIN t_ctx x "
        "ON x.cell_id = c.cell_id GROUP BY c.cell_id"
    )
    n = [db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("t_rows", "t_ctx", "t_cells")]
    return n[0], n[1], n[2]


def _units(n_units: int) -> str:
    return f"WITH RECURSIVE units(u) AS (SELECT 0 UNION ALL SELECT u + 1 FROM units WHERE u + 1 < {n_units}) "


def _when(expr_night: str, nights: int) -> str:
    return f"strftime('%Y-%m-%dT%H:%M:%SZ', '{LAST_NIGHT}', '-' || ({nights - 1} - ({expr_night})) || ' days')"


def synthesize(tmpl: Path, out: Path, n_rows: int, phones: int | None = None) -> dict:
    """Nightly runs of several phones ending on LAST_NIGHT, n_rows rows exactly, in a fresh ledger at `out`."""
    Ledger(out).close()
    db = sqlite3.connect(out, isolation_level=None)
    db.create_function("dl_hash", -1, ls.dl_hash, deterministic=True)
    db.execute("PRAGMA journal_mode=DELETE")  # a bulk load: no WAL copy of every page, no fsync per step
    db.execute("PRAGMA synchronous=OFF")
    db.execute("PRAGMA cache_size=-200000")
    db.execute("ATTACH ? AS t", (str(tmpl),))
    t_rows, t_ctx, _ = _stage_template(db)
    phones = phones or PHONES
    units = math.ceil(n_rows / t_rows)  # a unit: one phone on one night
    nights = math.ceil(units / phones)
    first = phones * nights - units  # the first night's first phones: not yet in the lab
    db.execute("BEGIN")
    _facts_and_shapes(db, phones)
    _runs_cells_contexts(db, phones, nights, first, units, t_ctx)
    _rowdata(db, units, first, t_ctx)
    extra = db.execute("SELECT count(*) FROM rowdata").fetchone()[0] - n_rows
    if extra > 0:  # the oldest unit keeps only its last rows
        db.execute("DELETE FROM rowdata WHERE row_id <= (SELECT min(row_id) FROM rowdata) + ? - 1", (extra,))
    ls.fill_latest(db)
    db.execute("COMMIT")
    db.execute("DETACH t")
    db.execute("ANALYZE")
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    return {"phones": phones, "nights": nights, "template_rows": t_rows, "template_cells": t_ctx}


def _facts_and_shapes(db: sqlite3.Connection, phones: int) -> None:
    db.execute("INSERT INTO facts (id, hash, body) SELECT id, hash, body FROM t.facts")
    db.execute("INSERT INTO shapes SELECT * FROM t.shapes")
    # each phone its own device facts; each week's commit its own build flags
    db.execute(
        _units(phones) + "INSERT INTO facts (hash, body) SELECT randomblob(16), "
        "CASE WHEN json_valid(f.body) THEN json_set(f.body, '$.synthetic_phone', u) "
        "ELSE f.body || ' phone ' || u END FROM units CROSS JOIN "
        "(SELECT DISTINCT device_facts AS id FROM t_ctx WHERE device_facts IS NOT NULL) d "
        "JOIN t.facts f ON f.id = d.id ORDER BY u"
    )
    db.execute("CREATE TEMP TABLE phone_facts (phone INTEGER PRIMARY KEY, id INTEGER)")
    db.execute(
        "INSERT OR IGNORE INTO phone_facts SELECT CAST(json_extract(body, '$.synthetic_phone') AS INTEGER), id "
        "FROM facts WHERE json_valid(body) AND json_extract(body, '$.synthetic_phone') IS NOT NULL"
    )


def _runs_cells_contexts(db: sqlite3.Connection, phones: int, nights: int, first: int, units: int, t_ctx: int) -> None:
    night = f"((u + {first}) / {phones})"
    when = _when(night, nights)
    phone = f"((u + {first}) % {phones})"
    run_at = _when("u", nights)
    db.execute(
        _units(nights) + f"INSERT INTO runs SELECT printf('synth-n%04d', u), 'synth', 'sha', {run_at}, "
        f"{run_at}, 'done', 0, 0, 0 FROM units"
    )
    cell_id = f"printf('%04x%02x', {night}, {phone}) || substr(c.cell_id, 1, 10)"
    db.execute(
        _units(units) + "INSERT INTO cells SELECT " + cell_id + ", c.recipe, printf('phone-%02d', "
        f"{phone}), c.model, c.quant, c.payload, c.params, 'done', 1, printf('synth-n%04d', {night}), "
        f"{when}, {when}, NULL, NULL FROM units CROSS JOIN t_cells c"
    )
    cols = [r[1] for r in db.execute("PRAGMA table_info(contexts)") if r[1] not in ("id", "hash")]
    put = {
        "run_id": f"printf('synth-n%04d', {night})",
        "cell_id": f"printf('%04x%02x', {night}, {phone}) || substr(x.cell_id, 1, 10)",
        "device": f"printf('phone-%02d', {phone})",
        "recorded_at": when,
        "build_commit": f"printf('%012x', 48879 * ({night} / 7 + 1))",
        "build_key": f"printf('key-%04d', {night} / 7)",
        "device_facts": f"(SELECT id FROM phone_facts WHERE phone = {phone})",
    }
    sel = ", ".join(put.get(c, f"x.{c}") for c in cols)
    db.execute(
        _units(units) + f"INSERT INTO contexts (id, hash, {', '.join(cols)}) SELECT 1 + u * {t_ctx} + x.cidx, "
        f"randomblob(16), {sel} FROM units CROSS JOIN t_ctx x"
    )


def _rowdata(db: sqlite3.Connection, units: int, first: int, t_ctx: int) -> None:
    jitter = "(1 + ((abs(random()) % 2001) - 1000) / 20000.0)"
    db.execute(
        _units(units) + "INSERT INTO rowdata (ctx, shape, value, stddev, n, samples) SELECT "
        f"1 + u * {t_ctx} + r.cidx, r.shape, r.value * {jitter}, r.stddev, r.n, r.samples "
        "FROM units CROSS JOIN t_rows r"
    )  # in (u, row) order: the nested loops' own, no sort


# each command's peak RSS, measured by a small process of its own: a child's ru_maxrss starts from its parent's RSS
# at fork (Linux), and this process holds the synthesized database's pages
_TIMER = """import os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
out = p.stdout.read()
_, status, ru = os.wait4(p.pid, 0)
sys.stdout.buffer.write(out)
print(f"\\n@@ {time.perf_counter() - t0:.3f} {ru.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""


def run_cmd(args: list[str]) -> tuple[float, float, str]:
    """A devicelab command in a fresh process: (seconds, peak RSS in MB, its output)."""
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PYTHONPATH": ":".join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT / "host")])),
    }
    p = subprocess.run(
        [sys.executable, "-c", _TIMER, sys.executable, "-m", "devicelab.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
    )
    out, _, tail = p.stdout.rpartition("\n@@ ")
    secs, rss_kb, rc = tail.split()
    if int(rc) != 0:
        raise SystemExit(f"devicelab {' '.join(args)} failed ({rc}):\n{out[-3000:]}{p.stderr[-2000:]}")
    return float(secs), int(rss_kb) / 1024, out


def measure(lab: Path, n_rows: int, shape: dict) -> dict:
    db = sqlite3.connect(lab / "ledger.sqlite")
    last = db.execute("SELECT max(recorded_at) FROM contexts").fetchone()[0]
    month = db.execute("SELECT strftime('%Y-%m-%d', ?, '-30 days')", (last,)).fetchone()[0]
    db.close()
    size = sum(p.stat().st_size for p in lab.glob("ledger.sqlite*") if "bak" not in p.name)
    res = {}
    for name, args in (
        ("results", ["results"]),
        ("recommend", ["recommend"]),
        ("report", ["report", "-o", str(lab / "report.html")]),
        ("month", ["results", "--device", "phone-00", "--since", month]),
    ):
        res[name] = run_cmd([*args, "--lab-dir", str(lab)])
    print(
        f"rows={n_rows:>9} phones={shape['phones']} nights={shape['nights']} bytes/row={size / n_rows:.1f}  "
        + "  ".join(f"{k} {s:.2f}s {m:.0f}MB" for k, (s, m, _) in res.items()),
        flush=True,
    )
    return {
        "latest_s": max(res[k][0] for k in ("results", "recommend", "report")),
        "month_s": res["month"][0],
        "peak_mb": max(m for _, m, _ in res.values()),
        "bytes_per_row": size / n_rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", type=Path, default=QUICKSTART, help="a lab's ledger.sqlite (its rows: one night)")
    ap.add_argument("--sizes", default="1e5,1e6,1e7")
    ap.add_argument("--phones", type=int, default=PHONES, help="phones in the lab (each night: all of them)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the synthesized labs in this folder")
    a = ap.parse_args()
    if not a.template.exists():
        raise SystemExit(
            f"{a.template}: no such ledger; give --template LAB/ledger.sqlite of a real run (the quickstart's: "
            f"`devicelab run recipes/quickstart.yaml --lab-dir {a.template.parent}`, a few minutes)"
        )
    work = Path(tempfile.mkdtemp(prefix="ledger-scale-", dir=a.keep))
    tmpl = template(a.template, work)
    last = None
    try:
        for n in (int(float(s)) for s in a.sizes.split(",")):
            lab = work / f"lab-{n}"
            t0 = time.perf_counter()
            shape = synthesize(tmpl, lab / "ledger.sqlite", n, a.phones)
            print(f"synthesized {n} rows ({shape}) in {time.perf_counter() - t0:.1f} s", flush=True)
            last = (n, measure(lab, n, shape))
            if a.keep is None:
                shutil.rmtree(lab)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    n, m = last
    print(
        f"ledger: rows={n} latest_s={m['latest_s']:.2f} month_s={m['month_s']:.2f} peak_mb={m['peak_mb']:.0f} "
        f"bytes_per_row={m['bytes_per_row']:.0f}"
    )


if __name__ == "__main__":
    main()
