"""The device scripts in an Android-like userland: mksh as `sh` (Android's /system/bin/sh) and toybox's
applets as the only commands (Android's coreutils), from Debian's `mksh` and `toybox` packages. No phone
runs here; this is the phone's shell and tools on this machine's kernel. Debian builds toybox without
awk, tr, dd and getprop, all of which Android has: a stricter userland than a phone's, so what passes
here does not lean on them. What the scripts read (sysfs) is a fixture tree a writer changes meanwhile."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from adbd_peer import android_userland
from test_sampler import I0, V_BAT, K, Writer

from devicelab import paths
from devicelab.telemetry import normalize, sampler_csv
from devicelab.transports.base import put_script

pytestmark = pytest.mark.skipif(
    not (shutil.which("mksh") and shutil.which("toybox")),
    reason="needs Debian's mksh and toybox (Android's shell and coreutils)",
)
PAYLOADS = paths.device_payloads_dir()


@pytest.fixture
def android_env(tmp_path):
    """PATH = one folder: sh -> mksh, every toybox applet -> toybox. Nothing else."""
    d = android_userland(tmp_path / "system-bin")
    for missing in ("awk", "bash", "busybox", "dash", "python3", "openssl", "dd", "tr"):
        assert not (d / missing).exists()
    return {"PATH": str(d), "HOME": str(tmp_path)}, d


def _script(env, bindir, script: str, *args) -> subprocess.CompletedProcess:
    """A device script run by Android's sh in its userland: it must succeed and say nothing on stderr."""
    p = subprocess.run([str(bindir / "sh"), str(PAYLOADS / script), *map(str, args)], env=env, capture_output=True,
                       text=True, timeout=30)  # fmt: skip
    assert p.returncode == 0 and p.stderr == "", p.stderr
    return p


def test_facts_without_awk_or_tr(android_env, tmp_path):
    env, bindir = android_env
    p = _script(env, bindir, "facts.sh", str(tmp_path / "wd"))
    kv = dict(ln.split("=", 1) for ln in p.stdout.splitlines())
    meminfo = dict(ln.split(":", 1) for ln in Path("/proc/meminfo").read_text().splitlines())
    assert kv["mem.total_kB"] == meminfo["MemTotal"].split()[0]
    assert kv["mem.available_kB"].isdigit() and kv["storage.free_kB"].isdigit()
    assert kv["cpu.count"] == str(os.cpu_count())
    assert kv["arch"] == os.uname().machine


def test_runner_and_sampler_record_battery_power_and_peak_rss(android_env, tmp_path):
    """run_payload.sh starts the sampler beside a payload that holds 64 MiB for 1.5 s: the trace is at
    10 Hz, read by the shell itself (no awk), paced by mksh's `read -t`; the battery's energy integral
    matches the fixture's analytic value and the peak RSS covers the 64 MiB."""
    env, bindir = android_env
    root = tmp_path / "root"
    w = Writer(root, rapl=False)
    out = tmp_path / "cell"
    payload = [
        sys.executable,
        "-c",
        "import time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.5)",
    ]
    w.start()
    try:
        p = subprocess.run(
            [str(bindir / "sh"), str(PAYLOADS / "run_payload.sh"), str(out), "100", str(root), "--", *payload],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        w.stop.set()
        w.join()
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert (out / "exit_code").read_text().strip() == "0"
    assert (out / "pids").read_text().startswith("runner=")
    tr = sampler_csv.parse((out / "telemetry.csv").read_text())
    assert (tr.reader, tr.pace) == ("sh", "readt")
    df = tr.frame
    assert len(df) >= 12, "about 10 Hz for 1.5 s"
    t0, t1 = float(df["t_s"].iloc[0]), float(df["t_s"].iloc[-1])
    s = normalize.summarize(tr, [], (t0, t1))
    rows = {(r.metric, r.phase): r for r in s.rows}
    assert s.calibration["source"].startswith("battery")
    # the writer's current ramps from I0 with slope K (µA, negative = discharging on this "vendor"), its
    # clock starting when it was made; the sampler's clock is the device's uptime: compare by power
    ts = df["t_s"].astype(float)
    i_a = df["sys/class/power_supply/battery/current_now"].astype(float).abs() / 1e6
    assert rows[("power_mean", "cell")].value == pytest.approx((i_a * V_BAT / 1e6).mean(), rel=0.05)
    assert i_a.min() > 0.3 and i_a.max() < (abs(I0) + abs(K) * 60) / 1e6
    assert rows[("energy", "cell")].value == pytest.approx(rows[("power_mean", "cell")].value * (t1 - t0), rel=0.05)
    assert ts.is_monotonic_increasing
    assert rows[("peak_rss", "cell")].value > 64 << 20


@pytest.mark.parametrize("how", ["after", "follow"])
def test_put_writes_verifies_and_commits(android_env, tmp_path, how):
    """The SSH push's device side (sh -c TEXT …) with toybox's sha256sum; 'follow' has no dd here and
    hashes after writing instead."""
    env, bindir = android_env
    data = os.urandom((17 << 20) + 7)
    sha = hashlib.sha256(data).hexdigest()
    dst = tmp_path / "cache" / "ab" / "model.gguf"
    p = subprocess.run(
        [
            str(bindir / "sh"),
            "-c",
            put_script(),
            "devicelab",
            how,
            f"{dst}.part",
            str(len(data)),
            sha,
            str(dst),
            f"{dst}.ok",
            "",
        ],
        input=data,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().split()[0] == sha
    assert dst.read_bytes() == data and (tmp_path / "cache/ab/model.gguf.ok").read_text().strip() == sha
    assert not Path(f"{dst}.part").exists()
    # a short stream (the link broke) is refused, never committed
    bad = tmp_path / "cache" / "cd" / "x.bin"
    p = subprocess.run(
        [
            str(bindir / "sh"),
            "-c",
            put_script(),
            "devicelab",
            how,
            f"{bad}.part",
            str(len(data)),
            sha,
            str(bad),
            f"{bad}.ok",
            "",
        ],
        input=data[:1000],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 28 and b"short write" in p.stderr
    assert not bad.exists() and not Path(f"{bad}.ok").exists()


def test_thermal_sh_lists_every_zone_and_the_host_converts_each(android_env, tmp_path):
    """thermal.sh under mksh+toybox on zones in three units (a Snapdragon 821's tsens in d°C, its PMIC in m°C, a
    board thermistor in °C) and a battery-current-limit zone (mA): it prints every zone raw, and the host's reading
    converts each before it takes the hottest, temperatures only: 58.0 °C, not the largest raw number (49125)."""
    from devicelab.telemetry.sources import thermal_zones

    env, bindir = android_env
    zones = {"tsens_tz_sensor8": "580", "pm8994_tz": "49125", "msm_therm": "49", "pm8150b-ibat-lvl1": "781"}
    for i, (t, v) in enumerate(zones.items()):
        z = tmp_path / f"root/sys/class/thermal/thermal_zone{i}"
        z.mkdir(parents=True)
        (z / "type").write_text(t + "\n")
        (z / "temp").write_text(v + "\n")
    p = _script(env, bindir, "thermal.sh", str(tmp_path / "root"))
    assert sorted(p.stdout.splitlines()) == [f"thermal_zone{i} {v} {t}" for i, (t, v) in enumerate(zones.items())]
    assert thermal_zones.parse_now(p.stdout) == 58.0


def test_facts_reads_the_cpuinfo_under_its_root(android_env, tmp_path):
    """facts.sh's ROOT holds another device's /proc/cpuinfo (a capture): its features and cores are read from it."""
    env, bindir = android_env
    (tmp_path / "root/proc").mkdir(parents=True)
    (tmp_path / "root/proc/cpuinfo").write_text(
        "".join(
            f"processor\t: {i}\nFeatures\t: fp asimd asimdhp asimddp\nCPU implementer\t: 0x41\nCPU part\t: {p}\n\n"
            for i, p in enumerate(["0xd05", "0xd05", "0xd0b"])
        )
    )
    p = _script(env, bindir, "facts.sh", str(tmp_path / "wd"), str(tmp_path / "root"))
    kv = dict(ln.split("=", 1) for ln in p.stdout.splitlines())
    assert kv["cpu.features"] == "fp asimd asimdhp asimddp" and kv["cpu.parts"] == "2 0xd05; 1 0xd0b;"
