"""`bisect`'s rule for one step, on figures made here (the real bisect on a real build is test_bisect.py): a step
measured in rounds whose paired test decides neither way — no significant regression, yet a change of min_effect
or more still inside B/A's interval — is measured in more rounds before it is judged, never judged good because
its few rounds were noisy."""

from __future__ import annotations

import pandas as pd
import pytest

from devicelab import bisection
from devicelab.errors import DevicelabError

GOOD, BAD, MID = (bisection.Revision(f"spec-{c}", c * 40, c) for c in "abc")


def _side(commit: str, per_round: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "payload": "bench",
            "device": "phone",
            "model": "m",
            "quant": "q4_0",
            "backend": "cpu",
            "test": "tg16",
            "metric": "decode_tps",
            "unit": "tok/s",
            "run_id": "run-1",
            "build_commit": commit,
            "round": range(1, len(per_round) + 1),
            "value": per_round,
        }
    )


# the good end's decode in each round (the device heating and cooling), and a candidate at ×0.5 of it whose first
# four rounds were disturbed (one round at ×1.02): B/A 0.52, p 0.085 over those four, 0.0008 over eight
MACHINE = [100.0, 80.0, 95.0, 70.0, 90.0, 85.0, 75.0, 98.0, 88.0, 92.0, 81.0, 79.0, 96.0, 84.0, 77.0, 91.0]
SLOW = [0.30, 1.02, 0.45, 0.55] + [0.5, 0.52, 0.48, 0.5] * 3


def _measure(factors: dict[str, list[float]], cap: int, asked: list):
    def measure(c, more):
        n = 4 << more
        if n > cap:
            return None
        asked.append((c.commit[0], n))
        slowed = [m * f for m, f in zip(MACHINE, factors[c.commit[0]], strict=True)]
        return _side(GOOD.commit, MACHINE[:n]), _side(c.commit, slowed[:n])

    return measure


def test_an_undecided_step_is_measured_in_more_rounds_before_it_is_judged():
    four = bisection.verdict(*_measure({"b": SLOW}, 4, [])(BAD, 0), GOOD, BAD, "decode_tps", 0.05, 0.2)
    assert four.ratio < 0.6 and four.p > 0.05 and four.rounds == 4  # a halving, not yet significant: neither way
    assert not four.decided and four.verdict == "good" and four.ci[0] < 0.8
    asked, shown = [], []
    st = bisection.judge(BAD, GOOD, _measure({"b": SLOW}, 16, asked), "decode_tps", 0.05, 0.2, shown.append)
    assert asked == [("b", 4), ("b", 8)] and [s.verdict for s in shown] == ["undecided"]
    assert st.verdict == "bad" and st.decided and st.rounds == 8 and st.p < 0.05


def test_a_step_with_no_change_is_good_once_its_interval_rules_one_out():
    same = [1.3, 0.75, 1.0, 0.97] + [1.0, 1.01, 0.99, 1.0] * 3  # four noisy rounds: B/A's interval ≈ 0.6–1.6
    asked = []
    st = bisection.judge(MID, GOOD, _measure({"c": same}, 16, asked), "decode_tps", 0.05, 0.2)
    assert [n for _, n in asked] == [4, 8] and st.verdict == "good" and st.decided and st.ci[0] > 0.8


def test_still_undecided_at_the_last_round_it_is_judged_and_says_so():
    st = bisection.judge(BAD, GOOD, _measure({"b": SLOW}, 4, []), "decode_tps", 0.05, 0.2)
    assert st.verdict == "good" and not st.decided and "undecided after 4 rounds" in st.note
    with pytest.raises(DevicelabError, match="nothing to bisect") as e:
        bisection.bisect([GOOD, MID, BAD], _measure({"b": SLOW, "c": SLOW}, 4, []), "decode_tps", 0.05, 0.2)
    assert "undecided after 4 rounds" in str(e.value) and "\n" not in str(e.value)
