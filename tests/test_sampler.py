"""The real device-side sampler (device_payloads/sampler.sh) run under dash and busybox sh against
fixture sysfs trees whose counters a writer thread changes while it samples. The fixture tree stands
in for a phone's/board's sysfs (none exists here); the sampler, shells and normalizer are the real ones."""

import math
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from devicelab import paths
from devicelab.telemetry import normalize, sampler_csv, units
from devicelab.telemetry.sources import cpufreq, power_supply

pytestmark = pytest.mark.beside  # it mostly waits: the suite runs it beside the others (conftest.py)

# mksh: Android's /system/bin/sh
SHELLS = [s for s in (["dash"], ["busybox", "sh"], ["mksh"]) if shutil.which(s[0])]
SAMPLER = paths.device_payloads_dir() / "sampler.sh"

P_RAPL = 5.0  # W, package power the fake RAPL counter integrates
RAPL_RANGE = 2_000_000  # µJ: wraps every 0.4 s at 5 W — several wraps per run
V_BAT = 3_800_000  # µV
I0, K = -400_000, -100_000  # µA at t=0, µA/s ramp; negative = this "vendor" reports discharge as negative


def _write(p: Path, v):
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(f"{v}\n")
    tmp.replace(p)  # atomic, like a sysfs read never sees half a number


class Writer(threading.Thread):
    def __init__(
        self,
        root: Path,
        battery=True,
        rapl=True,
        i0=I0,
        k=K,
        charge_counter=False,
        counter=None,
        voltage=V_BAT,
        temp_slope=2_000,
    ):
        """counter: the battery counter that falls as it discharges at |current_now| — charge_counter or
        charge_now (µAh) or energy_now (µWh); `frozen` stops it (a coarse counter over a short cell)."""
        super().__init__(daemon=True)
        self.root, self.battery, self.rapl = root, battery, rapl
        self.i0, self.k = i0, k
        self.counter = counter or ("charge_counter" if charge_counter else None)
        self.voltage, self.temp_slope = voltage, temp_slope
        self.frozen = False
        self.rapl_at: dict[int, float] = {}
        self.khz = lambda t: 1_800_000  # the CPU clock over time (kHz)
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        ps = root / "sys/class/power_supply/battery"
        rp = root / "sys/class/powercap/intel-rapl:0"
        tz = root / "sys/class/thermal/thermal_zone0"
        cf = root / "sys/devices/system/cpu/cpu0/cpufreq"
        for d in (ps, rp, tz, cf):
            d.mkdir(parents=True, exist_ok=True)
        if battery:
            _write(ps / "type", "Battery")
            _write(ps / "status", "Discharging")
            _write(ps / "voltage_now", voltage)
            _write(ps / "capacity", 80)
        else:
            shutil.rmtree(ps)
        if rapl:
            _write(rp / "name", "package-0")
            _write(rp / "max_energy_range_uj", RAPL_RANGE)
        else:
            shutil.rmtree(rp)
        _write(tz / "type", "cpu-thermal")
        _write(cf / "cpuinfo_max_freq", 2_000_000)
        self.ps, self.rp, self.tz, self.cf = ps, rp, tz, cf
        self.tick()

    def tick(self):
        t = time.monotonic() - self.t0
        if self.battery:
            _write(self.ps / "current_now", int(self.i0 + self.k * t))
            if self.counter and not (self.frozen and (self.ps / self.counter).exists()):
                q = (abs(self.i0) * t + abs(self.k) * t * t / 2) / 3600  # µAh drawn at |current_now| µA
                if self.counter == "energy_now":
                    _write(self.ps / "energy_now", int(15_000_000 - q * self.voltage / 1e6))  # µWh
                else:
                    _write(self.ps / self.counter, int(3_000_000 - q))
        if self.rapl:
            v = int(P_RAPL * 1e6 * t) % RAPL_RANGE
            while v in self.rapl_at:  # a value is written once (1 µJ later where a later wrap would repeat one), so
                v = (v + 1) % RAPL_RANGE  # a value read names the one moment it was written (CI once hit a repeat)
            self.rapl_at[v] = t  # when each value was written: a read is as old as its value, on a busy machine too
            _write(self.rp / "energy_uj", v)
        _write(self.tz / "temp", int(45_000 + self.temp_slope * t))
        _write(self.cf / "scaling_cur_freq", self.khz(t))

    def run(self):
        while not self.stop.is_set():
            self.tick()
            time.sleep(0.005)


def sample(shell, root: Path, out: Path, seconds=3.0, interval=100, stay=True, env=None):
    """stay: -S, the sampler keeps the shell it was started in (else dash moves itself to busybox/bash)."""
    # the payload lasts `seconds` from the sampler's start (its CSV header written), however long a busy machine
    # takes to start the shell: a sleep started before it would leave fewer seconds to sample
    payload = subprocess.Popen(
        ["sh", "-c", f'while [ ! -s "$1" ]; do sleep 0.02; done; exec sleep {seconds}', "sh", str(out)]
    )
    try:
        p = subprocess.run(
            [
                *shell,
                str(SAMPLER),
                "-o",
                str(out),
                "-p",
                str(payload.pid),
                "-i",
                str(interval),
                "-R",
                str(root),
                *(["-S"] if stay else []),
            ],
            check=True,
            timeout=seconds + 20,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert p.stderr == "", f"the sampler wrote to stderr (a cell's stderr on a device): {p.stderr}"
    finally:
        payload.wait()
    return sampler_csv.parse(out.read_text())


def sample_while(writer: threading.Thread, *args, **kw):
    """sample() while `writer` changes the fixture tree; the writer is stopped whatever happens."""
    writer.start()
    try:
        return sample(*args, **kw)
    finally:
        writer.stop.set()
        writer.join()


@pytest.mark.parametrize("reader", ["awk", "sh"])
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_energy_units_signs_and_wraparound(tmp_path, shell, reader):
    """reader: the files read by one long-lived awk (where the device has awk) or by the shell itself."""
    w = Writer(tmp_path / "root")
    w.start()
    try:
        tr = sample(
            shell,
            tmp_path / "root",
            tmp_path / "t.csv",
            env={**os.environ, **({"DEVICELAB_SAMPLER_NO_AWK": "1"} if reader == "sh" else {})},
        )
    finally:
        w.stop.set()
        w.join()
    assert tr.reader == reader
    df = tr.frame
    assert len(df) >= 20, "10 Hz for 3 s"
    assert tr.meta["sys/class/thermal/thermal_zone0"]["type"] == "cpu-thermal"
    assert tr.meta["sys/class/powercap/intel-rapl:0"]["max_energy_range_uj"] == str(RAPL_RANGE)
    t0, t1 = float(df["t_s"].iloc[0]), float(df["t_s"].iloc[-1])
    s = normalize.summarize(tr, [], (t0, t1))
    rows = {(r.metric, r.phase): r for r in s.rows}
    # RAPL is preferred over the battery; the counter wrapped several times during the run
    assert s.calibration["source"] == "rapl"
    raw = df["sys/class/powercap/intel-rapl:0/energy_uj"].astype(float)
    assert (raw.diff() < 0).sum() >= 3
    # P_RAPL over the time between the first and the last value read (when the writer wrote them: a writer held
    # up by a busy machine leaves the sampler reading older values, which the sampler cannot know)
    e = rows[("energy", "cell")].value
    when = [w.rapl_at[int(v)] for v in raw]
    assert when == sorted(when), "the sampler read the counter's values in the order they were written"
    written = when[-1] - when[0]
    assert e == pytest.approx(P_RAPL * written, rel=0.01)
    assert rows[("power_mean", "cell")].value == pytest.approx(P_RAPL * written / (t1 - t0), rel=0.01)
    assert written == pytest.approx(t1 - t0, abs=1.0)
    # thermal: m°C → °C; start/end/max from the hottest zone
    zone = df["sys/class/thermal/thermal_zone0/temp"].astype(float)
    assert rows[("temp_start", "cell")].value == pytest.approx(zone.iloc[0] / 1000)
    assert rows[("temp_max", "cell")].value == pytest.approx(zone.max() / 1000)
    assert 45 <= rows[("temp_start", "cell")].value < rows[("temp_max", "cell")].value - 4  # 2 °C a second, 3 s
    assert s.temp_end_c == rows[("temp_end", "cell")].value
    # cpufreq kHz → Hz
    assert rows[("cpu_freq_mean", "cell")].value == pytest.approx(1.8e9)
    assert s.throttled is False, "a steady clock is not throttling"
    # peak RSS of the payload (sleep): real /proc read, kB → B
    assert 100_000 < rows[("peak_rss", "cell")].value < 50_000_000


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_battery_only_current_sign_and_units(tmp_path, shell):
    w = Writer(tmp_path / "root", rapl=False)
    tr = sample_while(w, shell, tmp_path / "root", tmp_path / "t.csv", seconds=2.0)
    df = tr.frame
    t0, t1 = float(df["t_s"].iloc[0]), float(df["t_s"].iloc[-1])
    s = normalize.summarize(tr, [normalize.Phase("decode", "decode", t0, t1, tokens=100)], (t0, t1))
    assert s.calibration["source"] == "battery:sys/class/power_supply/battery"
    assert (s.calibration["current_unit"], s.calibration["current_sign"]) == ("uA", -1.0)
    # P = V·|I| in W from µV and µA, integrated over the times the values were read. Not V·(|I(t0)|+|I(t1)|)/2·(t1−t0):
    # a writer held up unevenly by a busy machine leaves readings that are not linear in the sample times (CI read
    # 3.797 J against that 3.836 J), and the sampler cannot know how old a value is
    cur = df["sys/class/power_supply/battery/current_now"].astype(float).abs().to_numpy() / 1e6
    volts = df["sys/class/power_supply/battery/voltage_now"].astype(float).to_numpy() / 1e6
    assert set(volts) == {V_BAT / 1e6}
    read = float(np.trapezoid(volts * cur, df["t_s"].to_numpy(dtype=float)))
    rows = {(r.metric, r.phase): r for r in s.rows}
    assert rows[("energy", "cell")].value > 0, "discharge is positive in our convention"
    assert rows[("energy", "cell")].value == pytest.approx(read, rel=1e-9)
    ramp = (V_BAT / 1e6) * (cur[0] + cur[-1]) / 2 * (t1 - t0)  # what an even-paced writer gives: a sanity bound
    assert 0.8 * ramp < read < 1.2 * ramp
    assert rows[("energy_per_token", "decode")].value == pytest.approx(rows[("energy", "decode")].value / 100)


def test_current_unit_comes_from_what_the_device_says_not_the_magnitude():
    """No calibration: µA by the kernel ABI whatever the magnitude (976 is 976 µA on a phone on USB, not 976 mA),
    unless the driver says otherwise: its own µA file beside current_now (Samsung's batt_current_ua_now), or other
    files that break the ABI (a charge_now of 0 at 98 %: Samsung's charging mode; a voltage_now in mV) together with a
    discharge too small for µA. Where that cannot be told, no unit (the power is missing until a counter calibrates)."""
    import pandas as pd

    d = "sys/class/power_supply/battery"

    def unit(**cols):
        df = pd.DataFrame({f"{d}/{k}": pd.Series(v) for k, v in cols.items()})
        return power_supply.current_unit(df, d, df[f"{d}/current_now"].astype(float))[0]

    for raw in ([976, 980], [-25_000], [450_000, 460_000]):  # the ABI's µA at any magnitude
        assert unit(current_now=raw, voltage_now=[3_815_175] * len(raw), capacity=[44] * len(raw)) == "uA"
    samsung = dict(current_now=[-191], voltage_now=[4_246_000], charge_now=[0], capacity=[98])
    assert unit(**samsung, status=["Discharging"]) == "mA"
    assert unit(**samsung, status=["Charging"]) is None  # breaks the ABI, and 191 could be µA or mA: unknown
    assert unit(current_now=[-350], voltage_now=[3_900_000], batt_current_ua_now=[-350_000]) == "mA"
    assert unit(current_now=[-350_000], voltage_now=[3_900_000], batt_current_ua_now=[-350_000]) == "uA"
    assert unit(current_now=[450], voltage_now=[3_900], status=["Discharging"]) == "mA"  # a driver in mV
    assert unit(current_now=[-350], voltage_now=[3_900_000], batt_current_ua_now=[-35_000]) is None


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_missing_sources_are_nan_with_reason_never_zero(tmp_path, shell):
    root = tmp_path / "empty"
    root.mkdir()
    tr = sample(shell, root, tmp_path / "t.csv", seconds=0.5)
    t0, t1 = float(tr.frame["t_s"].iloc[0]), float(tr.frame["t_s"].iloc[-1])
    s = normalize.summarize(tr, [], (t0, t1))
    by = {r.metric: r for r in s.rows}
    for m in ("energy", "temp_start", "cpu_freq_mean"):
        assert math.isnan(by[m].value) and by[m].missing_reason, m
    assert "no power source" in by["energy"].missing_reason


def test_rapl_sums_packages_and_leaves_psys_out():
    """psys (the platform: package, DRAM and more) is a top-level zone beside package-0 on recent Intel laptops:
    summed with it, the package would count twice. It is the figure only where there is no package domain."""
    import pandas as pd

    from devicelab.telemetry.sources import rapl

    pk, ps = "sys/class/powercap/intel-rapl:0", "sys/class/powercap/intel-rapl:1"
    frame = pd.DataFrame({"tick": [0, 1], "t_s": [0.0, 1.0], f"{pk}/energy_uj": [0, 5e6], f"{ps}/energy_uj": [0, 9e6]})
    meta = {pk: {"kind": "rapl", "name": "package-0"}, ps: {"kind": "rapl", "name": "psys"}}
    e = rapl.package_energy(sampler_csv.SamplerTrace(frame, meta))
    assert e.info["domains"] == [f"{pk}/energy_uj"] and e.values[-1] == pytest.approx(5.0)
    only = rapl.package_energy(sampler_csv.SamplerTrace(frame.drop(columns=[f"{pk}/energy_uj"]), meta))
    assert only.values[-1] == pytest.approx(9.0)


def test_rapl_wrap_arithmetic():
    import pandas as pd

    e = units.counter_j(pd.Series([1_900_000, 100_000, 300_000]), 2_000_000)
    assert list(e) == pytest.approx([0.0, 0.2, 0.4])


@pytest.mark.parametrize("shell", SHELLS[:1], ids=lambda s: s[0])
def test_charge_counter_calibration_beats_the_magnitude_guess(tmp_path, shell):
    """A board idling at 8 mA: 8000 µA in current_now looked like 'mA' to a magnitude rule (8 A!).
    The drop of charge_counter over the cell says µA, and the reported sign is the other way round."""
    w = Writer(tmp_path / "root", rapl=False, i0=-8000, k=0, charge_counter=True)
    tr = sample_while(w, shell, tmp_path / "root", tmp_path / "t.csv", seconds=3.0)
    t0, t1 = float(tr.frame["t_s"].iloc[0]), float(tr.frame["t_s"].iloc[-1])
    s = normalize.summarize(tr, [], (t0, t1))
    assert s.calibration["method"] == "charge_counter"
    assert s.calibration["current_unit"] == "uA" and s.calibration["current_sign"] == -1.0
    assert s.calibration["agreement"] > 0.6  # the counter moves in whole µAh: ~7 steps here
    e = next(r for r in s.rows if r.metric == "energy" and r.phase == "cell").value
    assert e == pytest.approx(0.008 * 3.8 * (t1 - t0), rel=0.01)


@pytest.mark.parametrize("counter", ["charge_now", "energy_now"])
def test_calibration_from_charge_now_or_energy_now(tmp_path, counter):
    """A board with no charge_counter: charge_now (µAh) or energy_now (µWh, checked against V·I) says
    the 8000 in current_now is µA drawn, not 8 A charging."""
    w = Writer(tmp_path / "root", rapl=False, i0=-8000, k=0, counter=counter)
    tr = sample_while(w, SHELLS[0], tmp_path / "root", tmp_path / "t.csv", seconds=3.0)
    t0, t1 = float(tr.frame["t_s"].iloc[0]), float(tr.frame["t_s"].iloc[-1])
    s = normalize.summarize(tr, [], (t0, t1))
    assert s.calibration["method"] == counter
    assert s.calibration["current_unit"] == "uA" and s.calibration["current_sign"] == -1.0
    e = next(r for r in s.rows if r.metric == "energy" and r.phase == "cell").value
    assert e == pytest.approx(0.008 * 3.8 * (t1 - t0), rel=0.01)


def test_a_cell_whose_counter_did_not_move_takes_the_device_calibration(tmp_path):
    """A short cell: the counter stands still (phones count in whole mAh), so the cell alone cannot tell
    µA from mA. The calibration an earlier cell of the same device made is used, and says where from;
    without it the unit is the device's own (the ABI's µA: its voltage and counter follow the ABI), never a guess
    from the magnitude (which read 8000 as 8 A)."""
    w = Writer(tmp_path / "root", rapl=False, i0=-8000, k=0, counter="charge_counter")
    w.frozen = True
    tr = sample_while(w, SHELLS[0], tmp_path / "root", tmp_path / "t.csv", seconds=1.0)
    t0, t1 = float(tr.frame["t_s"].iloc[0]), float(tr.frame["t_s"].iloc[-1])
    energy = lambda s: next(r for r in s.rows if r.metric == "energy" and r.phase == "cell").value
    guess = normalize.summarize(tr, [], (t0, t1))
    assert guess.calibration["method"] == "device units+status" and guess.calibration["current_unit"] == "uA"
    prior = {
        "source": "battery:sys/class/power_supply/battery",
        "current_unit": "uA",
        "scale_to_a": 1e-6,
        "current_sign": -1.0,
        "agreement": 0.97,
        "method": "charge_counter",
        "cell": "c-earlier",
    }
    s = normalize.summarize(tr, [], (t0, t1), prior_calibration=prior)
    assert s.calibration["method"] == "device calibration (charge_counter in cell c-earlier)"
    assert energy(s) == pytest.approx(0.008 * 3.8 * (t1 - t0), rel=0.01)
    assert energy(guess) == pytest.approx(0.008 * 3.8 * (t1 - t0), rel=0.01), "the ABI's µA, not 1000x off"
    other = normalize.summarize(
        tr, [], (t0, t1), prior_calibration={**prior, "source": "battery:sys/class/power_supply/bms"}
    )
    assert other.calibration["method"] == "device units+status", "another supply's calibration is not borrowed"


def test_calibration_picks_ma_for_a_milliamp_vendor():
    import numpy as np
    import pandas as pd

    t = np.linspace(0, 60, 61)
    raw = pd.Series(np.full(61, 450.0))  # mA, positive = discharging on this vendor
    cc = pd.Series(3_000_000 - 450_000 * t / 3600)  # µAh falling at 450 mA
    cal = power_supply.calibrate_current(t, raw, cc)
    assert cal["current_unit"] == "mA" and cal["current_sign"] == 1.0


@pytest.mark.skipif(not shutil.which("dash"), reason="needs dash")
def test_dash_moves_to_a_shell_with_read_t_and_paces_with_sleep_where_none(tmp_path):
    """dash has no `read -t`: a `sleep` per tick costs ~1% of a core at 10 Hz, so the sampler re-runs itself
    under busybox sh / mksh / bash when the device has one — and where it has none, still samples at the
    rate with `sleep`, and says so in its '# pace' line."""
    w = Writer(tmp_path / "root", rapl=False)
    w.start()
    try:
        moved = sample(["dash"], tmp_path / "root", tmp_path / "moved.csv", seconds=2, stay=False)
        stayed = sample(["dash"], tmp_path / "root", tmp_path / "stayed.csv", seconds=2, stay=True)
        only = tmp_path / "only-dash"  # a device whose only shell is dash
        only.mkdir()
        for tool in ("dash", "sleep", "mkfifo", "rm", "getconf", "printf", "ps"):
            if shutil.which(tool):
                (only / tool).symlink_to(shutil.which(tool))
        alone = sample(
            [str(only / "dash")],
            tmp_path / "root",
            tmp_path / "alone.csv",
            seconds=2,
            stay=False,
            env={"PATH": str(only)},
        )
    finally:
        w.stop.set()
        w.join()
    want = next((v for v in ("busybox", "mksh", "bash", "ksh") if shutil.which(v)), None)
    if want:
        assert (moved.pace, moved.pace_via) == ("readt", want)
    assert (stayed.pace, stayed.pace_via) == ("sleep", "")
    assert (alone.pace, alone.pace_via) == ("sleep", "")
    assert alone.reader == "sh", "no awk on that device: the shell reads"
    for tr in (moved, stayed, alone):
        assert len(tr.frame) >= 12, "about 10 Hz for 2 s, whichever way it paces"
        assert tr.frame["sys/class/power_supply/battery/current_now"].notna().all()


def _awks():
    """The awks this machine has (Debian's mawk, busybox's applet, gawk), each as a PATH dir whose `awk` is it."""
    out = [("default", None)]
    if shutil.which("busybox"):
        out.append(("busybox-awk", "busybox"))
    if shutil.which("gawk"):
        out.append(("gawk", "gawk"))
    return out


@pytest.mark.parametrize("awk", _awks(), ids=lambda a: a[0])
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_slow_sources_once_a_second_and_at_the_end_clock_per_cluster(tmp_path, shell, awk):
    """A phone has dozens of thermal zones: they are read every SLOW_MS (1 s) and at the last tick, their
    cells empty between; counters every tick. CPU clocks are read once per cpufreq policy (a cluster) and
    averaged over CPUs by the policy's related_cpus."""
    root = tmp_path / "root"
    for i in range(30):
        z = root / f"sys/class/thermal/thermal_zone{i}"
        z.mkdir(parents=True)
        _write(z / "type", f"zone{i}")
        _write(z / "temp", 30_000 + 100 * i)
    for pol, cpus, khz in (("policy0", "0 1 2 3", 1_000_000), ("policy4", "4 5", 2_500_000)):
        p = root / "sys/devices/system/cpu/cpufreq" / pol
        p.mkdir(parents=True)
        _write(p / "related_cpus", cpus)
        _write(p / "scaling_cur_freq", khz)
        _write(p / "cpuinfo_max_freq", 3_000_000)
    hot = root / "sys/class/thermal/thermal_zone29/temp"
    stop = threading.Event()

    def heat():  # the hottest zone climbs 20 °C a second
        t0 = time.monotonic()
        while not stop.is_set():
            _write(hot, int(40_000 + 20_000 * (time.monotonic() - t0)))
            time.sleep(0.01)

    th = threading.Thread(target=heat, daemon=True)
    th.start()
    env = dict(os.environ)
    if awk[1]:
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "awk").symlink_to(shutil.which(awk[1]))
        env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    try:
        tr = sample(shell, root, tmp_path / "t.csv", seconds=2.5, env=env)
    finally:
        stop.set()
        th.join()
    assert tr.reader == "awk"
    df = tr.frame
    assert tr.columns(cpufreq.FREQ_COLS) == [
        "sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq",
        "sys/devices/system/cpu/cpufreq/policy4/scaling_cur_freq",
    ]
    assert df[tr.columns(cpufreq.FREQ_COLS)].notna().all().all(), "clocks every tick"
    z = df["sys/class/thermal/thermal_zone29/temp"]
    read = df.index[z.notna()].tolist()
    assert read[0] == 0 and read[-1] == len(df) - 1, "first and last tick carry temperatures"
    assert read[:-1] == list(range(0, len(df) - 1, 10)), "and every 10th tick between"
    s = normalize.summarize(tr, [], None)
    rows = {r.metric: r for r in s.rows}
    assert rows["cpu_freq_mean"].value == pytest.approx((4 * 1.0e9 + 2 * 2.5e9) / 6)
    assert s.temp_start_c == pytest.approx(40, abs=2)
    # the end temperature is read at the last tick, not up to a second before it (the zone climbs 2 °C a tick)
    assert s.temp_end_c == z.iloc[-1] / 1000 and z.iloc[-1] > z[read[-2]] + 1500


class RailWriter(threading.Thread):
    """A Jetson's power monitor, as the sampler finds it. 'orin': the mainline ina3221 hwmon driver (bus
    voltage in1..3_input mV, labelled; curr1..3_input mA; in4..6 are shunt voltages); 'nano': L4T 32's
    iio driver (in_power0..2_input mW, rail_name_N, a space in one name). The board input rail's current
    ramps: I(t) = 1000 + 400·t mA at 5 V."""

    def __init__(self, root: Path, kind: str):
        super().__init__(daemon=True)
        self.kind, self.stop, self.t0 = kind, threading.Event(), time.monotonic()
        if kind == "orin":
            self.d = root / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
            self.d.mkdir(parents=True)
            _write(self.d / "name", "ina3221")
            for n, (lab, mv) in enumerate((("VDD_IN", 5000), ("VDD_CPU_GPU_CV", 5000), ("VDD_SOC", 5000)), 1):
                _write(self.d / f"in{n}_label", lab)
                _write(self.d / f"in{n}_input", mv)
                _write(self.d / f"in{n + 3}_input", 12)  # shunt voltage: no current of its own
        else:
            self.d = root / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
            self.d.mkdir(parents=True)
            for n, lab in enumerate(("POM 5V IN", "POM_5V_GPU", "POM_5V_CPU")):
                _write(self.d / f"rail_name_{n}", lab)
        self.tick()

    def tick(self):
        t = time.monotonic() - self.t0
        i_in = 1000 + 400 * t  # mA
        parts = (i_in, 0.3 * i_in, 0.2 * i_in)  # sub-rails: inside the input rail
        for n, i in enumerate(parts):
            if self.kind == "orin":
                _write(self.d / f"curr{n + 1}_input", int(i))
            else:
                _write(self.d / f"in_power{n}_input", int(5 * i))  # mW

    def run(self):
        while not self.stop.is_set():
            self.tick()
            time.sleep(0.005)


@pytest.mark.parametrize("kind", ["orin", "nano"])
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_jetson_power_rails_take_the_board_input_rail(tmp_path, shell, kind):
    """The energy is the board input rail's (VDD_IN / POM_5V_IN): the sub-rails are part of it, and
    adding them would count their power twice."""
    w = RailWriter(tmp_path / "root", kind)
    tr = sample_while(w, shell, tmp_path / "root", tmp_path / "t.csv", seconds=2.0)
    df = tr.frame
    t0, t1 = float(df["t_s"].iloc[0]), float(df["t_s"].iloc[-1])
    s = normalize.summarize(tr, [], (t0, t1))
    assert s.calibration["source"] == "power-rails" and s.calibration["method"] == "board input rail"
    assert list(s.calibration["rails"]) == ["VDD_IN" if kind == "orin" else "POM_5V_IN"]
    col = next(iter(s.calibration["rails"].values())).split("*")[-1]
    raw = df[col].astype(float).to_numpy()
    mw_per_unit = 5.0 if kind == "orin" else 1.0  # mA at 5 V, or mW
    analytic = np.trapezoid(raw * mw_per_unit / 1e3, df["t_s"].to_numpy(dtype=float))
    e = next(r for r in s.rows if r.metric == "energy" and r.phase == "cell").value
    assert e == pytest.approx(analytic, rel=0.01)
    # and against the ramp itself, 5 V × (1 + 0.4 t) A since the writer started (the sub-rails' 0.5 × on top
    # would put it above the bound)
    assert 5.0 < e / (t1 - t0) < 5 * (1 + 0.4 * (time.monotonic() - w.t0))


def test_rails_without_an_input_rail_are_summed_and_nc_left_out():
    """An AGX Orin's monitors name no board input rail: the rails are summed (and the row says so);
    an unconnected channel ('NC') is not a rail."""
    import pandas as pd

    h = "sys/class/hwmon/hwmon1"
    frame = pd.DataFrame(
        {
            "tick": [0, 1, 2],
            "t_s": [0.0, 0.1, 0.2],
            **{f"{h}/in{n}_input": [5000] * 3 for n in (1, 2, 3)},
            **{f"{h}/curr{n}_input": [c] * 3 for n, c in ((1, 400), (2, 200), (3, 100))},
        }
    )
    meta = {
        f"{h}/in{n}_input": {"kind": "hwmon_label", "label": lab}
        for n, lab in ((1, "VDD_GPU_SOC"), (2, "VDD_CPU_CV"), (3, "NC"))
    }
    kind, t, p, info = normalize.power_source(sampler_csv.SamplerTrace(frame, meta))
    assert info["method"] == "sum of rails" and list(info["rails"]) == ["VDD_GPU_SOC", "VDD_CPU_CV"]
    assert list(p) == pytest.approx([3.0] * 3)  # 5 V × (0.4 + 0.2) A


def test_a_cpu_clock_that_drops_during_the_cell_flags_it_throttled(tmp_path):
    """2.0 GHz for the first second, then the governor caps it at 1.2 GHz (thermal throttling)."""
    w = Writer(tmp_path / "root", rapl=False, battery=False)
    w.khz = lambda t: 2_000_000 if t < 1.0 else 1_200_000
    w.t0 = time.monotonic()
    tr = sample_while(w, SHELLS[0], tmp_path / "root", tmp_path / "t.csv", seconds=2.5)
    t0, t1 = float(tr.frame["t_s"].iloc[0]), float(tr.frame["t_s"].iloc[-1])
    s = normalize.summarize(tr, [], (t0, t1))
    rows = {(r.metric, r.phase): r for r in s.rows}
    assert s.throttled is True
    assert rows[("cpu_freq_min", "cell")].value == pytest.approx(1.2e9)
    assert 1.2e9 < rows[("cpu_freq_mean", "cell")].value < 2.0e9


@pytest.mark.parametrize("shell", SHELLS[:1], ids=lambda s: s[0])
def test_slices_of_a_run_carry_the_heated_zone(tmp_path, shell):
    """A sustained run's slices (phases asking for their temperature): each its hottest reading of the heated zone
    (2 °C a second) from the real sampler, later slices hotter; a slice between two of the sampler's slow reads
    (thermal zones: once a second) has none, and says so; the run's own phase asks none."""
    w = Writer(tmp_path / "root", rapl=False, battery=False)
    tr = sample_while(w, shell, tmp_path / "root", tmp_path / "t.csv", seconds=3.0)
    df = tr.frame
    zone = df["sys/class/thermal/thermal_zone0/temp"].astype(float) / 1000
    t = df["t_s"].astype(float)
    reads = t[zone.notna()].tolist()
    assert len(reads) >= 4, reads
    between = (reads[1] + (reads[2] - reads[1]) / 3, reads[2] - (reads[2] - reads[1]) / 3)
    slices = [
        normalize.Phase("tg16@0", "window", reads[0], reads[1], temperature=True),
        normalize.Phase("tg16@1", "window", *between, temperature=True),
        normalize.Phase("tg16@2", "window", reads[2], reads[3], temperature=True),
    ]
    s = normalize.summarize(
        tr, [*slices, normalize.Phase("tg16", "sustained", reads[0], reads[3])], (reads[0], reads[3])
    )
    temps = {r.test: r for r in s.rows if r.metric == "temp_max" and r.phase == "window"}
    assert list(temps) == [p.name for p in slices]
    for p in (slices[0], slices[2]):
        assert temps[p.name].value == zone[(t >= p.start) & (t <= p.end)].max() and temps[p.name].n == 2
    assert temps["tg16@2"].value > temps["tg16@0"].value + 1  # two reads later, at 2 °C a second
    assert (
        math.isnan(temps["tg16@1"].value) and "no temperature read inside this phase" in temps["tg16@1"].missing_reason
    )
    assert not [r for r in s.rows if r.metric == "temp_max" and r.phase == "sustained"]


@pytest.mark.parametrize("reader", ["awk", "sh"])
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_payload_that_ended_before_the_sampler_started_ends_it(tmp_path, shell, reader):
    """A payload that is a zombie at the sampler's first tick (it ended before the sampler started, its parent not
    yet waiting for it: a busy machine) ends the run at once. `kill -0` succeeds on a zombie, and the sampler had
    taken only a payload it once saw alive for gone: under load the gpu test's 0.6 s `sleep` ended first, and the
    sampler ran until its 30 s timeout (found beside the busy-loop suite)."""
    payload = subprocess.Popen(["true"])
    try:
        stat = Path(f"/proc/{payload.pid}/stat")
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # wait on the state: a zombie
            time.sleep(0.01)
        p = subprocess.run(
            [*shell, str(SAMPLER), "-o", str(tmp_path / "z.csv"), "-p", str(payload.pid), "-i", "100", "-S"],
            timeout=30,
            capture_output=True,
            text=True,
            env={**os.environ, **({"DEVICELAB_SAMPLER_NO_AWK": "1"} if reader == "sh" else {})},
        )
    finally:
        payload.wait()
    assert p.returncode == 0 and p.stderr == ""
    tr = sampler_csv.parse((tmp_path / "z.csv").read_text())
    assert tr.reader == reader
    assert len(tr.frame) == 1, "one tick, the last: nothing to sample of a payload already gone"
