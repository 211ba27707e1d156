"""A device's battery calibration is made where its counter moves and carried, through the ledger, to
later cells (and later runs) too short for the counter to move. The device is the local target with a
fixture sysfs tree (telemetry_root) standing in for a board's battery: no battery exists here. The
build, model, llama-bench, sampler and ledger are the real ones."""

import json

import pytest
from conftest import fixture_board_run
from test_sampler import SHELLS, Writer

from devicelab.ledger import ledger_path

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not SHELLS, reason="needs dash or busybox")]


def test_battery_calibration_carries_to_a_later_cell(tmp_path, host_build, smol_path):
    root = tmp_path / "sysfs"
    # a board idling at 8 mA whose driver says -8000: µA, discharge negative. The magnitude rule alone
    # would read 8000 mA
    w = Writer(root, rapl=False, i0=-8000, k=0, counter="charge_counter", temp_slope=0)
    w.start()
    bench = "prompt: [64], gen: [256], threads: {}, repetitions: 2"
    try:
        # 1: a cell long enough for charge_counter (whole µAh) to fall by a dozen steps
        p = fixture_board_run(tmp_path, root, "calib", bench.format([1]))
        assert p.returncode == 0, p.stdout + p.stderr
        # 2: the counter stands still from now on (as over a short cell); one new cell in the same ledger
        w.frozen = True
        p = fixture_board_run(tmp_path, root, "calib", bench.format([1, 2]))
        assert p.returncode == 0, p.stdout + p.stderr
    finally:
        w.stop.set()
        w.join()
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame()
    pw = rows[(rows.metric == "power_mean") & (rows.phase == "cell")].sort_values("row_id")
    assert len(pw) == 2, "run 2 re-ran nothing of run 1"
    first, second = (json.loads(c) for c in pw.energy_calibration)
    assert first["method"] == "charge_counter" and (first["current_unit"], first["current_sign"]) == ("uA", -1.0)
    assert second["method"] == f"device calibration (charge_counter in cell {pw.cell_id.iloc[0]})"
    assert list(pw.value) == pytest.approx([0.008 * 3.8] * 2, rel=1e-6)  # 8 mA × 3.8 V, drawn (positive)
    # every energy figure of the cell carries its calibration
    assert rows[rows.metric.isin(["energy", "power_mean"])].energy_calibration.notna().all()
