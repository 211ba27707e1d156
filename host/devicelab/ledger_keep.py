"""Keeping the lab folder bounded: the ledger compacted and vacuumed, raw artifacts pruned by a policy.

What `reparse` needs is never removed: it re-derives a done cell's rows from artifacts/<cell>/attempt-N/ where N
is the cell's attempt count (its latest attempt), so every policy keeps that folder of every done cell. A cell
that is running now is never touched (its lane is writing into its folder).

Policies (`--keep`):
  latest  (default) each cell's latest attempt, whatever its status (a failed cell's last output is what
          explains it); earlier attempts go.
  done    only the latest attempt of each done cell; folders of failed, skipped and pending cells go too.
  all     nothing is removed.
A folder under artifacts/ that is no cell of this ledger is left alone and counted."""

from __future__ import annotations

import re
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DevicelabError

POLICIES = ("latest", "done", "all")
ATTEMPT = re.compile(r"attempt-(\d+)")


@dataclass
class Pruned:
    removed: list[Path] = field(default_factory=list)
    bytes: int = 0
    kept: int = 0
    unknown: int = 0  # folders that are no cell of this ledger, left alone


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def _keeps(policy: str, status: str, attempts: int, n: int) -> bool:
    if status == "running" or policy == "all" or n > attempts:  # n > attempts: not the ledger's yet
        return True
    if n != attempts:
        return False
    return policy == "latest" or status == "done"


def prune_artifacts(db: sqlite3.Connection, artifacts: Path, policy: str = "latest", dry_run: bool = False) -> Pruned:
    """Remove the attempt folders `policy` does not keep (see the module's docstring)."""
    if policy not in POLICIES:
        raise DevicelabError(f"unknown --keep {policy!r}; available: {', '.join(POLICIES)}")
    cells = {r[0]: (r[1], r[2] or 0) for r in db.execute("SELECT cell_id, status, attempts FROM cells")}
    out = Pruned()
    if not artifacts.is_dir():
        return out
    for cdir in sorted(p for p in artifacts.iterdir() if p.is_dir()):
        if cdir.name not in cells:
            out.unknown += 1
            continue
        status, attempts = cells[cdir.name]
        for adir in sorted(p for p in cdir.iterdir() if p.is_dir()):
            m = ATTEMPT.fullmatch(adir.name)
            if not m or _keeps(policy, status, attempts, int(m[1])):
                out.kept += 1
                continue
            out.bytes += _size(adir)
            out.removed.append(adir)
            if not dry_run:
                shutil.rmtree(adir)
        if not dry_run and not any(cdir.iterdir()):
            cdir.rmdir()
    return out


def compact(db: sqlite3.Connection) -> dict[str, int]:
    """Drop what no row refers to any more (contexts of replaced rows, their facts, shapes), and latest entries
    whose cell is no longer done; one transaction."""
    db.execute("BEGIN IMMEDIATE")
    try:
        n = {}
        n["contexts"] = db.execute(
            "DELETE FROM contexts WHERE NOT EXISTS (SELECT 1 FROM rowdata r WHERE r.ctx = contexts.id)"
        ).rowcount
        n["shapes"] = db.execute(
            "DELETE FROM shapes WHERE NOT EXISTS (SELECT 1 FROM rowdata r WHERE r.shape = shapes.id)"
        ).rowcount
        from .ledger_schema import FACT_COLUMNS

        used = " UNION ".join(f"SELECT {c} FROM contexts WHERE {c} IS NOT NULL" for c in FACT_COLUMNS)
        n["facts"] = db.execute(f"DELETE FROM facts WHERE id NOT IN ({used})").rowcount
        from .ledger_schema import fill_latest

        fill_latest(db)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return n


def vacuum(db: sqlite3.Connection) -> None:
    """Rewrite the file without its free pages, fold the WAL in, refresh the planner's statistics."""
    try:
        db.execute("VACUUM")
    except sqlite3.OperationalError as e:
        raise DevicelabError(
            f"the ledger could not be vacuumed now ({e}): another devicelab has it open; "
            "run it again when nothing is running"
        ) from e
    db.execute("ANALYZE")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
