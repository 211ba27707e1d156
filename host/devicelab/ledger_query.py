"""Reading the ledger's rows: what a command asks, selected in SQLite, the wide frame built from the parts.

The filters run in the database over indexed cell-level columns (contexts: run, cell, device, recipe,
recorded_at; the `latest` table), so a command on the latest run reads that run's rows, not the lab's history.
Only the asked columns are pulled; each big fact (device facts, build flags, tensor types, …) is read once per
distinct value and shared by the rows that hold it, so the frame costs what its rows do."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from . import ledger_schema as ls
from .errors import DevicelabError
from .schema import ROW_COLUMNS, columns

INT_COLUMNS = columns(type="int")
# a real number in a column ledger version 1 declared TEXT (cpu_quota) comes back as its digits: converted here
REAL_AS_TEXT = tuple(c for c in columns(type="real") if ls.decl(c) == "TEXT")
BOOL_COLUMNS = columns(type="bool")
# the cell-level text columns `match` may select on (stored as written, so SQL equality is the text's)
MATCHABLE = columns(match=True)
BOOL_TEXTS = {"1": True, "0": False, 1: True, 0: False, "True": True, "False": False}


@dataclass
class Selection:
    """Which rows and columns a reader wants (see Ledger.rows_frame)."""

    recipe: str | None = None
    done_only: bool = True
    run: str | None = None
    device: str | Iterable[str] | None = None
    since: str | None = None
    latest: bool = False
    columns: Iterable[str] | None = None
    # column -> (value, prefix?): rows whose text equals the value (or starts with it); cell-level text columns
    match: dict[str, tuple[str, bool]] | None = None

    def wanted(self) -> list[str]:
        if self.columns is None:
            return list(ROW_COLUMNS)
        want = set(self.columns)
        unknown = want - set(ROW_COLUMNS) - {"row_id"}
        if unknown:
            raise DevicelabError(
                f"unknown row column(s) {', '.join(sorted(unknown))}; the columns are {', '.join(ROW_COLUMNS)}"
            )
        return [c for c in ROW_COLUMNS if c in want]


def since_bound(since: str, now: float | None = None) -> str:
    """'30d' / '12h' → that long before now; an ISO date or time as given; as recorded_at is written (UTC)."""
    m = re.fullmatch(r"\s*(\d+)\s*([dhw])\s*", since)
    if m:
        secs = int(m[1]) * {"d": 86400, "h": 3600, "w": 7 * 86400}[m[2]]
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((now or time.time()) - secs))
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}(:\d{2})?)?Z?)?", since.strip()):
        raise DevicelabError(
            f"--since {since!r}: give a date (2026-11-04), a time (2026-11-04T18:00) or an age (30d, 12h, 2w)"
        )
    return since.strip().replace(" ", "T")


def latest_run(db: sqlite3.Connection, recipe: str | None) -> str | None:
    """The run that recorded last (of this recipe): its newest row's run."""
    q = "SELECT run_id FROM contexts" + (" WHERE recipe = ?" if recipe else "") + " ORDER BY recorded_at DESC LIMIT 1"
    r = db.execute(q, (recipe,) if recipe else ()).fetchone()
    return r[0] if r else None


def where(db: sqlite3.Connection, sel: Selection) -> tuple[list[str], list, bool]:
    """The conditions, their arguments, and whether they select a small part (drive from contexts)."""
    conds: list[str] = []
    args: list[str | None] = []  # the run None where there is none yet: nothing matches
    narrow = False
    if sel.done_only:
        conds.append("c.status = 'done'")
    if sel.recipe:
        conds.append("x.recipe = ?")
        args.append(sel.recipe)
    run = latest_run(db, sel.recipe) if sel.run == "latest" else sel.run
    if sel.run:
        conds.append("x.run_id = ?")
        args.append(run)
        narrow = True
    if sel.device:
        devs = [sel.device] if isinstance(sel.device, str) else list(sel.device)
        conds.append(f"x.device IN ({', '.join('?' for _ in devs)})")
        args.extend(devs)
        narrow = True
    if sel.since:
        conds.append("x.recorded_at >= ?")
        args.append(since_bound(sel.since))
        narrow = True
    if sel.latest:
        conds.append("x.cell_id IN (SELECT cell_id FROM latest)")
        narrow = True
    for col, (val, prefix) in (sel.match or {}).items():
        if col not in MATCHABLE:
            raise DevicelabError(f"cannot select rows on {col!r} in the ledger; on: {', '.join(MATCHABLE)}")
        if prefix:  # starts with: a range, so an index on the column serves it
            conds.append(f"x.{col} >= ? AND x.{col} < ?")
            args += [val, val + "\U0010ffff"]
        else:
            conds.append(f"x.{col} = ?")
            args.append(val)
        narrow = True  # a few cells' rows: from the contexts that match to their rows
    return conds, args, narrow


def query(db: sqlite3.Connection, sel: Selection) -> tuple[str, list, list[str]]:
    cols = sel.wanted()
    exprs = ", ".join(f"{ls.column_expr(c, facts_as_ids=True)} AS {c}" for c in cols)
    conds, args, narrow = where(db, sel)
    # narrow: from the selected contexts to their rows (CROSS JOIN keeps SQLite to that order); else in row order
    src = "contexts x CROSS JOIN rowdata r ON r.ctx = x.id" if narrow else "rowdata r JOIN contexts x ON x.id = r.ctx"
    q = (
        f"SELECT r.row_id AS row_id{', ' if cols else ''}{exprs} FROM {src} JOIN shapes s ON s.id = r.shape "
        "JOIN cells c ON c.cell_id = x.cell_id"
        + (" WHERE " + " AND ".join(conds) if conds else "")
        + " ORDER BY r.row_id"
    )
    return q, args, cols


def _facts(db: sqlite3.Connection, ids) -> np.ndarray:
    """Fact ids → their texts (an object array; None where there is none), each text read once."""
    import pandas as pd

    codes, uniq = pd.factorize(ids)
    bodies: dict[int, str] = {}
    u = [int(v) for v in uniq]
    for i in range(0, len(u), 500):
        part = u[i : i + 500]
        bodies.update(db.execute(f"SELECT id, body FROM facts WHERE id IN ({', '.join('?' for _ in part)})", part))
    lookup = np.array([bodies.get(v) for v in u] + [None], dtype=object)
    return lookup[codes]  # code -1 (no fact) takes the last: None


def frame(db: sqlite3.Connection, sel: Selection):
    import pandas as pd

    q, args, cols = query(db, sel)
    df = pd.read_sql_query(q, db, params=args)
    for c in cols:
        if c in ls.FACT_COLUMNS:
            df[c] = _facts(db, df[c].to_numpy())
    for c in INT_COLUMNS:
        if c in df.columns:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    for c in REAL_AS_TEXT:
        if c in df.columns:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    for c in BOOL_COLUMNS:
        if c in df.columns:
            df[c] = df[c].map(BOOL_TEXTS)
    return df


def filter_frame(df, sel: Selection):
    """The same selection over a table read from a file (`--from`): run, device, since, recipe, columns; a file
    holds what was exported (for `latest`, what the export selected)."""
    if sel.recipe and "recipe" in df.columns:
        df = df[df["recipe"] == sel.recipe]
    if sel.run and sel.run != "latest" and "run_id" in df.columns:
        df = df[df["run_id"] == sel.run]
    if sel.run == "latest" and "run_id" in df.columns and "recorded_at" in df.columns and len(df):
        df = df[df["run_id"] == df.loc[df["recorded_at"].astype(str).idxmax(), "run_id"]]
    if sel.device and "device" in df.columns:
        df = df[df["device"].isin([sel.device] if isinstance(sel.device, str) else list(sel.device))]
    if sel.since and "recorded_at" in df.columns:
        df = df[df["recorded_at"].astype(str) >= since_bound(sel.since)]
    if sel.columns is not None:
        df = df[[c for c in ["row_id", *sel.wanted()] if c in df.columns]]
    return df
