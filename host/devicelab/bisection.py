"""`devicelab bisect`: the first llama.cpp commit that made a metric worse, found on the device where it happens.

Given a recipe (one device, a few cells), a metric and a good and a bad end — two revisions of a llama.cpp clone
(every commit between them, oldest first) or an ordered list of sources — it measures both ends, then midpoints,
until the first bad commit is next to the last good one. Each step is an ordinary run of the recipe with that
source (its cells in the ledger, keyed by the commit), so an interrupted bisect resumes and a re-run reuses what
is measured; builds go through the build cache and ccache (a git clone's revisions are checked out in one
worktree, so unchanged files are not compiled again). A step's verdict is the `compare` test against the good
end: bad when a pair of the metric is a significant regression.

A recipe with `rounds:` measures each step's candidate interleaved with the good end: both sources in one run of
that many rounds, in a seeded order each round (a study of its own, named after the recipe and the candidate), so
the step's test is paired round by round and what moved the device during the step moved both sides alike. A
step whose rounds decide neither way — no significant regression, yet one of `min_effect` or more still inside
B/A's 95 % interval — is measured in more rounds (twice as many, up to four times the recipe's) before it is
judged; one still undecided then is judged by its test as it stands, and its line says so.
Without rounds the good end is measured once and every step is compared with it."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import compare as cmpmod
from .build import source as sourcemod
from .errors import DevicelabError


@dataclass
class Revision:
    """A llama.cpp revision the bisection may measure: a candidate for the first bad one."""

    spec: str  # the source spec a run takes
    commit: str
    subject: str  # the commit's subject line (git), or the spec


@dataclass
class Step:
    candidate: Revision
    verdict: str  # good | bad | undecided (measured again in more rounds)
    ratio: float | None
    p: float | None
    note: str = ""
    rounds: int | None = None  # the rounds its paired test rested on
    ci: tuple[float, float] | None = None  # B/A's 95 % interval (the worst pair's)
    decided: bool = True  # a regression, or none of min_effect's size left inside the interval


def git_candidates(repo: Path, good: str, bad: str) -> list[Revision]:
    """The good revision, then every commit on the path from it to the bad one, oldest first."""
    repo = Path(repo).expanduser().resolve()
    _, good_c = sourcemod._git_spec(f"git:{repo}@{good}")
    _, bad_c = sourcemod._git_spec(f"git:{repo}@{bad}")
    r = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "rev-list",
            "--reverse",
            "--ancestry-path",
            "--format=%H %s",
            "--no-commit-header",
            f"{good_c}..{bad_c}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode != 0:
        raise DevicelabError(f"bisect: git rev-list {good}..{bad} failed in {repo}: {r.stderr.strip()[:200]}")
    out = [Revision(f"git:{repo}@{good_c}", good_c, _subject(repo, good_c))]
    for line in r.stdout.splitlines():
        commit, _, subject = line.partition(" ")
        out.append(Revision(f"git:{repo}@{commit}", commit, subject))
    if len(out) < 2 or out[-1].commit != bad_c:
        raise DevicelabError(f"bisect: {bad} does not descend from {good} in {repo}; give the good (older) end first")
    return out


def _subject(repo: Path, commit: str) -> str:
    r = subprocess.run(
        ["git", "-C", str(repo), "log", "-1", "--format=%s", commit], capture_output=True, text=True, timeout=30
    )
    return r.stdout.strip()


def list_candidates(specs: list[str]) -> list[Revision]:
    """An ordered list of sources (good first, bad last), e.g. releases: pypi:llama-cpp-python==X."""
    if len(specs) < 2:
        raise DevicelabError("bisect: give at least a good and a bad source, good first")
    return [Revision(s, sourcemod.commit_of(s), s) for s in specs]


def verdict(good_rows, rows, good: Revision, cand: Revision, metric: str, alpha: float, min_effect: float) -> Step:
    """`cand` against the good end on one metric: bad when any of its pairs is a significant regression."""
    a, b = (
        cmpmod.Side(f"commit={good.commit[:12]}", {"commit": good.commit}),
        cmpmod.Side(f"commit={cand.commit[:12]}", {"commit": cand.commit}),
    )
    # a step must be good or bad: one measured under other load is judged anyway, and its note says so
    cmp = cmpmod.compare(good_rows, rows, a, b, [metric], alpha, min_effect, max_busy=None)
    if not cmp.pairs:
        raise DevicelabError(
            f"bisect: no {metric} rows of {cand.commit[:12]} pair with the good end's; does the recipe measure it?"
        )
    worst = min(cmp.pairs, key=lambda p: (p.verdict != cmpmod.REGRESSION, -abs((p.ratio or 1) - 1)))
    bad = worst.verdict == cmpmod.REGRESSION
    open_ = [p for p in cmp.pairs if not _ruled_out(p, min_effect)]
    if open_ and not bad:
        worst = min(open_, key=lambda p: _worst_end(p))  # the one with most room for a regression
    busy = [p.host_busy for p in cmp.pairs if cmpmod.busy(p)]
    note = (
        f"other processes kept the host busy (good end {busy[0][0] or 0:.2f}, this {busy[0][1] or 0:.2f} CPUs): "
        "check this step on a quiet host"
        if busy
        else ""
    )
    decided = bad or not open_
    return Step(cand, "bad" if bad else "good", worst.ratio, worst.p_adj, note, worst.rounds, worst.ci, decided)


def _worst_end(p: cmpmod.Pair) -> float:
    """How bad B/A may still be inside its interval, as a number that is lower the worse (a pair with an interval)."""
    lo, hi = p.ci or (1.0, 1.0)
    return lo if cmpmod.BETTER.get(p.metric) == cmpmod.HIGHER else -hi


def _ruled_out(p: cmpmod.Pair, min_effect: float) -> bool:
    """No regression of `min_effect` or more is left inside the pair's 95 % interval (True where it cannot tell:
    no interval or no direction, which more rounds would not change)."""
    better = cmpmod.BETTER.get(p.metric)
    if p.ci is None or better is None:
        return True
    return p.ci[0] > 1 - min_effect if better == cmpmod.HIGHER else p.ci[1] < 1 + min_effect


def judge(
    cand: Revision,
    good: Revision,
    measure: Callable[[Revision, int], tuple[object, object] | None],
    metric: str,
    alpha: float,
    min_effect: float,
    on_step: Callable[[Step], None] = lambda s: None,
) -> Step:
    """`cand`'s verdict, measured again in more rounds (`measure(cand, k)`, k = 1, 2, …; None: no more to take)
    while its test decides neither way."""
    got = measure(cand, 0)
    assert got is not None
    more = 0
    while True:
        st = verdict(*got, good, cand, metric, alpha, min_effect)
        if st.decided:
            return st
        more += 1
        nxt = measure(cand, more)
        if nxt is None:
            lo, hi = st.ci or (float("nan"), float("nan"))
            st.note = "; ".join(
                x
                for x in (
                    st.note,
                    f"undecided after {st.rounds} rounds (B/A {lo:.3f}–{hi:.3f} holds a change of {min_effect:g}): "
                    f"judged {st.verdict}; measure this step again on a quieter device",
                )
                if x
            )
            return st
        on_step(dataclasses.replace(st, verdict="undecided"))
        got = nxt


def bisect(
    candidates: list[Revision],
    measure: Callable[[Revision, int], tuple[object, object] | None],
    metric: str,
    alpha: float = cmpmod.DEFAULT_ALPHA,
    min_effect: float = cmpmod.DEFAULT_MIN_EFFECT,
    on_step: Callable[[Step], None] = lambda s: None,
) -> tuple[Revision, list[Step]]:
    """Binary search over `candidates` (good first, bad last); `measure(candidate, more)` runs the recipe with its
    source and returns the good end's rows and that commit's (the good end measured once, or beside each
    candidate); `more` > 0 asks for that step in more rounds (None: it takes no more). Returns the first bad
    candidate and every step taken."""
    good, bad = candidates[0], candidates[-1]
    steps = [Step(good, "good", 1.0, None, "the good end")]
    on_step(steps[0])
    last = judge(bad, good, measure, metric, alpha, min_effect, on_step)
    steps.append(last)
    on_step(last)
    if last.verdict != "bad":
        why = f"; {last.note}" if last.note else ""
        raise DevicelabError(
            f"bisect: {bad.commit[:12]} is not significantly worse than {good.commit[:12]} on "
            f"{metric} (B/A {last.ratio:.3f}{why}): nothing to bisect"
        )
    lo, hi = 0, len(candidates) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        st = judge(candidates[mid], good, measure, metric, alpha, min_effect, on_step)
        steps.append(st)
        on_step(st)
        if st.verdict == "bad":
            hi = mid
        else:
            lo = mid
    return candidates[hi], steps
