#!/usr/bin/env python3
"""Prints, measured side by side in one run: lab-built llama-bench decode t/s vs a by-hand build of the same
commit with upstream's default CMake flags (goal ≥ 0.98), and the roofline efficiency of decode on this
machine (decode t/s ÷ (measured read bandwidth ÷ bytes per token)).

The by-hand build is `cmake -S <tree> -B <dir> && cmake --build <dir> --target llama-bench` with no flags
but LLAMA_USE_PREBUILT_UI=OFF (the default ON downloads a web UI at build time, which cannot work
offline; it does not touch llama-bench) and ccache as launcher (it does not change the binary).

usage: python bench/handbuilt.py [--pairs 4] [--gen 64] [--reps 5] [--threads 2]"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from devicelab import paths
from devicelab.build import cache, payloads, source, targets
from devicelab.models import gguf_info, store
from devicelab.models.ladder import Ladder


def decode(bench: str, model: str, gen: int, reps: int, threads: int) -> float:
    out = subprocess.run(
        [bench, "-m", model, "-p", "0", "-n", str(gen), "-r", str(reps), "-t", str(threads), "-o", "jsonl"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(float(json.loads(l)["avg_ts"]) for l in out.splitlines() if l.startswith("{"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    src = source.resolve(None)
    lab = cache.ensure(src, targets.local_native())
    hand = paths.sub("builds") / f"handbuilt-{src.short}"
    env = dict(
        os.environ,
        CCACHE_BASEDIR=str(paths.home()),
        CCACHE_DIR=os.environ.get("CCACHE_DIR", str(paths.home() / "ccache")),
    )
    if not (hand / "bin" / "llama-bench").exists():
        launch = (
            ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            if shutil.which("ccache")
            else []
        )
        subprocess.run(
            ["cmake", "-S", str(src.path), "-B", str(hand), "-DLLAMA_USE_PREBUILT_UI=OFF", *launch],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            ["cmake", "--build", str(hand), "--target", "llama-bench", "-j", str(os.cpu_count() or 2)],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    lad = Ladder("smollm2-135m", store.resolve(None), lab.tool("llama-quantize"))
    q = lad.quant("q4_k_m")
    labs, hands = [], []
    for i in range(a.pairs):
        for which in ("lab", "hand") if i % 2 == 0 else ("hand", "lab"):
            b = lab.tool("llama-bench") if which == "lab" else hand / "bin" / "llama-bench"
            (labs if which == "lab" else hands).append(decode(str(b), str(q.path), a.gen, a.reps, a.threads))
    ml, mh = statistics.mean(labs), statistics.mean(hands)
    print(
        f"decode tg{a.gen} × {a.reps} reps, {a.threads} threads, q4_k_m: lab build "
        f"{ml:.1f} ± {statistics.stdev(labs):.1f} "
        f"tok/s, by-hand upstream-default build {mh:.1f} ± {statistics.stdev(hands):.1f} tok/s "
        f"(n={a.pairs} each): ratio {ml / mh:.3f} (goal ≥ 0.98)"
    )
    exe = payloads.ensure_c_payload("membw", lab)
    mb = json.loads(
        subprocess.run([str(exe), "-m", "512", "-r", "5"], capture_output=True, text=True, check=True).stdout
    )
    info = gguf_info.read(q.path)
    bytes_per_tok = q.manifest["bytes"] + info.kv_cache_bytes(1) * (a.gen / 2)
    limit = mb["read_bytes_per_s"] / bytes_per_tok
    print(
        f"roofline: read bandwidth {mb['read_bytes_per_s'] / 1e9:.1f} GB/s, FMA peak {mb['fma_flops_per_s'] / 1e9:.0f} "
        f"GFLOP/s; decode limit {limit:.0f} tok/s for {bytes_per_tok / 1e6:.0f} MB/token → efficiency "
        f"{ml / limit:.0%} (memory-bound)"
    )


if __name__ == "__main__":
    sys.exit(main())
