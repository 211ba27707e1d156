#!/usr/bin/env python3
"""Prints push throughput over SSH on loopback, measured side by side in one run against a real sshd:
devicelab's push (SSHTransport.put: the device's sha256 of what it wrote) over the transport's OpenSSH
connection (reused, as by every push after a run's first) and over a fresh one, vs `scp` (its default
cipher, and the cipher devicelab picked) vs paramiko SFTP, both device-side hashing modes, and the time
to re-push an unchanged file (goal ≈ 0 s). Goal: devicelab / scp ≥ 0.9.

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
from sshd_peer import Sshd

from devicelab import push
from devicelab.transports import ssh as ssh_mod
from devicelab.transports.ssh import SSHTransport


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
            t = SSHTransport(
                "bench",
                "127.0.0.1",
                port=s.port,
                user="root",
                key_file=str(s.client_key),
                known_hosts=str(s.known_hosts),
                workdir=str(d / "wd"),
            )
            t.connect()
            ncpu, aes = t.device_cpu()
            cipher = ssh_mod.OPENSSH_AES_FIRST.split(",")[0] if aes and ssh_mod.host_has_aes() else None
            print(
                f"device: {ncpu} CPUs, AES {'yes' if aes else 'no'} → cipher "
                f"{cipher or 'OpenSSH default'}, hash "
                f"{'while writing' if ncpu >= ssh_mod.HASH_WHILE_WRITING_MIN_CPUS else 'after writing'}"
            )
            wd = d / "wd"
            scp = [
                "scp",
                "-q",
                "-P",
                str(s.port),
                "-i",
                str(s.client_key),
                "-o",
                f"UserKnownHostsFile={s.known_hosts}",
                "-o",
                "StrictHostKeyChecking=yes",
            ]

            def follow_mode():  # the other hashing mode, same cipher
                t._cpu = (ssh_mod.HASH_WHILE_WRITING_MIN_CPUS, aes)
                try:
                    t.put(f, str(wd / "x.bin"))
                finally:
                    t._cpu = None

            def paramiko_only():
                os.environ["DEVICELAB_NO_OPENSSH"] = "1"
                try:
                    t.put(f, str(wd / "x.bin"))
                finally:
                    del os.environ["DEVICELAB_NO_OPENSSH"]

            def fresh_connection():  # a one-off push: no master connection to reuse
                os.environ["DEVICELAB_NO_SSH_MUX"] = "1"
                try:
                    t.put(f, str(wd / "x.bin"))
                finally:
                    del os.environ["DEVICELAB_NO_SSH_MUX"]

            def raw_exec():
                with open(f, "rb") as fh:
                    subprocess.run(t.openssh_argv() + [f"cat > {wd}/x.bin"], stdin=fh, check=True)

            def sftp_put():
                sftp = t.client.open_sftp()
                sftp.put(str(f), str(wd / "x.bin"))
                sftp.close()

            ops = {
                "devicelab put": lambda: t.put(f, str(wd / "x.bin")),
                "devicelab push (put+verify)": lambda: push.ensure(t, f, sha, "blob.bin"),
                "devicelab put, fresh connection": fresh_connection,
                "devicelab put, hash while writing": follow_mode,
                "paramiko channel (no OpenSSH)": paramiko_only,
                "OpenSSH exec (same connection), no hash": raw_exec,
                "scp": lambda: subprocess.run(scp + [str(f), f"root@127.0.0.1:{wd}/x.bin"], check=True),
                "paramiko sftp": sftp_put,
            }
            if cipher:
                ops[f"scp -c {cipher}"] = lambda: subprocess.run(
                    scp + ["-c", cipher, str(f), f"root@127.0.0.1:{wd}/x.bin"], check=True
                )
            res: dict[str, list[float]] = {k: [] for k in ops}
            names = list(ops)
            for i in range(a.rounds):
                for k in names[i % len(names) :] + names[: i % len(names)]:  # rotate the order each round
                    t0 = time.time()
                    ops[k]()
                    res[k].append(time.time() - t0)
                    # drop what it wrote before its write-back can slow the next one down
                    subprocess.run(["rm", "-rf", str(wd / "x.bin"), *map(str, (wd / "cache").glob("*"))])
            push.ensure(t, f, sha, "blob.bin")
            t0 = time.time()
            push.ensure(t, f, sha, "blob.bin")
            again = time.time() - t0
            mbps = {k: a.mib / statistics.median(v) for k, v in res.items()}
            for k, v in mbps.items():
                print(f"{k:36s} {v:7.1f} MiB/s (median of {a.rounds}, {a.mib} MiB)")
            print(
                f"devicelab put (device-side sha256 of what it wrote) / scp: "
                f"{mbps['devicelab put'] / mbps['scp']:.2f} (goal ≥ 0.9; the transport's OpenSSH connection reused, "
                f"as for every push after a run's first); on a fresh connection: "
                f"{mbps['devicelab put, fresh connection'] / mbps['scp']:.2f}; whole verified push incl. marker: "
                f"{mbps['devicelab push (put+verify)'] / mbps['scp']:.2f}; paramiko-only fallback: "
                f"{mbps['paramiko channel (no OpenSSH)'] / mbps['scp']:.2f}"
            )
            if cipher:
                print(
                    f"against scp given the same cipher (-c {cipher}): devicelab put / scp -c: "
                    f"{mbps['devicelab put'] / mbps[f'scp -c {cipher}']:.2f}"
                )
            print(
                f"hashing while writing (the mode for devices with ≥ {ssh_mod.HASH_WHILE_WRITING_MIN_CPUS} "
                f"CPUs) / scp: {mbps['devicelab put, hash while writing'] / mbps['scp']:.2f}"
            )
            print(
                f"transfer alone (OpenSSH exec of `cat`, no size check or sha256) / scp: "
                f"{mbps['OpenSSH exec (same connection), no hash'] / mbps['scp']:.2f}: what verification costs "
                "here, where the 'device' hashes on the same 2 cores that encrypt and decrypt"
            )
            rts = []
            for _ in range(5):
                t0 = time.time()
                t.run(["true"])
                rts.append(time.time() - t0)
            print(
                f"re-push of the unchanged file: {again * 1000:.0f} ms (goal ≈ 0 s): one round trip, the marker "
                f"check; a bare `true` over this sshd takes {statistics.median(rts) * 1000:.0f} ms (median of 5)"
            )
            t.close()
        finally:
            s.kill()


if __name__ == "__main__":
    main()
