"""A run killed with SIGKILL in the middle of a sweep resumes: finished cells are kept, the cut-off cell
is re-run (its stale payload stopped), and no cell is duplicated or recorded half-written."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, devicelab

from devicelab.ledger import ledger_path

pytestmark = pytest.mark.e2e
RECIPE = REPO / "tests" / "recipes" / "resume.yaml"


def states(db):
    try:
        con = sqlite3.connect(db, timeout=5)
        return dict(con.execute("SELECT status, count(*) FROM cells GROUP BY status").fetchall())
    except sqlite3.Error:
        return {}


def test_sigkill_mid_sweep_then_resume(tmp_path, host_build, smol_path):
    # ladder files first, so the kill lands in the sweep rather than in llama-quantize
    devicelab("model", "ladder", "--quants", "q8_0,q4_0,q4_k_m", check=True)
    db = ledger_path(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "devicelab.cli", "run", str(RECIPE), "--lab-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    while time.time() < deadline:
        s = states(db)
        if s.get("done", 0) >= 2 and s.get("running", 0) == 1:
            break
        if proc.poll() is not None:
            pytest.fail(f"run ended before it could be killed: {s}")
        time.sleep(0.05)
    else:
        pytest.fail("never saw a running cell")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    con = sqlite3.connect(db)
    killed = [r[0] for r in con.execute("SELECT cell_id FROM cells WHERE status='running'")]
    assert len(killed) == 1
    done_before = {r[0] for r in con.execute("SELECT cell_id FROM cells WHERE status='done'")}
    # nothing of the cut-off cell is recorded
    assert con.execute("SELECT count(*) FROM rows WHERE cell_id=?", (killed[0],)).fetchone()[0] == 0
    rows_before = con.execute("SELECT count(*) FROM rows").fetchone()[0]
    con.close()

    p = devicelab("run", RECIPE, "--lab-dir", tmp_path, check=True)
    assert f"6 cells, {len(done_before)} already done, {6 - len(done_before)} ran, 0 failed" in p.stdout
    con = sqlite3.connect(db)
    assert states(db) == {"done": 6}
    attempts = dict(con.execute("SELECT cell_id, attempts FROM cells").fetchall())
    assert attempts[killed[0]] == 2 and all(attempts[c] == 1 for c in done_before)
    # every cell has exactly one row per (test, metric, phase): no duplicates
    dup = con.execute(
        "SELECT cell_id, test, metric, phase, count(*) c FROM rows GROUP BY 1,2,3,4 HAVING c > 1"
    ).fetchall()
    assert dup == []
    per_cell = set(r[0] for r in con.execute("SELECT count(*) FROM rows GROUP BY cell_id"))
    assert len(per_cell) == 1, "every cell has the same number of rows"
    assert con.execute("SELECT count(*) FROM rows").fetchone()[0] > rows_before
    # the stale llama-bench of the killed attempt was stopped, not left competing for the CPU
    from devicelab.lab import device_from
    from devicelab.transports import open_transport

    wd = open_transport(device_from({"name": "local"})).workdir()
    pids = (Path(wd) / "cells" / killed[0] / "attempt-1" / "pids").read_text().split()
    assert len(pids) == 3
    for kv in pids:
        assert (
            not Path(f"/proc/{kv.split('=')[1]}").exists()
            or Path(f"/proc/{kv.split('=')[1]}/status").read_text().find("State:\tZ") >= 0
        ), kv
