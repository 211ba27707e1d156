"""`devicelab reparse` rebuilds every done cell's rows from its stored artifacts with today's parsers: on a
real run it reproduces the recorded rows exactly; a cell whose artifacts no longer parse keeps its rows."""

import sqlite3

import pandas as pd
import pytest
from conftest import devicelab

from devicelab.ledger import ledger_path

pytestmark = pytest.mark.e2e

RECIPE = """name: reparse
devices: [local]
models: [{name: smollm2-135m}]
quants: [q8_0, q4_0]
payloads:
  - {kind: bench, prompt: [16], gen: [8], threads: [1], repetitions: 2}
  - {kind: kld, ctx: 128, chunks: 2}
  - {kind: membw, mib: 16, repetitions: 1}
recommend: {context: 512, max_kld_mean: 1, max_ppl_ratio: 2, min_decode_tps: 0.1}
"""


def rows(db) -> pd.DataFrame:
    df = pd.read_sql_query("SELECT * FROM rows", sqlite3.connect(db)).drop(columns=["row_id"])
    return df.sort_values(["cell_id", "phase", "test", "metric"]).reset_index(drop=True)


def test_reparse_reproduces_a_real_run_exactly(tmp_path, host_build, smol_path):
    r = tmp_path / "r.yaml"
    r.write_text(RECIPE)
    lab = tmp_path / "lab"
    devicelab("run", r, "--lab-dir", lab, check=True)
    db = ledger_path(lab)
    before = rows(db)
    assert len(before) > 50 and set(before.payload) == {"bench", "kld", "membw"}
    con = sqlite3.connect(db)
    con.execute("DELETE FROM rows")  # nothing left but the artifacts
    con.commit()
    p = devicelab("reparse", "--lab-dir", lab, check=True)
    assert "of 5 cells" in p.stdout
    after = rows(db)
    pd.testing.assert_frame_equal(before, after)

    # a cell whose stored output no longer parses is said, and keeps the rows it has
    cid = con.execute("SELECT cell_id, attempts FROM cells WHERE payload='bench' LIMIT 1").fetchone()
    (lab / "artifacts" / cid[0] / f"attempt-{cid[1]}" / "stdout.tsv").write_text("garbage\n")
    p = devicelab("reparse", "--lab-dir", lab, check=True)
    assert f"not re-derived: {cid[0]}" in p.stderr and "llama-bench printed no result line" in p.stderr
    assert "of 4 cells" in p.stdout
    pd.testing.assert_frame_equal(before, rows(db))
