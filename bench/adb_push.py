#!/usr/bin/env python3
"""Prints push throughput through devicelab (ADBTransport.put: the `adb` client for large files when its
version matches the server's) and through adbutils' own sync push, each vs `adb push`, on the same link: the real adb
host server and the adb-protocol device peer from tests/ on 127.0.0.1 (the peer is a Python stand-in for
adbd, so absolute MiB/s say little; the ratio is the figure). Goal: adbutils / adb push ≥ 0.9.

usage: python bench/adb_push.py [--mib 64] [--rounds 3]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from adbd_peer import AdbdPeer, AdbServer, free_port

from devicelab.transports.adb import ADBTransport


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        adb = AdbServer(d / "adb", free_port()).start()
        keys = d / "adb_keys"
        keys.write_text(adb.pubkey.read_text())
        peer = AdbdPeer(d / "peer", free_port(), keys, {"ro.build.version.release": "14"}).start()
        serial = f"127.0.0.1:{peer.port}"
        try:
            t = ADBTransport("bench", serial, adb_port=adb.port, workdir=str(d / "wd"))
            t.connect()
            f = d / "blob.bin"
            block = os.urandom(1 << 20)
            with open(f, "wb") as fh:
                for _ in range(a.mib):
                    fh.write(block)
            ours, theirs, sync = [], [], []
            print(f"devicelab uses the adb client: {t.adb_cli()}")
            for i in range(a.rounds):
                t0 = time.time()
                t.put(f, str(d / "wd" / f"a{i}"))
                ours.append(time.time() - t0)
                t0 = time.time()
                t._d().sync.push(str(f), str(d / "wd" / f"s{i}"))
                sync.append(time.time() - t0)
                t0 = time.time()
                r = adb.cmd("-s", serial, "push", str(f), str(d / "wd" / f"b{i}"), timeout=600)
                theirs.append(time.time() - t0)
                assert r.returncode == 0, r.stderr
            mo, mt = a.mib / statistics.median(ours), a.mib / statistics.median(theirs)
            ms = a.mib / statistics.median(sync)
            print(
                f"devicelab put {mo:.1f} MiB/s, adbutils sync push {ms:.1f} MiB/s, adb push {mt:.1f} MiB/s "
                f"(median of {a.rounds}, {a.mib} MiB): devicelab/adb push {mo / mt:.2f} (goal ≥ 0.9), "
                f"adbutils/adb push {ms / mt:.2f}"
            )
        finally:
            peer.kill()
            adb.stop()


if __name__ == "__main__":
    main()
