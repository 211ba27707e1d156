#!/usr/bin/env python3
"""Prints, measured side by side in one run:
  1. the sampler's own CPU cost (sampler.sh on this machine, payload = sleep) at 10 Hz and 50 Hz;
  2. instrumented vs bare llama-bench decode t/s (goal ≥ 0.99), alternating bare/instrumented runs.

usage: python bench/overhead.py [--pairs 4] [--gen 64] [--reps 5] [--threads 1,2]
Uses the cached local build and the SmolLM2 q4_k_m from the quickstart's ladder (made if missing)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from devicelab import paths
from devicelab.build import cache, source, targets
from devicelab.models import store
from devicelab.models.ladder import Ladder


def sampler_cost(shell: list[str], interval_ms: int, seconds: float) -> tuple[float, float]:
    """CPU seconds per wall second (fraction of one core) spent by sampler.sh and its children."""
    with tempfile.TemporaryDirectory() as d:
        payload = subprocess.Popen(["sleep", str(seconds)])
        t0 = time.time()
        sp = subprocess.Popen([*shell, str(paths.device_payloads_dir() / "sampler.sh"), "-o", f"{d}/t.csv",
                               "-p", str(payload.pid), "-i", str(interval_ms)])
        _, status, ru = os.wait4(sp.pid, 0)
        wall = time.time() - t0
        payload.wait()
        ticks = sum(1 for l in open(f"{d}/t.csv") if l[:1].isdigit())
    cpu = ru.ru_utime + ru.ru_stime   # includes the waited-for children (the per-tick sleep)
    return cpu / wall, ticks / wall


def decode_tps(argv: list[str]) -> float:
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        line = line.split("\t", 1)[-1]
        if line.startswith("{"):
            rec = json.loads(line)
            if rec["n_gen"]:
                return float(rec["avg_ts"])
    raise RuntimeError("no decode row")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--sampler-seconds", type=float, default=10)
    a = ap.parse_args()

    import shutil
    for shell in (["dash"], ["busybox", "sh"], ["bash"]):
        if not shutil.which(shell[0]):
            continue
        for hz in (10, 50):
            frac, rate = sampler_cost(shell, 1000 // hz, a.sampler_seconds)
            print(f"sampler cost under {' '.join(shell):10s} at {hz} Hz: {frac * 100:.2f}% of one core "
                  f"(achieved {rate:.1f} ticks/s)")

    src = source.resolve(None)
    b = cache.ensure(src, targets.local_native())
    lad = Ladder("smollm2-135m", store.resolve(None), b.tool("llama-quantize"))
    model = str(lad.quant("q4_k_m").path)
    runner = str(paths.device_payloads_dir() / "run_payload.sh")
    for t in a.threads.split(","):
        bench = [str(b.tool("llama-bench")), "-m", model, "-p", "0", "-n", str(a.gen), "-r", str(a.reps),
                 "-t", t, "-o", "jsonl"]
        bare, inst = [], []
        with tempfile.TemporaryDirectory() as d:
            for i in range(a.pairs):
                # alternate the order so drift affects both equally
                order = (("bare", "inst") if i % 2 == 0 else ("inst", "bare"))
                for kind in order:
                    if kind == "bare":
                        bare.append(decode_tps(bench))
                    else:
                        out = f"{d}/cell{i}"
                        subprocess.run(["sh", runner, out, "100", "/", "--", *bench], check=True,
                                       stdout=subprocess.DEVNULL)
                        inst.append(decode_tps(["cat", f"{out}/stdout.tsv"]))
        mb, mi = statistics.mean(bare), statistics.mean(inst)
        sb, si = statistics.stdev(bare), statistics.stdev(inst)
        print(f"threads={t}: bare decode {mb:.1f} ± {sb:.1f} tok/s, instrumented {mi:.1f} ± {si:.1f} tok/s "
              f"(n={a.pairs} each, tg{a.gen} × {a.reps} reps): ratio {mi / mb:.3f} (goal ≥ 0.99)")


if __name__ == "__main__":
    sys.exit(main())
