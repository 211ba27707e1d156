"""The thermal protocol of a run, end to end: the idle baseline taken at first contact and kept in the
ledger, the bounded wait before each cell until the hottest zone is back within cooldown_delta_c of it,
and a wait that times out said in the row and on stderr. The device is the local target with a fixture
thermal zone (telemetry_root) that a thread heats and cools: this VM has no thermal zones. The build,
model, llama-bench and ledger are the real ones."""

import threading
import time

import pytest
from conftest import fixture_board_run

from devicelab.ledger import ledger_path

pytestmark = pytest.mark.e2e


class Zone(threading.Thread):
    """One thermal zone (m°C) following temp(t), t in seconds since set()."""

    def __init__(self, root):
        super().__init__(daemon=True)
        d = root / "sys/class/thermal/thermal_zone0"
        d.mkdir(parents=True)
        (d / "type").write_text("cpu-thermal\n")
        self.f, self.stop = d / "temp", threading.Event()
        self.lock = threading.Lock()  # set() on the test's thread, run() on this one: one temp.tmp
        self.set(lambda t: 40.0)

    def set(self, fn):
        with self.lock:
            self.fn, self.t0 = fn, time.monotonic()
        self._write()

    def _write(self):
        with self.lock:
            tmp = self.f.with_name("temp.tmp")
            tmp.write_text(f"{int(self.fn(time.monotonic() - self.t0) * 1000)}\n")
            tmp.replace(self.f)

    def run(self):
        while not self.stop.is_set():
            self._write()
            time.sleep(0.05)


def test_baseline_kept_wait_until_cool_and_a_bounded_wait(tmp_path, host_build, smol_path):
    root = tmp_path / "sysfs"
    zone = Zone(root)
    zone.start()
    run = lambda threads, timeout: fixture_board_run(
        tmp_path,
        root,
        "thermal",
        f"prompt: [8], gen: [4], threads: {threads}, repetitions: 1",
        f"telemetry: {{cooldown_delta_c: 3, cooldown_timeout_s: {timeout}}}\n",
    )
    try:
        a = run([1], 120)  # idle at 40 °C: the baseline
        zone.set(lambda t: max(41.0, 50.0 - 0.6 * t))  # warm (50 °C) at the next run's first contact, cooling
        b = run([1, 2], 120)
        zone.set(lambda t: 60.0)  # hot and staying hot
        c = run([1, 2, 3], 3)
    finally:
        zone.stop.set()
        zone.join()
    for p in (a, b, c):
        assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame()
    wait = rows[rows.metric == "cooldown_wait"].sort_values("row_id")
    base = rows[rows.metric == "temp_baseline"].sort_values("row_id")
    assert len(wait) == 3, "each run ran only its new cell"
    # every cell measured against the idle baseline of the first contact, not the warm device's
    assert list(base.value) == [40.0, 40.0, 40.0]
    assert "board: idle baseline 40.0 °C" in b.stderr + b.stdout and "(now 4" in b.stderr + b.stdout
    (wa, ta), (wb, tb), (wc, tc) = zip(wait.value, wait.test, strict=True)
    assert wa < 1 and ta.startswith("reached 40.0 °C (baseline 40.0 °C + 3)")
    # run b waited until the zone fell to 43 °C: ~12 s after its first contact at ~50 °C
    assert 4 < wb < 60 and tb.startswith("reached 4") and float(tb.split()[1]) <= 43.0
    # run c gave up after its 3 s bound, measured warm, and said so
    assert 3 <= wc < 10 and tc == "timed out at 60.0 °C (baseline 40.0 °C + 3)"
    assert "warning: board still at 60.0 °C" in c.stderr + c.stdout
    # the cell's own temperatures record that it ran warm
    starts = rows[rows.metric == "temp_start"].sort_values("row_id").value
    assert starts.iloc[-1] == 60.0
