"""The ledger at schema version 2: facts stored once, the wide frame unchanged, filters in the database, the
migration of a version-1 file (and its resumption after a cut), upkeep that never removes what reparse needs,
and a writer that a long reader does not hold up. Fast: no llama.cpp, no model."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from ledger_rows import populate

from devicelab import ledger_schema as ls
from devicelab.ledger import Ledger, ledger_path
from devicelab.ledger_migrate import CUT_ENV, backup_path
from devicelab.ledger_query import INT_COLUMNS as INTS
from devicelab.plan import Cell
from devicelab.schema import ROW_COLUMNS, Row

FIXTURE = Path(__file__).parent / "fixtures" / "ledger-v1.sql"
HERE = Path(__file__).parent


def v1_file(path: Path) -> Path:
    """The version-1 ledger the previous devicelab wrote (tests/ledger_rows.py, saved as an SQL dump)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.executescript(FIXTURE.read_text())
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    return path


def old_frame(path: Path, done_only: bool = True) -> pd.DataFrame:
    """What the previous Ledger.rows_frame returned (its query and conversions, copied), read from a v1 file."""
    db = sqlite3.connect(path)
    q = "SELECT r.* FROM rows r JOIN cells c ON c.cell_id = r.cell_id"
    df = pd.read_sql_query(q + (" WHERE c.status = 'done'" if done_only else "") + " ORDER BY r.row_id", db)
    for c in (
        "threads",
        "n_prompt",
        "n_gen",
        "n_depth",
        "ctx",
        "n",
        "model_bytes",
        "n_params",
        "kv_bytes_per_token",
        "device_mem_bytes",
        "ram_budget_bytes",
        "contention",
        "n_parallel",
        "n_gpu_layers",  # typed since the columns are declared once (schema.COLUMNS): its digits were text before
    ):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    df["cpu_quota"] = pd.to_numeric(df["cpu_quota"], errors="coerce")
    df["throttled"] = df["throttled"].map({"1": True, "0": False, 1: True, 0: False, "True": True, "False": False})
    db.close()
    # the columns rows gained after version 1 (schema.ROW_COLUMNS, e.g. host_busy_cpus, round): empty for its rows,
    # typed as the query layer types its integer columns
    for c in NEWER_COLUMNS:
        df.insert(list(ROW_COLUMNS).index(c) + 1, c, pd.array([pd.NA] * len(df), dtype="Int64") if c in INTS else None)
    return df


def _v1_columns() -> list[str]:
    db = sqlite3.connect(":memory:")
    db.executescript(FIXTURE.read_text())
    cols = [r[1] for r in db.execute("PRAGMA table_info(rows)")]
    db.close()
    return cols


V1_COLUMNS = _v1_columns()
NEWER_COLUMNS = [c for c in ROW_COLUMNS if c not in V1_COLUMNS]


def raw(path: Path, table: str = "rows") -> list[tuple]:
    """The stored rows as version 1 had them: its columns, in its order."""
    db = sqlite3.connect(path)
    have = {d[0] for d in db.execute(f"SELECT * FROM {table} LIMIT 0").description}
    cols = ", ".join(c for c in V1_COLUMNS if c in have)
    out = db.execute(f"SELECT {cols} FROM {table} ORDER BY row_id").fetchall()
    db.close()
    return out


@pytest.fixture
def led(tmp_path) -> Ledger:
    return populate(Ledger, Cell, Row, ledger_path(tmp_path / "lab"))


def test_written_rows_read_back_exactly_as_the_previous_version(tmp_path, led):
    old = old_frame(v1_file(tmp_path / "v1.sqlite"))
    new = led.rows_frame()
    assert len(new) == len(old) > 60
    pd.testing.assert_frame_equal(new, old)
    # the view gives the wide table, row for row, value for value and type for type
    assert raw(led.path) == raw(tmp_path / "v1.sqlite")
    pd.testing.assert_frame_equal(led.rows_frame(done_only=False), old_frame(tmp_path / "v1.sqlite", done_only=False))


def test_facts_are_stored_once(led):
    db = sqlite3.connect(led.path)
    n = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("rowdata", "contexts", "shapes", "facts")}
    n["rows"] = n["rowdata"]
    texts = set()
    for c in ls.FACT_COLUMNS:
        texts |= {r[0] for r in db.execute(f"SELECT DISTINCT {c} FROM rows WHERE {c} IS NOT NULL")}
    assert n["facts"] == len(texts)  # each distinct text once
    assert (
        db.execute("SELECT count(*) FROM (SELECT body FROM facts GROUP BY body HAVING count(*) > 1)").fetchone()[0] == 0
    )
    cells = db.execute("SELECT count(DISTINCT cell_id) FROM rows").fetchone()[0]
    assert n["contexts"] <= cells + 1  # one per cell (+ a replaced cell's old one, until compact)
    assert n["shapes"] < n["rows"] / 3
    cols = {r[1] for r in db.execute("PRAGMA table_info(rowdata)")}
    assert cols == {"row_id", "ctx", "shape", *ls.OWN_COLUMNS}


def _grow(path: Path, cells: int, rows_per_cell: int = 25) -> Ledger:
    """A ledger of many cells whose facts repeat, as nightly runs' do."""
    from ledger_rows import _ctx, _rows

    led = Ledger(path)
    for i in range(cells):
        cid = f"grow{i:012d}"
        night = 1 + i % 28
        led.register([Cell("nightly", "pixel-7", "smollm2-135m", "q4_0", "bench", {"i": i}, cid)])
        led.begin_cell(cid, f"run-{night}")
        rs = (_rows(Row, "bench", _ctx(night, "pixel-7", "q4_0", "bench", "aaaa111", cid), night) * 5)[:rows_per_cell]
        led.finish_cell(cid, rs)
    return led


def test_bytes_per_row_small(tmp_path):
    led = _grow(tmp_path / "g.sqlite", 300)
    led.vacuum()
    info = led.info()
    assert info["rowdata"] == 300 * 25
    # a version-1 file holds ≈ 1.4 kB per row; facts once, the row's own part is what remains
    assert info["bytes_per_row"] < 200, info


def test_filters_select_in_the_database(led):
    every = led.rows_frame()
    assert set(every.run_id) == {"run-3", "run-4"}
    r4 = led.rows_frame(run="run-4")
    pd.testing.assert_frame_equal(r4, every[every.run_id == "run-4"].reset_index(drop=True))
    assert set(led.rows_frame(run="latest").run_id) == {"run-4"}
    dev = led.rows_frame(device="rpi5")
    assert set(dev.device) == {"rpi5"} and len(dev) == (every.device == "rpi5").sum()
    assert set(led.rows_frame(device=["rpi5", "pixel-7"]).device) == {"rpi5", "pixel-7"}
    assert set(led.rows_frame(since="2026-11-04").recorded_at) == {"2026-11-04T02:00:00Z"}
    assert led.rows_frame(since="2026-11-05").empty
    assert led.rows_frame(recipe="other").empty
    # latest: per logical cell (recipe, device, model, quant, payload, params) its newest done cell: night 4's
    lat = led.rows_frame(latest=True)
    assert set(lat.run_id) == {"run-4"} and lat.cell_id.nunique() == every[every.run_id == "run-4"].cell_id.nunique()
    pd.testing.assert_frame_equal(lat, r4)
    few = led.rows_frame(latest=True, device="pixel-7", columns=["device", "metric", "value", "device_facts"])
    assert list(few.columns) == ["row_id", "device", "metric", "value", "device_facts"]
    pd.testing.assert_frame_equal(few, r4[r4.device == "pixel-7"][list(few.columns)].reset_index(drop=True))
    with pytest.raises(Exception, match="unknown row column"):
        led.rows_frame(columns=["nope"])
    # match: text (or prefix) on cell-level columns, as `compare` sides select
    m = led.rows_frame(match={"build_commit": ("bbbb", True), "device": ("rpi5", False)})
    assert m.row_id.tolist() == every[(every.build_commit == "bbbb222") & (every.device == "rpi5")].row_id.tolist()
    assert len(led.rows_frame(match={"run_id": ("run-", True)})) == len(every)
    assert led.rows_frame(match={"run_id": ("run-3x", True)}).empty


def test_filters_use_indexes(led):
    from devicelab.ledger_query import Selection, query

    db = led.reader()
    for sel in (Selection(latest=True), Selection(run="run-4"), Selection(device="rpi5", since="2026-11-01")):
        q, args, _ = query(db, sel)
        plan = " | ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + q, args))
        assert "SCAN r" not in plan and "SCAN rowdata" not in plan, plan
        assert "rowdata_ctx" in plan, plan
    db.close()


def test_migration_of_a_version_1_ledger(tmp_path):
    path = v1_file(tmp_path / "lab" / "ledger.sqlite")
    old, old_raw = old_frame(path), raw(path)
    led = Ledger(path)
    assert backup_path(path).exists() and raw(backup_path(path)) == old_raw  # the copy, first
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(ls.VERSION)
    assert db.execute("SELECT type FROM sqlite_master WHERE name='rows'").fetchone()[0] == "view"
    pd.testing.assert_frame_equal(led.rows_frame(), old)
    assert raw(path) == old_raw
    # it keeps working as a ledger: a new cell's rows get new ids, after the migrated ones
    led.register([Cell("nightly", "rpi5", "m", "q4_0", "bench", {}, "newcell000000000")])
    led.begin_cell("newcell000000000", "run-5")
    led.finish_cell(
        "newcell000000000",
        [Row(metric="decode_tps", value=1.0, context={"cell_id": "newcell000000000", "run_id": "run-5"})],
    )
    assert led.rows_frame(run="run-5").row_id.tolist() == [max(r[0] for r in old_raw) + 1]
    Ledger(path)  # a second open: nothing to do
    assert raw(path)[:-1] == old_raw


def test_migration_shrinks_a_grown_version_1_ledger(tmp_path):
    path = v1_file(tmp_path / "ledger.sqlite")
    db = sqlite3.connect(path)
    cols = ", ".join(c for c in (r[1] for r in db.execute("PRAGMA table_info(rows)")) if c != "row_id")
    for _ in range(5):  # 83 → 2656 rows, each repeating its facts as version 1 did
        db.execute(f"INSERT INTO rows ({cols}) SELECT {cols} FROM rows")
    db.commit()
    db.execute("VACUUM")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    n = db.execute("SELECT count(*) FROM rows").fetchone()[0]
    old = old_frame(path)
    before = path.stat().st_size
    db.close()
    led = Ledger(path)
    pd.testing.assert_frame_equal(led.rows_frame(), old)
    assert before / n > 700 and led.size() / n < before / n / 4, (before / n, led.size() / n)


def test_migration_of_an_older_version_1_ledger_without_the_newer_columns(tmp_path):
    path = v1_file(tmp_path / "ledger.sqlite")
    db = sqlite3.connect(path)
    for c in ("n_parallel", "gpu_device", "eval_route"):  # columns later devicelabs added to version 1
        db.execute(f"ALTER TABLE rows DROP COLUMN {c}")
    db.commit()
    db.close()
    old = old_frame(v1_file(tmp_path / "full.sqlite"))
    new = Ledger(path).rows_frame()
    assert new.n_parallel.isna().all() and new.gpu_device.isna().all()
    pd.testing.assert_frame_equal(
        new.drop(columns=["n_parallel", "gpu_device", "eval_route"]),
        old.drop(columns=["n_parallel", "gpu_device", "eval_route"]),
    )


def _open_in_subprocess(path: Path, cut: str) -> subprocess.CompletedProcess:
    env = {**os.environ, CUT_ENV: cut, "PYTHONPATH": str(HERE.parent / "host")}
    return subprocess.run(
        [sys.executable, "-c", f"from devicelab.ledger import Ledger; Ledger({str(path)!r})"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("cut", ["after-backup", "after-normalize", "before-commit"])
def test_migration_cut_anywhere_is_resumed(tmp_path, cut):
    path = v1_file(tmp_path / "ledger.sqlite")
    old, old_raw = old_frame(path), raw(path)
    p = _open_in_subprocess(path, cut)
    assert p.returncode == 9, p.stderr  # died mid-way
    db = sqlite3.connect(path)
    assert db.execute("SELECT type FROM sqlite_master WHERE name='rows'").fetchone()[0] == "table"
    assert raw(path) == old_raw  # still version 1, untouched
    db.close()
    assert backup_path(path).exists()
    led = Ledger(path)  # the next open finishes it
    pd.testing.assert_frame_equal(led.rows_frame(), old)
    assert raw(path) == old_raw


def _attempts(led: Ledger, cid: str, n: int) -> None:
    for a in range(1, n + 1):
        d = led.artifacts_dir / cid / f"attempt-{a}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "stdout.txt").write_text("x" * 100)


def test_keep_policies_never_remove_what_reparse_needs(led):
    db = sqlite3.connect(led.path)
    db.execute("UPDATE cells SET attempts = 3 WHERE cell_id IN (SELECT cell_id FROM cells LIMIT 4)")
    db.execute("INSERT INTO cells (cell_id, status, attempts) VALUES ('runningcell00000', 'running', 2)")
    db.commit()
    cells = {r[0]: (r[1], r[2]) for r in db.execute("SELECT cell_id, status, attempts FROM cells")}
    for cid, (_, n) in cells.items():
        _attempts(led, cid, n)
    (led.artifacts_dir / "someone-elses").mkdir()

    def left() -> set[tuple[str, int]]:
        return {(p.parent.name, int(p.name.split("-")[1])) for p in led.artifacts_dir.glob("*/attempt-*")}

    needed = {(cid, n) for cid, (st, n) in cells.items() if st == "done"}  # what reparse reads
    dropped, pr = led.compact(keep="all")
    assert not pr.removed and len(left()) == sum(n for _, n in cells.values())
    _, pr = led.compact(keep="latest", dry_run=True)
    assert pr.removed and len(left()) == sum(n for _, n in cells.values())  # a dry run removes nothing
    _, pr = led.compact(keep="latest")
    failed_last = ("failedcell000000", cells["failedcell000000"][1])
    assert needed <= left() and failed_last in left() and pr.unknown == 1
    assert {("runningcell00000", 1), ("runningcell00000", 2)} <= left()  # a running cell is not touched
    assert pr.bytes == 100 * len(pr.removed)
    _, pr = led.compact(keep="done")
    assert needed <= left() and failed_last not in left()
    assert left() - needed == {("runningcell00000", 1), ("runningcell00000", 2)}
    assert (led.artifacts_dir / "someone-elses").is_dir()


def test_compact_and_vacuum_drop_only_what_no_row_refers_to(led):
    before = led.rows_frame(done_only=False)
    db = sqlite3.connect(led.path)
    n_ctx = db.execute("SELECT count(*) FROM contexts").fetchone()[0]
    db.execute("DELETE FROM rows WHERE cell_id = (SELECT cell_id FROM cells WHERE status='done' LIMIT 1)")
    db.commit()
    after_delete = led.rows_frame(done_only=False)
    dropped, _ = led.compact()
    assert dropped["contexts"] >= 2 and dropped["facts"] >= 0
    assert db.execute("SELECT count(*) FROM contexts").fetchone()[0] < n_ctx
    assert len(after_delete) < len(before)
    b, a = led.vacuum()
    assert a <= b
    pd.testing.assert_frame_equal(led.rows_frame(done_only=False), after_delete)
    assert led.info()["schema_version"] == ls.VERSION


def test_a_writer_does_not_wait_for_a_long_reader(tmp_path):
    led = _grow(tmp_path / "w.sqlite", 40)
    reader = led.reader()
    cur = reader.execute("SELECT * FROM rows")  # a read transaction held open, mid-way
    cur.fetchmany(10)
    t0 = time.monotonic()
    from ledger_rows import _ctx, _rows

    led.register([Cell("nightly", "rpi5", "smollm2-135m", "q4_0", "bench", {}, "duringread000000")])
    led.begin_cell("duringread000000", "run-9")
    led.finish_cell(
        "duringread000000", _rows(Row, "bench", _ctx(9, "rpi5", "q4_0", "bench", "aaaa111", "duringread000000"), 9)
    )
    assert time.monotonic() - t0 < 1.0
    assert led.status("duringread000000") == "done"
    assert len(cur.fetchall()) == 40 * 25 - 10  # the reader still sees its snapshot
    reader.close()
    # and rows_frame in a thread while a lane writes: neither waits for the other's lock
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("df", led.rows_frame()))
    th.start()
    led.register([Cell("nightly", "rpi5", "smollm2-135m", "q8_0", "bench", {}, "duringread000001")])
    led.begin_cell("duringread000001", "run-9")
    th.join()
    assert len(out["df"]) >= 40 * 25


def test_a_new_ledger_is_version_2_and_the_view_deletes(tmp_path):
    led = _grow(tmp_path / "n.sqlite", 2)
    db = sqlite3.connect(led.path)
    assert db.execute("SELECT count(*) FROM rows").fetchone()[0] == 50
    db.execute("DELETE FROM rows")
    db.commit()
    assert db.execute("SELECT count(*) FROM rowdata").fetchone()[0] == 0
    assert not backup_path(led.path).exists()


def test_view_commands_leave_only_columns_no_view_reads():
    """results/recommend/report/roofline/findings pull every column but the big texts; no module they call names
    one of those (a column named in quotes or as an attribute)."""
    import re

    from devicelab.cli import UNREAD_COLUMNS

    src = HERE.parent / "host" / "devicelab"
    files = [src / f"{m}.py" for m in ("tables", "recommend", "analysis", "budget", "report", "compare")]
    files += sorted((src / "report").glob("*.py"))
    text = "".join(f.read_text() for f in files if f.exists())
    named = [c for c in UNREAD_COLUMNS if re.search(rf"['\".]{c}\b", text)]
    assert not named, f"a view reads {named}: take them out of cli.UNREAD_COLUMNS"


def test_cli_selects_latest_by_default_and_keeps_the_ledger(tmp_path, led):
    from conftest import devicelab

    lab = led.path.parent
    out = tmp_path / "latest.csv"
    devicelab("results", "--lab-dir", lab, "--export", out, check=True)
    got = pd.read_csv(out)
    assert set(got.run_id) == {"run-4"} and len(got) == len(led.rows_frame(latest=True))
    devicelab("results", "--lab-dir", lab, "--all", "--export", out, check=True)
    assert len(pd.read_csv(out)) == len(led.rows_frame())
    devicelab("results", "--lab-dir", lab, "--device", "rpi5", "--since", "2026-11-03", "--export", out, check=True)
    got = pd.read_csv(out)
    assert set(got.device) == {"rpi5"} and set(got.run_id) == {"run-3", "run-4"}
    p = devicelab("results", "--lab-dir", lab, "--run", "run-3", check=True)
    assert "pixel-7" in p.stdout and "rpi5" in p.stdout
    p = devicelab("findings", "--lab-dir", lab, "--device", "pixel-7", check=True)
    assert "rpi5" not in p.stdout
    p = devicelab(
        "compare", "--a", "commit=aaaa", "--b", "commit=bbbb", "--lab-dir", lab, "--format", "csv", check=True
    )
    assert "decode_tps" in p.stdout and "pixel-7" in p.stdout
    db = sqlite3.connect(led.path)
    for cid in [c["cell_id"] for c in led.done_cells()][:3]:
        db.execute("UPDATE cells SET attempts = 2 WHERE cell_id = ?", (cid,))
        _attempts(led, cid, 2)
    db.commit()
    p = devicelab("ledger", "compact", "--lab-dir", lab, "--dry-run", check=True)
    assert "would remove 3 attempt folder(s)" in p.stdout
    p = devicelab("ledger", "compact", "--lab-dir", lab, check=True)
    assert "removed 3 attempt folder(s)" in p.stdout and len(list(led.artifacts_dir.glob("*/attempt-2"))) == 3
    assert "MiB →" in devicelab("ledger", "vacuum", "--lab-dir", lab, check=True).stdout
    assert "bytes_per_row" in devicelab("ledger", "info", "--lab-dir", lab, check=True).stdout


def test_a_failure_never_overwrites_a_finished_cell(tmp_path):
    """The driver's fail_cell and the head's finish_cell may meet on one cell: done (or skipped) stays."""
    from devicelab.ledger import DONE, SKIPPED, Ledger
    from devicelab.plan import Cell

    led = Ledger(tmp_path / "ledger.sqlite")
    cells = [Cell("r", "d", "m", q, "bench", {}, f"{i:016x}") for i, q in enumerate(("a", "b", "c"))]
    led.register(cells)
    for c in cells:
        led.begin_cell(c.cell_id, "run")
    led.finish_cell(cells[0].cell_id, [])
    led.skip_cell(cells[1].cell_id, "no GPU")
    for c in cells:
        led.fail_cell(c.cell_id, "the run ended", retryable=True)
    assert [led.status(c.cell_id) for c in cells] == [DONE, SKIPPED, "failed-retryable"]


def test_the_same_selection_over_an_exported_table(led):
    from devicelab.ledger_query import Selection, filter_frame

    every = led.rows_frame()
    assert set(filter_frame(every, Selection(run="latest")).run_id) == {"run-4"}
    got = filter_frame(every, Selection(device=["rpi5"], since="2026-11-04", columns=["device", "value"]))
    assert list(got.columns) == ["row_id", "device", "value"] and set(got.device) == {"rpi5"}
    assert got.row_id.tolist() == led.rows_frame(device="rpi5", since="2026-11-04").row_id.tolist()
