"""The ledger's tables (schema version 2): each fact stored once, a row holding only what is its own.

A normalized row (schema.ROW_COLUMNS) splits into three parts:

- its own measurement (`rowdata`): value, stddev, n, samples, and two small integer keys;
- its shape (`shapes`, keyed by content hash): which test, phase and metric, the thread and token counts — the
  same few hundred combinations every night;
- its cell's context (`contexts`, keyed by content hash): run, cell, device, model, build, conditions — one per
  cell; its big texts (device facts, build flags, tensor types, calibration, …) are keys into `facts`, where each
  distinct text is stored once, keyed by its content hash.

The view `rows` joins them back into the wide row every consumer reads (same columns, same order, same SQLite
types as the version-1 table had), and deleting from it deletes the row. Writes and the migration from version 1
go through one path: the wide rows are put in a staging table with the version-1 column types (so every value is
stored exactly as before), then `normalize` moves them into the parts.
"""

from __future__ import annotations

import hashlib
import sqlite3

from .schema import CELL, COLUMN, OWN, ROW_COLUMNS, SHAPE, columns

VERSION = 2
# the row's own measurement, stored in rowdata itself
OWN_COLUMNS = columns(part=OWN)
# what a row says beyond its cell: repeats across cells and nights. The order the shapes table was made in and its
# content hash is taken in (ledger version 2): fixed for good, so a shape written today finds yesterday's
SHAPE_COLUMNS = (
    "test",
    "phase",
    "metric",
    "unit",
    "threads",
    "n_prompt",
    "n_gen",
    "n_depth",
    "ctx",
    "n_parallel",
    "gpu_device",
    "n_gpu_layers",
    "flash_attn",
    "missing_reason",
)
assert set(SHAPE_COLUMNS) == set(columns(part=SHAPE)), "schema.COLUMNS: a shape column needs its place here"
# big texts of a cell's context, each stored once in facts
FACT_COLUMNS = columns(part=CELL, fact=True)


def context_columns(columns=ROW_COLUMNS) -> list[str]:
    """The cell-level columns: everything that is neither the row's own nor its shape."""
    return [c for c in columns if c not in OWN_COLUMNS and c not in SHAPE_COLUMNS]


def decl(c: str) -> str:
    """A column's SQLite type, as version 1 declared it (its affinity decides how a value is stored): REAL for a
    real number, TEXT for the rest (an integer in a TEXT column is kept as its digits)."""
    col = COLUMN[c]
    return col.affinity or ("REAL" if col.type == "real" else "TEXT")


def dl_hash(*vals) -> bytes:
    """The content hash of stored values (type and value of each)."""
    h = hashlib.blake2b(digest_size=16)
    for v in vals:
        h.update(f"{type(v).__name__[0]}{v!r}\x1f".encode() if not isinstance(v, bytes) else b"b" + v + b"\x1f")
    return h.digest()


def connect(path, readonly: bool = False, timeout: float = 30) -> sqlite3.Connection:
    """A connection of its own (readers never share the writer's): WAL, full sync, the hash function."""
    if readonly:
        db = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, timeout=timeout, isolation_level=None, check_same_thread=False
        )
    else:
        db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    db.create_function("dl_hash", -1, dl_hash, deterministic=True)
    if not readonly:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
    return db


BASE = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, recipe TEXT, recipe_sha TEXT, started_at TEXT, finished_at TEXT,
  status TEXT, cells_total INTEGER, cells_run INTEGER, cells_skipped INTEGER);
CREATE TABLE IF NOT EXISTS cells (
  cell_id TEXT PRIMARY KEY, recipe TEXT, device TEXT, model TEXT, quant TEXT, payload TEXT,
  params TEXT, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, run_id TEXT,
  started_at TEXT, finished_at TEXT, artifacts TEXT, error TEXT);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


def v2_ddl(columns=ROW_COLUMNS) -> str:
    ctx = context_columns(columns)
    ctx_cols = ", ".join(f"{c} INTEGER" if c in FACT_COLUMNS else f"{c} {decl(c)}" for c in ctx)
    shape_cols = ", ".join(f"{c} {decl(c)}" for c in SHAPE_COLUMNS)
    return f"""
CREATE TABLE IF NOT EXISTS facts (id INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE, body TEXT);
CREATE TABLE IF NOT EXISTS shapes (id INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE, {shape_cols});
CREATE TABLE IF NOT EXISTS contexts (id INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE, {ctx_cols});
CREATE TABLE IF NOT EXISTS rowdata (
  row_id INTEGER PRIMARY KEY AUTOINCREMENT, ctx INTEGER NOT NULL, shape INTEGER NOT NULL,
  {", ".join(f"{c} {decl(c)}" for c in OWN_COLUMNS)});
CREATE INDEX IF NOT EXISTS rowdata_ctx ON rowdata(ctx);
CREATE INDEX IF NOT EXISTS contexts_cell ON contexts(cell_id);
CREATE INDEX IF NOT EXISTS contexts_run ON contexts(run_id);
CREATE INDEX IF NOT EXISTS contexts_device ON contexts(device, recorded_at);
CREATE INDEX IF NOT EXISTS contexts_recipe ON contexts(recipe, recorded_at);
CREATE INDEX IF NOT EXISTS contexts_recorded ON contexts(recorded_at);
CREATE TABLE IF NOT EXISTS latest (key TEXT PRIMARY KEY, cell_id TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS cells_status ON cells(status, recipe);
CREATE INDEX IF NOT EXISTS cells_run ON cells(run_id);
"""


def column_expr(c: str, facts_as_ids: bool = False) -> str:
    """The SQL expression of a wide column over rowdata r, contexts x, shapes s."""
    if c in OWN_COLUMNS:
        return f"r.{c}"
    if c in SHAPE_COLUMNS:
        return f"s.{c}"
    if c in FACT_COLUMNS and not facts_as_ids:
        return f"(SELECT body FROM facts WHERE id = x.{c})"
    return f"x.{c}"


def view_ddl(columns=ROW_COLUMNS) -> str:
    cols = ", ".join(f"{column_expr(c)} AS {c}" for c in columns)
    return f"""
DROP VIEW IF EXISTS rows;
CREATE VIEW rows AS SELECT r.row_id AS row_id, {cols}
  FROM rowdata r JOIN contexts x ON x.id = r.ctx JOIN shapes s ON s.id = r.shape;
CREATE TRIGGER rows_delete INSTEAD OF DELETE ON rows BEGIN DELETE FROM rowdata WHERE row_id = OLD.row_id; END;
"""


def stage_ddl(name: str = "stage") -> str:
    """The staging table: the version-1 rows table's columns and types, in the connection's temp database."""
    return (
        f"CREATE TEMP TABLE IF NOT EXISTS {name} (row_id INTEGER PRIMARY KEY, "
        + ", ".join(f"{c} {decl(c)}" for c in ROW_COLUMNS)
        + ")"
    )


def normalize(db: sqlite3.Connection, src: str, keep_ids: bool) -> int:
    """Move the wide rows of table `src` into facts, shapes, contexts and rowdata (inside the caller's
    transaction). keep_ids: the rows keep their row_id (a migration); else they get new ones, in src order."""
    ctx = context_columns()
    plain = [c for c in ctx if c not in FACT_COLUMNS]
    db.execute("CREATE TEMP TABLE IF NOT EXISTS dl_keys (row_id INTEGER PRIMARY KEY, ch BLOB, sh BLOB)")
    decls = ", ".join(f"{c} {decl(c)}" for c in ctx)
    db.execute(f"CREATE TEMP TABLE IF NOT EXISTS dl_ctx (ch BLOB PRIMARY KEY, {decls})")
    db.execute(
        f"INSERT INTO temp.dl_keys SELECT row_id, dl_hash({', '.join(ctx)}), "
        f"dl_hash({', '.join(SHAPE_COLUMNS)}) FROM {src}"
    )
    db.execute(
        f"INSERT INTO temp.dl_ctx SELECT k.ch, {', '.join('t.' + c for c in ctx)} "
        f"FROM {src} t JOIN temp.dl_keys k ON k.row_id = t.row_id "
        "WHERE NOT EXISTS (SELECT 1 FROM contexts WHERE hash = k.ch) GROUP BY k.ch"
    )
    union = " UNION ".join(f"SELECT {c} AS v FROM temp.dl_ctx" for c in FACT_COLUMNS)
    db.execute(f"INSERT OR IGNORE INTO facts (hash, body) SELECT dl_hash(v), v FROM ({union}) WHERE v IS NOT NULL")
    fact_ids = ", ".join(f"(SELECT id FROM facts WHERE hash = dl_hash(t.{c}))" for c in FACT_COLUMNS)
    db.execute(
        f"INSERT INTO contexts (hash, {', '.join(plain)}, {', '.join(FACT_COLUMNS)}) "
        f"SELECT t.ch, {', '.join('t.' + c for c in plain)}, {fact_ids} FROM temp.dl_ctx t"
    )
    db.execute("DELETE FROM temp.dl_ctx")
    db.execute(
        f"INSERT OR IGNORE INTO shapes (hash, {', '.join(SHAPE_COLUMNS)}) "
        f"SELECT k.sh, {', '.join('t.' + c for c in SHAPE_COLUMNS)} "
        f"FROM {src} t JOIN temp.dl_keys k ON k.row_id = t.row_id GROUP BY k.sh"
    )
    own = ", ".join(OWN_COLUMNS)
    cur = db.execute(
        f"INSERT INTO rowdata (row_id, ctx, shape, {own}) "
        f"SELECT {'t.row_id' if keep_ids else 'NULL'}, x.id, s.id, {', '.join('t.' + c for c in OWN_COLUMNS)} "
        f"FROM {src} t JOIN temp.dl_keys k ON k.row_id = t.row_id JOIN contexts x ON x.hash = k.ch "
        f"JOIN shapes s ON s.hash = k.sh ORDER BY t.row_id"
    )
    db.execute("DELETE FROM temp.dl_keys")
    return cur.rowcount


def logical_key(cell: dict) -> str:
    """What makes two cells the same measurement at another time (another commit, another model file): the
    recipe, device, model, quant, payload and its parameters. Its newest done cell is its latest."""
    parts = [cell.get(k) or "" for k in ("recipe", "device", "model", "quant", "payload", "params")]
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=12).hexdigest()


def fill_latest(db: sqlite3.Connection) -> None:
    """The latest table rebuilt from the cells: per logical key, the done cell that finished last."""
    db.execute("DELETE FROM latest")
    best: dict[str, tuple[str, str]] = {}
    for r in db.execute(
        "SELECT cell_id, recipe, device, model, quant, payload, params, finished_at FROM cells WHERE status = 'done'"
    ):
        d = dict(
            zip(("cell_id", "recipe", "device", "model", "quant", "payload", "params", "finished_at"), r, strict=True)
        )
        k = logical_key(d)
        if k not in best or (d["finished_at"] or "", d["cell_id"]) > best[k]:
            best[k] = (d["finished_at"] or "", d["cell_id"])
    db.executemany("INSERT INTO latest (key, cell_id) VALUES (?, ?)", [(k, v[1]) for k, v in best.items()])
