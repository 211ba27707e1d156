"""The durable ledger: an embedded SQLite file recording runs, cells and normalized rows.

A cell's rows and its 'done' status are written in one transaction, so a run killed at any instant
leaves each cell either done with all its rows or not done with none: resuming re-runs exactly the
unfinished cells. Raw artifacts live beside the ledger (artifacts/<cell_id>/attempt-N/) so every row
can be re-derived from what the device printed.

Schema version 2 (ledger_schema): each fact is stored once — device facts, build flags, tensor types,
calibrations in `facts`, a cell's context in `contexts`, a row's test/metric shape in `shapes`, all keyed by
content hash — and a row holds its value and two small keys (≈ 75 bytes a row on disk instead of ≈ 1.4 kB). The
view `rows` and `rows_frame` still give the wide row. A version-1 file is migrated in place on first open
(ledger_migrate: a copy first, one transaction, resumable). Readers select in the database on connections of
their own (ledger_query); `compact`/`vacuum` and the artifacts' keep policy live in ledger_keep."""

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

from . import ledger_schema as ls
from .errors import DevicelabError
from .schema import ROW_COLUMNS, Row

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
            self.db = ls.connect(self.path)
            self.db.executescript(ls.BASE)
            from .ledger_migrate import open_schema

            open_schema(self.db, self.path)
            self.db.execute(ls.stage_ddl())
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
        try:
            self.db.execute("PRAGMA optimize")  # the planner's statistics, refreshed where they went stale
        except sqlite3.Error:
            pass
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
            self._delete_rows(cell_id)
            self.db.execute("DELETE FROM temp.stage")
            self.db.executemany(
                f"INSERT INTO temp.stage ({cols}) VALUES ({qs})",
                [tuple(_sql(rec[c]) for c in ROW_COLUMNS) for rec in recs],
            )
            ls.normalize(self.db, "temp.stage", keep_ids=False)
            self.db.execute("DELETE FROM temp.stage")
            if done:
                self.db.execute(
                    "UPDATE cells SET status=?, finished_at=?, error=NULL WHERE cell_id=?", (DONE, _now(), cell_id)
                )
                c = self.db.execute("SELECT * FROM cells WHERE cell_id=?", (cell_id,)).fetchone()
                if c is not None:
                    self.db.execute(
                        "INSERT INTO latest (key, cell_id) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET cell_id=excluded.cell_id",
                        (ls.logical_key(dict(c)), cell_id),
                    )

    def _delete_rows(self, cell_id: str) -> None:
        self.db.execute("DELETE FROM rowdata WHERE ctx IN (SELECT id FROM contexts WHERE cell_id=?)", (cell_id,))

    @_locked
    def skip_cell(self, cell_id: str, reason: str) -> None:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self._delete_rows(cell_id)
            self.db.execute(
                "UPDATE cells SET status=?, finished_at=?, error=? WHERE cell_id=?",
                (SKIPPED, _now(), reason[:2000], cell_id),
            )

    @_locked
    def fail_cell(self, cell_id: str, error: str, retryable: bool) -> None:
        """A cell that did not finish: failed. A cell already done or skipped keeps its outcome (two writers — a
        cluster's driver and its head — may both judge one cell at the end of a run)."""
        self.db.execute(
            "UPDATE cells SET status=?, finished_at=?, error=? WHERE cell_id=? AND status NOT IN (?, ?)",
            (RETRYABLE if retryable else FAILED, _now(), error[:2000], cell_id, DONE, SKIPPED),
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
    def rows_frame(
        self,
        recipe: str | None = None,
        done_only: bool = True,
        *,
        run: str | None = None,
        device: str | Iterable[str] | None = None,
        since: str | None = None,
        latest: bool = False,
        columns: Iterable[str] | None = None,
        match: dict | None = None,
    ):
        """The wide rows (every column of schema.ROW_COLUMNS, as version 1 returned them), selected in the
        database on a connection of its own (a long read never holds up a writer):

        recipe, device (a name or several), run (a run id, or "latest": the run that recorded last), since (an
        ISO date or time, or "30d" for the last 30 days: rows recorded then or later), latest (per logical cell —
        recipe, device, model, quant, payload, parameters — only its newest done cell, not older commits' or
        model files'), columns (only these, plus row_id), match ({column: (text, prefix?)} on cell-level text
        columns: ledger_query.MATCHABLE). Without filters: every done cell's rows, as before."""
        from .ledger_query import Selection, frame

        sel = Selection(
            recipe=recipe,
            done_only=done_only,
            run=run,
            device=device,
            since=since,
            latest=latest,
            columns=columns,
            match=match,
        )
        db = ls.connect(self.path, readonly=True)
        try:
            return frame(db, sel)
        finally:
            db.close()

    # ---- upkeep ----
    @_locked
    def compact(self, keep: str = "latest", dry_run: bool = False):
        """Drop what no row refers to any more, then prune raw artifacts by `keep` (ledger_keep: what reparse
        needs is always kept). Returns (dropped per table, ledger_keep.Pruned)."""
        from . import ledger_keep as lk

        dropped = {} if dry_run else lk.compact(self.db)
        return dropped, lk.prune_artifacts(self.db, self.artifacts_dir, keep, dry_run)

    @_locked
    def vacuum(self) -> tuple[int, int]:
        """VACUUM + ANALYZE; the file's size before and after."""
        from . import ledger_keep as lk

        before = self.size()
        lk.vacuum(self.db)
        return before, self.size()

    def size(self) -> int:
        return sum(p.stat().st_size for p in (self.path, self.path.with_name(self.path.name + "-wal")) if p.exists())

    def info(self) -> dict:
        """Counts of each table and the file's bytes per row."""
        db = self.reader()
        try:
            n = {
                t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("runs", "cells", "rowdata", "contexts", "shapes", "facts", "latest")
            }
        finally:
            db.close()
        size = self.size()
        return {
            "schema_version": ls.VERSION,
            **n,
            "bytes": size,
            "bytes_per_row": round(size / n["rowdata"], 1) if n["rowdata"] else None,
        }

    def reader(self):
        """A read-only connection of its own (close it when done)."""
        return ls.connect(self.path, readonly=True)


def _sql(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float) and math.isnan(v):
        return None  # NaN is stored as NULL; missing_reason says why
    return v
