"""Opening a ledger file: create it at the current schema, or migrate an older one in place.

A version-1 ledger (one wide `rows` table, every fact repeated per row) is migrated on first open:

1. a copy first: `ledger.sqlite.bak-1`, made with SQLite's backup API (consistent even with a WAL beside it),
   written under a temporary name and renamed, so a copy that exists is whole; an existing copy is kept;
2. one transaction: the wide rows are normalized (ledger_schema.normalize, keeping their row ids), the old table
   is dropped, the `rows` view takes its place, `meta.schema_version` becomes 2. Cut anywhere, SQLite rolls the
   transaction back and the file is still version 1: the next open starts the migration again (resumable);
3. then VACUUM, so the file shrinks to its new size (skipped, and said, if another process holds the file).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

from . import ledger_schema as ls
from .schema import ROW_COLUMNS

CUT_ENV = "DEVICELAB_LEDGER_CUT"  # tests: a point name where the migration process dies (simulating a cut)


def _cut(point: str) -> None:
    if os.environ.get(CUT_ENV) == point:
        os._exit(9)


def _script(db: sqlite3.Connection, ddl: str) -> None:
    """DDL statements one by one (executescript would commit the open transaction)."""
    buf = ""
    for part in ddl.split(";"):
        buf += part
        if sqlite3.complete_statement(buf + ";"):
            if buf.strip():
                db.execute(buf)
            buf = ""
        else:
            buf += ";"


def version(db: sqlite3.Connection) -> int | None:
    """The file's schema version: None for an empty file."""
    r = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() if _has(db, "meta") else None
    if r:
        return int(r[0])
    t = db.execute("SELECT type FROM sqlite_master WHERE name = 'rows'").fetchone()
    return 1 if t and t[0] == "table" else None


def _has(db, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


def open_schema(db: sqlite3.Connection, path: Path, say=None) -> None:
    """Bring the file at `path` (open as `db`) to the current schema."""
    v = version(db)
    if v == ls.VERSION:
        _add_new_columns(db)
        return
    if v == 1:
        migrate(db, path, say)
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        if version(db) is None:  # another process may have created it meanwhile
            _script(db, ls.BASE + ls.v2_ddl() + ls.view_ddl())
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(ls.VERSION),))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    if version(db) == 1:
        migrate(db, path, say)


def backup_path(path: Path, v: int = 1) -> Path:
    return path.with_name(f"{path.name}.bak-{v}")


def _backup(db: sqlite3.Connection, path: Path) -> Path:
    bak = backup_path(path)
    if bak.exists():
        return bak  # a cut migration's copy: whole (renamed into place), and still the original
    tmp = bak.with_name(f"{bak.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    dst = sqlite3.connect(tmp)
    try:
        db.backup(dst)
    finally:
        dst.close()
    os.replace(tmp, bak)
    return bak


def migrate(db: sqlite3.Connection, path: Path, say=None) -> None:
    """Version 1 → 2, in place (see the module's docstring)."""
    say = say or (lambda m: print(m, file=sys.stderr))
    bak = _backup(db, path)
    _cut("after-backup")
    db.execute("BEGIN IMMEDIATE")
    try:
        if version(db) != 1:  # another process migrated it while this one waited
            db.execute("COMMIT")
            return
        n = _migrate_in_transaction(db)
        _cut("before-commit")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    say(f"ledger {path.name}: migrated {n} rows to schema version {ls.VERSION} (the old file is kept as {bak.name})")
    try:
        db.execute("VACUUM")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError as e:
        say(f"ledger {path.name}: not vacuumed now ({e}); `devicelab ledger vacuum` shrinks it later")


def _migrate_in_transaction(db: sqlite3.Connection) -> int:
    _script(db, ls.BASE)
    have = {r[1] for r in db.execute("PRAGMA table_info(rows)")}
    for c in ROW_COLUMNS:  # a ledger of an older devicelab still: its rows gain the new columns first
        if c not in have:
            db.execute(f"ALTER TABLE rows ADD COLUMN {c} {ls.decl(c)}")
    seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'rows'").fetchone()
    _script(db, ls.v2_ddl())
    n = ls.normalize(db, "main.rows", keep_ids=True)
    _cut("after-normalize")
    db.execute("DROP TABLE rows")
    _script(db, ls.view_ddl())
    if seq:  # row ids are never reused, as before
        db.execute("INSERT OR IGNORE INTO sqlite_sequence (name, seq) VALUES ('rowdata', 0)")
        db.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'rowdata'", (seq[0],))
    db.execute("DELETE FROM sqlite_sequence WHERE name = 'rows'")
    ls.fill_latest(db)
    db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(ls.VERSION),))
    return n


def _add_new_columns(db: sqlite3.Connection) -> None:
    """A column added to schema.ROW_COLUMNS since the file was written: contexts gain it, the view is remade."""
    have = {r[1] for r in db.execute("PRAGMA table_info(contexts)")}
    new = [c for c in ls.context_columns() if c not in have]
    if not new:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        have = {r[1] for r in db.execute("PRAGMA table_info(contexts)")}
        for c in [c for c in ls.context_columns() if c not in have]:
            db.execute(f"ALTER TABLE contexts ADD COLUMN {c} {'INTEGER' if c in ls.FACT_COLUMNS else ls.decl(c)}")
        _script(db, ls.view_ddl())
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
