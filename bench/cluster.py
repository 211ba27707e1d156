#!/usr/bin/env python3
"""One lab across several USB hosts: k = 1…4 lab hosts, each a network namespace running a real Ray node
(`devicelab worker`) with one device — an sshd board on the namespace's own loopback, which is shaped with
`tc tbf` like a Wi-Fi adb or USB link, so a cell's time is mostly the device and its link — and the head
(`devicelab head`, the ledger, the host-side work) in a namespace of its own. Each run starts every board from a
fresh device folder (so every run pushes its models over the shaped link); the nodes' caches of the head's files
are warmed by one discarded run first, as a lab's would be after its first day.

Prints, per k: the wall of the recipe across all k hosts ÷ the slowest of those hosts alone, and the time
from the run's start to the first cell starting on a remote host (connect, identity check, placement, the
lane's actor, the device's session). All boards are this machine (x86, the host's build): the nodes, sshds and
payloads share its cores. Needs root (ip netns, tc), openssh-server and the [cluster] extra.

With --tls every connection between the lab hosts is Ray's TLS (the lab's CA and a certificate per host, as
`devicelab head --make-certs` and `devicelab cert` make them): run it with and without to see what TLS costs.

usage: python bench/cluster.py [--rate 100mbit] [--kmax 4] [--tls]
The last line is exactly `cluster: hosts=4 tls=on|off wall/slowest=X.XX`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster_peer import LabNet, wait_for

RECIPE = """name: cluster-{tag}
devices: [{devices}]
models: [{{name: smollm2-135m}}]
quants: [q8_0, q4_0]
payloads:
  - {{kind: bench, prompt: [8], gen: [4], threads: [1], repetitions: 1, warmup: false}}
"""


def drive(recipe: str, lab: str, lab_dir: str, address: str) -> None:
    """The driver, inside the head's namespace: one run, its wall and its first remote cell's start, as JSON."""
    from devicelab.cluster.placement import ClusterPlacement
    from devicelab.runner.lane import Events
    from devicelab.runner.orchestrator import Orchestrator

    class Timed(Events):
        first: float | None = None

        def cell_start(self, cell):
            if self.first is None:
                self.first = time.monotonic()

        def cell_done(self, cell, ok, note=""):
            if not ok:
                raise SystemExit(f"cell failed on {cell.device}: {note}")

    ev = Timed()
    t0 = time.monotonic()
    rep = Orchestrator(Path(recipe), Path(lab), Path(lab_dir), events=ev).run(ClusterPlacement(address))
    wall = time.monotonic() - t0
    if rep.failed:
        raise SystemExit(f"{len(rep.failed)} cells failed: {rep.failed}")
    print(json.dumps({"wall": wall, "first_cell": (ev.first or time.monotonic()) - t0}))


def shape(net: LabNet, rate: str) -> None:
    for h in net.hosts:
        subprocess.run(
            [
                *h.prefix(),
                "tc",
                "qdisc",
                "add",
                "dev",
                "lo",
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "256kb",
                "latency",
                "100ms",
            ],
            check=True,
        )


def one_run(net: LabNet, hosts, work: Path, tag: str) -> dict:
    d = work / tag
    d.mkdir()
    lab = d / "lab.yaml"
    lab.write_text(
        "devices:\n"
        + "".join(
            h.lab_entry(f"board-{h.name}").replace(
                f"workdir: {h.board.d}/device-workdir", f"workdir: {d}/{h.name}-device"
            )
            for h in net.hosts
        )
    )
    recipe = d / "r.yaml"
    recipe.write_text(RECIPE.format(tag=tag, devices=", ".join(f"board-{h.name}" for h in hosts)))
    r = subprocess.run(
        [*net.prefix(), sys.executable, __file__, "--drive", str(recipe), str(lab), str(d / "lab"), net.address],
        capture_output=True,
        text=True,
        env=net.env(),
    )
    if r.returncode != 0:
        raise SystemExit(f"{tag}: the run failed: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--kmax", type=int, default=4)
    ap.add_argument("--tls", action="store_true", help="Ray's TLS between the lab hosts")
    ap.add_argument("--drive", nargs=4, metavar=("RECIPE", "LAB", "LAB_DIR", "ADDRESS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.drive:
        drive(*a.drive)
        return
    work = Path(tempfile.mkdtemp(prefix="devicelab-cluster-"))
    net = LabNet([f"h{i + 1}" for i in range(a.kmax)], tls=work / "tls" if a.tls else None)
    if not net.create():
        raise SystemExit("cannot create network namespaces (needs root)")
    try:
        for h in net.hosts:
            h.start_board(work / f"board-{h.name}")
        lab = work / "lab.yaml"
        lab.write_text("devices:\n" + "".join(h.lab_entry(f"board-{h.name}") for h in net.hosts))
        t0 = time.monotonic()
        net.start_head(lab, work / "head.log")
        for h in net.hosts:  # one at a time: they share this machine's 2 cores
            h.join(lab, work / f"cache-{h.name}", work / f"{h.name}.log")
            wait_for(lambda h=h: net.advertised().get(f"board-{h.name}") == h.name, 180, f"{h.name} to join", 1)
        print(f"cluster of {a.kmax} lab hosts up in {time.monotonic() - t0:.1f} s (head {net.address})")
        shape(net, a.rate)
        one_run(net, net.hosts, work, "warm")  # the nodes' caches get the build and the model once
        alone = {h.name: one_run(net, [h], work, f"alone-{h.name}") for h in net.hosts}
        for h, r in alone.items():
            print(f"  {h} alone: {r['wall']:.1f} s (first cell after {r['first_cell']:.1f} s)")
        ratio = 0.0
        for k in range(1, a.kmax + 1):
            hosts = net.hosts[:k]
            r = one_run(net, hosts, work, f"together-{k}")
            slowest = max(alone[h.name]["wall"] for h in hosts)
            ratio = r["wall"] / slowest
            print(
                f"k={k}: together {r['wall']:.1f} s, slowest alone {slowest:.1f} s, wall/slowest {ratio:.2f}; "
                f"first remote cell after {r['first_cell']:.1f} s"
            )
        print(f"cluster: hosts={a.kmax} tls={'on' if a.tls else 'off'} wall/slowest={ratio:.2f}")
    finally:
        net.delete()


if __name__ == "__main__":
    main()
