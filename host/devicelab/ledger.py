"""The durable ledger: an embedded SQLite file recording runs, cells and normalized rows.

A cell's rows and its 'done' status are written in one transaction, so a run killed at any instant
leaves each cell either done with all its rows or not done with none: resuming re-runs exactly the
unfinished cells. Raw artifacts live beside the ledger (artifacts/<cell_id>/attempt-N/) so every row
can be re-derived from what the device printed."""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Iterable

from .errors import DevicelabError
from .schema import ROW_COLUMNS, Row

REAL_COLUMNS = ("value", "stddev", "bpw", "temp_start_c", "temp_end_c", "battery_wh")
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, recipe TEXT, recipe_sha TEXT, started_at TEXT, finished_at TEXT,
  status TEXT, cells_total INTEGER, cells_run INTEGER, cells_skipped INTEGER);
CREATE TABLE IF NOT EXISTS cells (
  cell_id TEXT PRIMARY KEY, recipe TEXT, device TEXT, model TEXT, quant TEXT, payload TEXT,
  params TEXT, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, run_id TEXT,
  started_at TEXT, finished_at TEXT, artifacts TEXT, error TEXT);
CREATE TABLE IF NOT EXISTS rows (
  row_id INTEGER PRIMARY KEY AUTOINCREMENT,
  {", ".join(f"{c} {'REAL' if c in REAL_COLUMNS else 'TEXT'}" for c in ROW_COLUMNS)});
CREATE INDEX IF NOT EXISTS rows_cell ON rows(cell_id);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT);
"""

DONE, PENDING, RUNNING, FAILED, RETRYABLE = "done", "pending", "running", "failed", "failed-retryable"
SKIPPED = "skipped"  # the device cannot do this cell (e.g. no cgroup to set a CPU quota): terminal, with a reason


LEDGER_FILE = "ledger.sqlite"  # in a lab folder (--lab-dir), beside artifacts/


def ledger_path(lab_dir) -> Path:
    """The ledger of a lab folder."""
    return Path(lab_dir) / LEDGER_FILE


def _locked(fn):
    """Every lane writes through the one ledger: one connection, one lock, whole transactions under it."""

    @functools.wraps(fn)
    def wrapper(self, *a, **kw):
        with self._lock:
            return fn(self, *a, **kw)

    return wrapper


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Ledger:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.RLock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA)
            have = {r[1] for r in self.db.execute("PRAGMA table_info(rows)")}
            for c in ROW_COLUMNS:  # a ledger from an older devicelab gains the new columns, keeps its rows
                if c not in have:
                    self.db.execute(f"ALTER TABLE rows ADD COLUMN {c} {'REAL' if c in REAL_COLUMNS else 'TEXT'}")
        except sqlite3.DatabaseError as e:
            raise DevicelabError(
                f"{self.path} is not a devicelab ledger ({e}); point --lab-dir at another folder"
            ) from e
        self.db.row_factory = sqlite3.Row

    @property
    def artifacts_dir(self) -> Path:
        d = self.path.parent / "artifacts"
        d.mkdir(parents=True, exist_ok=True)
        return d

    @_locked
    def close(self):
        self.db.close()

    # ---- runs ----
    @_locked
    def start_run(self, recipe: str, recipe_sha: str, total: int) -> str:
        run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.db.execute(
            "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
            (run_id, recipe, recipe_sha, _now(), None, "running", total, 0, 0),
        )
        return run_id

    @_locked
    def finish_run(self, run_id: str, status: str, ran: int, skipped: int):
        self.db.execute(
            "UPDATE runs SET finished_at=?, status=?, cells_run=?, cells_skipped=? WHERE run_id=?",
            (_now(), status, ran, skipped, run_id),
        )

    # ---- cells ----
    @_locked
    def register(self, cells: Iterable) -> None:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            for c in cells:
                self.db.execute(
                    "INSERT OR IGNORE INTO cells (cell_id, recipe, device, model, quant, payload, params, status)"
                    " VALUES (?,?,?,?,?,?,?,?)",
                    (
                        c.cell_id,
                        c.recipe,
                        c.device,
                        c.model,
                        c.quant,
                        c.payload,
                        json.dumps(c.params, sort_keys=True),
                        PENDING,
                    ),
                )

    @_locked
    def status(self, cell_id: str) -> str | None:
        r = self.db.execute("SELECT status FROM cells WHERE cell_id=?", (cell_id,)).fetchone()
        return r["status"] if r else None

    @_locked
    def cell(self, cell_id: str) -> dict | None:
        r = self.db.execute("SELECT * FROM cells WHERE cell_id=?", (cell_id,)).fetchone()
        return dict(r) if r else None

    @_locked
    def begin_cell(self, cell_id: str, run_id: str) -> tuple[int, str | None]:
        """Mark a cell running; return (attempt number, previous artifacts dir if an attempt was cut off)."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            r = self.db.execute("SELECT attempts, status, artifacts FROM cells WHERE cell_id=?", (cell_id,)).fetchone()
            prev = r["artifacts"] if r and r["status"] == RUNNING else None
            attempt = (r["attempts"] if r else 0) + 1
            self.db.execute(
                "UPDATE cells SET status=?, attempts=?, run_id=?, started_at=?, finished_at=NULL, error=NULL"
                " WHERE cell_id=?",
                (RUNNING, attempt, run_id, _now(), cell_id),
            )
        return attempt, prev

    @_locked
    def set_artifacts(self, cell_id: str, artifacts: str):
        self.db.execute("UPDATE cells SET artifacts=? WHERE cell_id=?", (artifacts, cell_id))

    @_locked
    def finish_cell(self, cell_id: str, rows: list[Row]) -> None:
        """Atomically replace the cell's rows and mark it done."""
        self._put_rows(cell_id, rows, done=True)

    def _put_rows(self, cell_id: str, rows: list[Row], done: bool) -> None:
        recs = [r.record() for r in rows]
        cols = ", ".join(ROW_COLUMNS)
        qs = ", ".join("?" for _ in ROW_COLUMNS)
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("DELETE FROM rows WHERE cell_id=?", (cell_id,))
            self.db.executemany(
                f"INSERT INTO rows ({cols}) VALUES ({qs})", [tuple(_sql(rec[c]) for c in ROW_COLUMNS) for rec in recs]
            )
            if done:
                self.db.execute(
                    "UPDATE cells SET status=?, finished_at=?, error=NULL WHERE cell_id=?", (DONE, _now(), cell_id)
                )

    @_locked
    def skip_cell(self, cell_id: str, reason: str) -> None:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("DELETE FROM rows WHERE cell_id=?", (cell_id,))
            self.db.execute(
                "UPDATE cells SET status=?, finished_at=?, error=? WHERE cell_id=?",
                (SKIPPED, _now(), reason[:2000], cell_id),
            )

    @_locked
    def fail_cell(self, cell_id: str, error: str, retryable: bool) -> None:
        self.db.execute(
            "UPDATE cells SET status=?, finished_at=?, error=? WHERE cell_id=?",
            (RETRYABLE if retryable else FAILED, _now(), error[:2000], cell_id),
        )

    @_locked
    def fail_running(self, run_id: str, error: str) -> int:
        """Any cell of this run still marked running (its lane could not record it): failed, retryable."""
        cur = self.db.execute(
            "UPDATE cells SET status=?, finished_at=?, error=? WHERE status=? AND run_id=?",
            (RETRYABLE, _now(), error, RUNNING, run_id),
        )
        return cur.rowcount

    @_locked
    def done_cells(self, recipe: str | None = None) -> list[dict]:
        q = "SELECT * FROM cells WHERE status=?" + (" AND recipe=?" if recipe else "") + " ORDER BY cell_id"
        return [dict(r) for r in self.db.execute(q, (DONE, recipe) if recipe else (DONE,))]

    @_locked
    def replace_rows(self, cell_id: str, rows: list[Row]) -> None:
        """A done cell's rows re-derived from its artifacts (reparse): replaced in one transaction."""
        self._put_rows(cell_id, rows, done=False)

    @_locked
    def cells(self, recipe: str | None = None) -> list[dict]:
        q = "SELECT * FROM cells" + (" WHERE recipe=?" if recipe else "") + " ORDER BY device, model, quant, payload"
        return [dict(r) for r in self.db.execute(q, (recipe,) if recipe else ())]

    # ---- small durable facts about a device (its battery calibration, idle temperature, charging state) ----
    @_locked
    def device_fact(self, device: str, kind: str):
        """The JSON value last stored for (device, kind), or None."""
        r = self.db.execute("SELECT value FROM kv WHERE key=?", (f"{kind}/{device}",)).fetchone()
        return json.loads(r[0]) if r else None

    @_locked
    def set_device_fact(self, device: str, kind: str, value) -> None:
        self.db.execute(
            "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (f"{kind}/{device}", json.dumps(value, default=str)),
        )

    # ---- rows ----
    @_locked
    def rows_frame(self, recipe: str | None = None, done_only: bool = True):
        import pandas as pd

        q = "SELECT r.* FROM rows r JOIN cells c ON c.cell_id = r.cell_id"
        conds, args = [], []
        if done_only:
            conds.append("c.status = 'done'")
        if recipe:
            conds.append("r.recipe = ?")
            args.append(recipe)
        if conds:
            q += " WHERE " + " AND ".join(conds)
        df = pd.read_sql_query(q + " ORDER BY r.row_id", self.db, params=args)
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
        ):
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
        df["cpu_quota"] = pd.to_numeric(df["cpu_quota"], errors="coerce")
        df["throttled"] = df["throttled"].map({"1": True, "0": False, 1: True, 0: False, "True": True, "False": False})
        return df


def _sql(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float) and math.isnan(v):
        return None  # NaN is stored as NULL; missing_reason says why
    return v
