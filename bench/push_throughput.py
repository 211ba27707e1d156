#!/usr/bin/env python3
"""Prints push throughput over SSH on loopback, measured side by side in one run against a real sshd:
devicelab's push (SSHTransport.put + remote sha256 verify) vs `scp` vs paramiko SFTP, and the time to
re-push an unchanged file (goal ≈ 0 s). Goal: devicelab / scp ≥ 0.9.

usage: python bench/push_throughput.py [--mib 256] [--rounds 3]"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sshd_peer import Sshd  # noqa: E402

from devicelab import push  # noqa: E402
from devicelab.transports.ssh import SSHTransport  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        s = Sshd(d / "sshd").start()
        try:
            f = d / "blob.bin"
            block = os.urandom(1 << 20)
            with open(f, "wb") as fh:
                for _ in range(a.mib):
                    fh.write(block)
            sha = hashlib.sha256(f.read_bytes()).hexdigest()
            t = SSHTransport("bench", "127.0.0.1", port=s.port, user="root", key_file=str(s.client_key),
                             known_hosts=str(s.known_hosts), workdir=str(d / "wd"))
            t.connect()
            res = {"devicelab put": [], "devicelab push (put+verify)": [], "scp": [], "paramiko sftp": [],
                   "paramiko channel (no OpenSSH)": []}
            for i in range(a.rounds):
                t0 = time.time(); t.put(f, str(d / "wd" / "a.bin")); res["devicelab put"].append(time.time() - t0)
                os.environ["DEVICELAB_NO_OPENSSH"] = "1"
                t0 = time.time(); t.put(f, str(d / "wd" / "a2.bin"))
                res["paramiko channel (no OpenSSH)"].append(time.time() - t0)
                del os.environ["DEVICELAB_NO_OPENSSH"]
                t0 = time.time()
                with open(f, "rb") as fh:
                    subprocess.run(t.openssh_argv() + [f"cat > {d}/wd/raw.bin"], stdin=fh, check=True)
                res.setdefault("OpenSSH exec, no hashing", []).append(time.time() - t0)
                t0 = time.time()
                subprocess.run(["scp", "-q", "-P", str(s.port), "-i", str(s.client_key), "-o",
                                f"UserKnownHostsFile={s.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                                str(f), f"root@127.0.0.1:{d}/wd/b.bin"], check=True)
                res["scp"].append(time.time() - t0)
                sftp = t.client.open_sftp()
                t0 = time.time(); sftp.put(str(f), str(d / "wd" / "c.bin")); res["paramiko sftp"].append(time.time() - t0)
                sftp.close()
                for p in (d / "wd" / "cache").glob("*"):
                    subprocess.run(["rm", "-rf", str(p)])
                t0 = time.time(); push.ensure(t, f, sha, "blob.bin"); res["devicelab push (put+verify)"].append(time.time() - t0)
            t0 = time.time(); push.ensure(t, f, sha, "blob.bin"); again = time.time() - t0
            mbps = {k: a.mib / statistics.median(v) for k, v in res.items()}
            for k, v in mbps.items():
                print(f"{k:28s} {v:7.1f} MiB/s (median of {a.rounds}, {a.mib} MiB)")
            print(f"devicelab put (sha256 computed on the device while writing) / scp: "
                  f"{mbps['devicelab put'] / mbps['scp']:.2f} (goal ≥ 0.9); whole verified push incl. marker: "
                  f"{mbps['devicelab push (put+verify)'] / mbps['scp']:.2f}; paramiko-only fallback: "
                  f"{mbps['paramiko channel (no OpenSSH)'] / mbps['scp']:.2f}")
            print(f"transfer alone (OpenSSH exec without the device-side sha256) / scp: "
                  f"{mbps['OpenSSH exec, no hashing'] / mbps['scp']:.2f} — on loopback the 'device' hashes on the "
                  "same 2 cores that encrypt and decrypt")
            print(f"re-push of the unchanged file: {again * 1000:.0f} ms (goal ≈ 0 s)")
        finally:
            s.kill()


if __name__ == "__main__":
    main()
