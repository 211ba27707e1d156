#!/usr/bin/env python3
"""Prints the wall time of a cold quickstart run and of a re-run of the unchanged recipe (goal ≤ 2%).

Cold: a fresh DEVICELAB_HOME (sdist and model downloaded from PyPI, llama.cpp configured and built —
with the existing ccache unless --no-ccache — ladder quantized, KLD base made, every cell run) and a
fresh lab folder. Re-run: the same command again.

usage: python bench/rerun.py [--recipe recipes/quickstart.yaml] [--no-ccache]"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(argv, env):
    t0 = time.time()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    dt = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return dt, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "quickstart.yaml"))
    ap.add_argument("--no-ccache", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, DEVICELAB_HOME=f"{d}/home")
        old_home = Path(os.environ.get("DEVICELAB_HOME", Path.home() / ".cache" / "devicelab"))
        if a.no_ccache:
            env["CCACHE_DISABLE"] = "1"
        else:
            env.setdefault("CCACHE_DIR", str(old_home / "ccache"))
        argv = [sys.executable, "-m", "devicelab.cli", "run", a.recipe, "--lab-dir", f"{d}/lab"]
        cold, out = timed(argv, env)
        warm, out2 = timed(argv, env)
        print(out.splitlines()[0] if out else "")
        print(out2.splitlines()[0] if out2 else "")
        print(
            f"cold run {cold:.1f} s ({'no ccache' if a.no_ccache else 'ccache-warm build'}), "
            f"re-run {warm:.2f} s: ratio {warm / cold * 100:.2f}% (goal ≤ 2%)"
        )


if __name__ == "__main__":
    main()
