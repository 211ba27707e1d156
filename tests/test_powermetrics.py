"""macOS powermetrics beside a payload. No Mac is attached here, so `powermetrics` (and `sudo`) are test
doubles: small scripts on PATH that write the fixture's samples (tests/fixtures/snapshots/
powermetrics-m2.plist, a stream in powermetrics' plist format) and record how they were started and
stopped. The runner (device_payloads/run_payload.sh), the parser and the normalizer are the real ones."""

import os
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES

from devicelab import paths
from devicelab.telemetry import normalize, sampler_csv
from devicelab.telemetry.sources import powermetrics

PM = FIXTURES / "snapshots" / "powermetrics-m2.plist"

FAKE_PM = r"""#!/bin/sh
# test double for macOS powermetrics: records its argv, writes one fixture stream per interval until SIGTERM
echo "$@" > "$LOG.argv"
id -u > "$LOG.uid"
out=""; while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
trap 'echo TERM > "$LOG.sig"; exit 0' TERM
while :; do cat "$FIXTURE" >> "$out"; sleep 0.1; done
"""
FAKE_SUDO = r"""#!/bin/sh
# test double for sudo: only -n (never prompt) is accepted; runs the command as this user
[ "$1" = -n ] || { echo "sudo: a password is required" >&2; exit 1; }
shift
echo sudo > "$LOG.via"
exec "$@"
"""


@pytest.fixture
def fakebin(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    for name, text in (("powermetrics", FAKE_PM), ("sudo", FAKE_SUDO)):
        (b / name).write_text(text)
        os.chmod(b / name, 0o755)
    return b


def test_parser_reads_energy_thermal_pressure_and_clusters():
    s = powermetrics.parse(PM.read_bytes())
    assert len(s) == 3, "the torn last sample is skipped"
    assert s[0]["elapsed_s"] == pytest.approx(0.100) and s[2]["elapsed_s"] == pytest.approx(0.102)
    assert [x["energy_j"] for x in s] == pytest.approx([0.455, 1.670, 1.748])  # (cpu+gpu+ane) mJ → J
    assert s[1]["cpu_j"] == pytest.approx(1.63) and s[1]["gpu_j"] == pytest.approx(0.04)
    assert [x["thermal_pressure"] for x in s] == [0, 0, 2]  # Nominal, Nominal, Moderate
    assert s[0]["cluster_hz"] == {"E-Cluster": 2.02e9, "P-Cluster": 3.49e9}


def test_only_combined_power_is_integrated_over_the_sample():
    import plistlib

    raw = plistlib.dumps({"elapsed_ns": 250_000_000, "processor": {"combined_power": 4000.0}})
    s = powermetrics.parse(raw)
    assert s[0]["energy_j"] == pytest.approx(1.0) and s[0]["energy_from"] == "combined_power"  # 4 W × 0.25 s


def test_summary_on_a_mac_takes_cell_energy_clock_and_throttle_from_powermetrics():
    empty = sampler_csv.parse("# clock none\ntick,t_s\n0,\n1,\n")  # a Mac: no sysfs, no /proc/uptime
    pm = powermetrics.parse(PM.read_bytes())
    summ = normalize.summarize(empty, [normalize.Phase("tg64", "tg", 0, 1, 64)], None, {powermetrics.SOURCE.name: pm})
    by = {(r.metric, r.phase): r for r in summ.rows}
    assert by[("energy", "cell")].value == pytest.approx(0.455 + 1.670 + 1.748)
    assert by[("power_mean", "cell")].value == pytest.approx((0.455 + 1.670 + 1.748) / 0.303)
    assert by[("cpu_freq_mean", "cell")].value == pytest.approx(
        ((2.02 + 3.49) + (1.92 + 3.29) + (1.82 + 3.09)) / 6 * 1e9
    )
    assert by[("thermal_status", "cell")].value == 2
    assert summ.throttled is True and summ.calibration["source"] == "powermetrics"
    tg = by[("energy", "tg")]
    assert tg.value != tg.value and "no sub-second device clock" in tg.missing_reason  # NaN with a reason


def test_without_powermetrics_a_mac_reports_energy_missing():
    empty = sampler_csv.parse("# clock none\ntick,t_s\n0,\n1,\n")
    summ = normalize.summarize(empty, [], (0.0, 1.0), None)
    e = [r for r in summ.rows if r.metric == "energy"]
    assert e and all(r.value != r.value and r.missing_reason == normalize.NO_POWER for r in e)


@pytest.mark.parametrize("how", ["root", "sudo"])
def test_runner_starts_powermetrics_beside_the_payload_and_stops_it(tmp_path, fakebin, how):
    out = tmp_path / "cell"
    log = tmp_path / "pm"
    env = dict(
        os.environ, PATH=f"{fakebin}:{os.environ['PATH']}", LOG=str(log), FIXTURE=str(PM), DEVICELAB_POWERMETRICS=how
    )
    runner = paths.device_payloads_dir() / "run_payload.sh"
    p = subprocess.run(
        ["sh", str(runner), str(out), "50", "/", "--", "sleep", "0.6"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    assert log.with_suffix(".argv").read_text().split() == [
        "-i",
        "100",
        "-b",
        "1",
        "-f",
        "plist",
        "-s",
        "cpu_power,gpu_power,thermal",
        "-o",
        str(out / "powermetrics.plist"),
    ]
    assert log.with_suffix(".sig").read_text().strip() == "TERM", "stopped once the payload ended"
    assert log.with_suffix(".via").exists() == (how == "sudo")
    pids = dict(kv.split("=") for kv in (out / "pids").read_text().split())
    assert not os.path.exists(f"/proc/{pids['powermetrics']}")
    samples = powermetrics.parse((out / "powermetrics.plist").read_bytes())
    assert len(samples) >= 3 * 3, "several intervals' worth while the payload ran"


def test_runner_without_the_setting_starts_no_powermetrics(tmp_path, fakebin):
    out = tmp_path / "cell"
    env = dict(os.environ, PATH=f"{fakebin}:{os.environ['PATH']}", LOG=str(tmp_path / "pm"), FIXTURE=str(PM))
    env.pop("DEVICELAB_POWERMETRICS", None)
    p = subprocess.run(
        ["sh", str(paths.device_payloads_dir() / "run_payload.sh"), str(out), "50", "/", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0 and not (out / "powermetrics.plist").exists() and not Path(f"{tmp_path}/pm.argv").exists()
