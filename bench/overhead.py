#!/usr/bin/env python3
"""Prints, measured side by side in one run:
  1. the sampler's own CPU cost (sampler.sh on this machine, payload = sleep) at 10 Hz and 50 Hz;
  2. instrumented vs bare llama-bench decode t/s (goal ≥ 0.99), alternating bare/instrumented runs;
  3. with --lane: the same ratio where "instrumented" is a whole `devicelab run` of one bench cell on the
     local device while another lane is busy beside it (an SSH board in its own network namespace behind a
     tbf-shaped link: its model push, then its payload — a sleep standing in for a device busy elsewhere,
     since this "board" is this machine's own CPUs; that cell records a failure, as it prints no result),
     as a mean of paired ratios with a 95 % confidence interval.

usage: python bench/overhead.py [--pairs 4] [--gen 64] [--reps 5] [--threads 1,2] [--sampler-only]
       python bench/overhead.py --lane [--pairs 30] [--threads 1]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from adbd_peer import android_userland

from devicelab import paths
from devicelab.build import cache, source, targets
from devicelab.models import store
from devicelab.models.ladder import Ladder


def phone_tree(root: str) -> str:
    """A fixture sysfs the size of a phone's: one battery (7 counters), 40 thermal zones, 3 cpufreq
    policies over 8 CPUs, one hwmon with 3 rails. Regular files, not sysfs: the kernel work behind a real
    attribute read (a sensor on I2C, say) is not in this figure."""

    def w(path, v):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(f"{v}\n")

    b = f"{root}/sys/class/power_supply/battery"
    for k, v in (
        ("type", "Battery"),
        ("status", "Discharging"),
        ("current_now", -412000),
        ("voltage_now", 3871000),
        ("capacity", 78),
        ("temp", 301),
        ("charge_counter", 2875000),
    ):
        w(f"{b}/{k}", v)
    for i in range(40):
        w(f"{root}/sys/class/thermal/thermal_zone{i}/type", f"zone{i}")
        w(f"{root}/sys/class/thermal/thermal_zone{i}/temp", 35000 + 100 * i)
    for pol, cpus in (("policy0", "0 1 2 3"), ("policy4", "4 5 6"), ("policy7", "7")):
        for k, v in (("related_cpus", cpus), ("scaling_cur_freq", 1800000), ("cpuinfo_max_freq", 2400000)):
            w(f"{root}/sys/devices/system/cpu/cpufreq/{pol}/{k}", v)
    for ch in (1, 2, 3):
        w(f"{root}/sys/class/hwmon/hwmon0/curr{ch}_input", 300 * ch)
        w(f"{root}/sys/class/hwmon/hwmon0/in{ch}_input", 5000)
    w(f"{root}/sys/class/hwmon/hwmon0/name", "ina3221")
    return root


def sampler_cost(shell: list[str], interval_ms: int, seconds: float, extra=()) -> tuple[float, float, str]:
    """CPU seconds per wall second (fraction of one core) spent by sampler.sh and its children, the tick rate
    it achieved, and how it paced itself ('# pace' line)."""
    with tempfile.TemporaryDirectory() as d:
        payload = subprocess.Popen(["sleep", str(seconds)])
        t0 = time.time()
        sp = subprocess.Popen(
            [
                *shell,
                str(paths.device_payloads_dir() / "sampler.sh"),
                "-o",
                f"{d}/t.csv",
                "-p",
                str(payload.pid),
                "-i",
                str(interval_ms),
                *extra,
            ]
        )
        _, status, ru = os.wait4(sp.pid, 0)
        wall = time.time() - t0
        payload.wait()
        text = Path(f"{d}/t.csv").read_text().splitlines()
        ticks = sum(1 for l in text if l[:1].isdigit())
        pace = next((l[len("# pace ") :] for l in text if l.startswith("# pace ")), "?")
    cpu = ru.ru_utime + ru.ru_stime  # includes the waited-for children (the per-tick sleep)
    return cpu / wall, ticks / wall, pace


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
    ap.add_argument("--sampler-only", action="store_true", help="skip the llama-bench decode ratio")
    ap.add_argument("--lane", action="store_true", help="only the lab run beside a busy lane vs bare decode")
    ap.add_argument("--rate", default="30mbit", help="--lane: the busy board's link")
    ap.add_argument("--alone", action="store_true", help="--lane without the board: the local device's lane only")
    a = ap.parse_args()
    if a.lane:
        return lane_ratio(a)

    import shutil

    # as deployed: started by `sh` (dash here), the sampler moves itself to a shell with `read -t`;
    # then each shell kept with -S, dash's own `sleep`-per-tick pacing included (a device with no other shell)
    runs = [
        ("sh (as run_payload.sh starts it)", ["sh"], ()),
        ("sh, shell reads (no awk)", ["env", "DEVICELAB_SAMPLER_NO_AWK=1", "sh"], ()),
    ] + [
        (f"{' '.join(sh)} -S (stays)", sh, ("-S",))
        for sh in (["dash"], ["busybox", "sh"], ["mksh"], ["bash"])
        if shutil.which(sh[0])
    ]
    android = tempfile.mkdtemp(prefix="android-bin-")
    if shutil.which("mksh") and shutil.which("toybox"):
        # Android's userland: mksh as sh, toybox's applets the only commands (Debian's toybox: no awk)
        android_userland(Path(android))
        runs.append(("mksh + toybox only (Android-like)", ["env", f"PATH={android}", f"{android}/sh"], ()))
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as fx:
        trees = [("this machine's /sys", ()), ("phone-sized fixture tree", ("-R", phone_tree(fx)))]
        for tree, root in trees:
            print(f"-- {tree}")
            for label, shell, extra in runs:
                for hz in (10, 50):
                    frac, rate, pace = sampler_cost(shell, 1000 // hz, a.sampler_seconds, (*extra, *root))
                    print(
                        f"sampler cost, {label:32s} at {hz} Hz: {frac * 100:.2f}% of one core "
                        f"(achieved {rate:.1f} ticks/s; pace {pace})"
                    )
    shutil.rmtree(android)
    if a.sampler_only:
        return

    src = source.resolve(None)
    b = cache.ensure(src, targets.local_native())
    lad = Ladder("smollm2-135m", store.resolve(None), b.tool("llama-quantize"))
    model = str(lad.quant("q4_k_m").path)
    runner = str(paths.device_payloads_dir() / "run_payload.sh")
    for t in a.threads.split(","):
        bench = [
            str(b.tool("llama-bench")),
            "-m",
            model,
            "-p",
            "0",
            "-n",
            str(a.gen),
            "-r",
            str(a.reps),
            "-t",
            t,
            "-o",
            "jsonl",
        ]
        bare, inst = [], []
        with tempfile.TemporaryDirectory() as d:
            for i in range(a.pairs):
                # alternate the order so drift affects both equally
                order = ("bare", "inst") if i % 2 == 0 else ("inst", "bare")
                for kind in order:
                    if kind == "bare":
                        bare.append(decode_tps(bench))
                    else:
                        out = f"{d}/cell{i}"
                        subprocess.run(
                            ["sh", runner, out, "100", "/", "--", *bench], check=True, stdout=subprocess.DEVNULL
                        )
                        inst.append(decode_tps(["cat", f"{out}/stdout.tsv"]))
        mb, mi = statistics.mean(bare), statistics.mean(inst)
        sb, si = statistics.stdev(bare), statistics.stdev(inst)
        print(
            f"threads={t}: bare decode {mb:.1f} ± {sb:.1f} tok/s, instrumented {mi:.1f} ± {si:.1f} tok/s "
            f"(n={a.pairs} each, tg{a.gen} × {a.reps} reps): ratio {mi / mb:.3f} (goal ≥ 0.99)"
        )


LANE_RECIPE = """name: overhead-{i}
devices: [{devices}]
models: [{{name: smollm2-135m}}]
quants: [q4_k_m]
payloads:
  - {{kind: bench, prompt: [0], gen: [{gen}], threads: [{t}], repetitions: {reps}}}
"""


def lane_ratio(a) -> None:
    """Bare llama-bench decode vs the local device's decode in a `devicelab run` while the board's lane is
    busy beside it (pushing its model over a shaped link); pairs alternate their order."""
    from sshd_peer import Netns, Sshd

    from devicelab.ledger import Ledger, ledger_path
    from devicelab.runner.lane import Events
    from devicelab.runner.orchestrator import Orchestrator

    src = source.resolve(None)
    b = cache.ensure(src, targets.local_native())
    model = str(Ladder("smollm2-135m", store.resolve(None), b.tool("llama-quantize")).quant("q4_k_m").path)
    ns = Netns()
    if not ns.create():
        raise SystemExit("cannot create a network namespace here (needs root and iproute2)")
    tbf = ["tbf", "rate", a.rate, "burst", "256kb", "latency", "100ms"]
    subprocess.run(["tc", "qdisc", "add", "dev", ns.host_if, "root", *tbf], check=True)
    with tempfile.TemporaryDirectory(prefix="dl-overhead-") as d:
        sleeper = Path(d) / "busy-elsewhere"
        sleeper.write_text("#!/bin/sh\nsleep 15\n")  # the board's payload: its device busy, not this CPU
        sleeper.chmod(0o755)
        sshd = Sshd(Path(d) / "sshd", netns=ns).start()
        try:
            for t in a.threads.split(","):
                ratios, busy = [], 0
                for i in range(a.pairs):
                    bench = [
                        str(b.tool("llama-bench")),
                        "-m",
                        model,
                        "-p",
                        "0",
                        "-n",
                        str(a.gen),
                        "-r",
                        str(a.reps),
                        "-t",
                        t,
                        "-o",
                        "jsonl",
                    ]
                    got = {}
                    for kind in ("bare", "lab") if i % 2 == 0 else ("lab", "bare"):
                        if kind == "bare":
                            got[kind] = decode_tps(bench)
                            continue
                        w = Path(d) / f"{t}-{i}"
                        w.mkdir()
                        lab = w / "lab.yaml"
                        lab.write_text(
                            sshd.lab_yaml("board", f"    exec_prefix: [{sleeper}]\n").replace(
                                f"{sshd.d}/device-workdir", f"{w}/board"
                            )
                        )
                        r = w / "r.yaml"
                        r.write_text(
                            LANE_RECIPE.format(
                                i=i, gen=a.gen, t=t, reps=a.reps, devices="local" if a.alone else "local, board"
                            )
                        )
                        Orchestrator(r, lab, w / "lab", events=Events()).run()
                        rows = Ledger(ledger_path(w / "lab")).rows_frame()
                        loc = rows[(rows.device == "local") & (rows.metric == "decode_tps")]
                        got[kind] = float(loc.value.iloc[0])
                        act = str(loc.host_activity.iloc[0] or "")
                        busy += "board" in act  # the board's lane was busy during the local cell
                    ratios.append(got["lab"] / got["bare"])
                m, sd = statistics.mean(ratios), statistics.stdev(ratios)
                from scipy import stats  # Student's t: the pairs are few

                half = float(stats.t.ppf(0.975, len(ratios) - 1)) * sd / len(ratios) ** 0.5
                beside = "alone (no other lane)" if a.alone else "beside a busy lane"
                print(
                    f"threads={t}: lab run {beside} ÷ bare decode = {m:.3f}, 95 % CI "
                    f"[{m - half:.3f}, {m + half:.3f}] over {len(ratios)} alternating pairs (pair sd {sd:.3f}); "
                    f"the board's lane was busy during {busy} of the {len(ratios)} local cells "
                    f"(tg{a.gen} × {a.reps} reps; goal ≥ 0.99)",
                    flush=True,
                )
        finally:
            sshd.kill()
            ns.delete()


if __name__ == "__main__":
    sys.exit(main())
