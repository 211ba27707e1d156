"""Android dumpsys and macOS ioreg/pmset snapshots, parsed into the schema. The fixtures are written from
the formats' documentation and public dumps (AOSP BatteryService/ThermalManagerService dump code,
macOS ioreg/pmset output); no phone or Mac is attached here."""

import os
import stat

import pytest
from conftest import FIXTURES

from devicelab.telemetry import snapshots
from devicelab.telemetry.sources import android, mac
from devicelab.transports.local import LocalTransport

S = FIXTURES / "snapshots"


def test_dumpsys_battery_units():
    d = android.battery((S / "dumpsys-battery.txt").read_text())
    assert d["plugged"] is True and d["status"] == "charging" and d["updates_stopped"] is False
    assert d["battery_level"] == pytest.approx(0.85)
    assert d["battery_voltage"] == pytest.approx(4.273)  # mV → V
    assert d["battery_temp"] == pytest.approx(28.3)  # deci-°C → °C
    assert d["charge_counter_c"] == pytest.approx(2755000 * 3.6e-3)  # µAh → C
    u = android.battery((S / "dumpsys-battery-unplugged.txt").read_text())
    assert u["updates_stopped"] is True and u["plugged"] is False and u["status"] == "discharging"


def test_dumpsys_thermalservice():
    d = android.thermalservice((S / "dumpsys-thermalservice.txt").read_text())
    assert d["thermal_status"] == 2
    assert [t["name"] for t in d["temperatures"]] == ["cpu0-silver-usr", "cpu4-gold-usr", "battery", "skin"]
    assert d["temp_max"] == pytest.approx(47.9)


def test_ioreg_signed_current_and_units():
    d = mac.ioreg_battery((S / "ioreg-AppleSmartBattery.txt").read_text())
    # InstantAmperage 18446744073709550371 is -1245 mA as unsigned 64-bit: discharging → +1.245 A
    assert d["battery_current"] == pytest.approx(1.245)
    assert d["battery_voltage"] == pytest.approx(12.739)
    assert d["battery_power"] == pytest.approx(1.245 * 12.739)
    assert d["battery_temp"] == pytest.approx(30.51)
    assert d["battery_level"] == pytest.approx(0.87) and d["plugged"] is False


def test_pmset():
    b = mac.pmset_batt((S / "pmset-batt.txt").read_text())
    assert b == {
        "power_source": "Battery Power",
        "battery_level": 0.87,
        "status": "discharging",
        "remaining": "5:12 remaining",
        "plugged": False,
    }
    assert mac.pmset_batt((S / "pmset-batt-ac.txt").read_text())["plugged"] is True
    assert mac.pmset_therm((S / "pmset-therm.txt").read_text())["thermal_warning_level"] == 0
    lim = mac.pmset_therm((S / "pmset-therm-limited.txt").read_text())
    assert lim["cpu_speed_limit"] == pytest.approx(0.72) and lim["cpu_available"] == 10


def _fake_tool(bindir, name, log, answer):
    p = bindir / name
    p.write_text(f'#!/bin/sh\necho "$0 $*" >> {log}\ncat {answer}\n')
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def test_snapshots_and_charging_hygiene_always_reset(tmp_path, monkeypatch):
    """A stand-in `dumpsys` on PATH (there is no Android here) records how it is called: the hygiene must
    unplug before and reset after, even when the cell fails."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    _fake_tool(bindir, "dumpsys", log, S / "dumpsys-battery-unplugged.txt")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    t = LocalTransport("phone-standin", root=str(tmp_path / "wd"))
    tools = snapshots.available(t)
    assert "dumpsys" in tools
    with pytest.raises(RuntimeError), android.ChargingHygiene(t, tools):
        snapshots.take(t, tools, "start", tmp_path / "art")
        raise RuntimeError("cell failed")
    calls = [l.split(" ", 1)[1] for l in log.read_text().splitlines()]
    assert calls[0] == "battery unplug" and calls[-1] == "battery reset"
    rows, parsed = snapshots.from_artifacts(tmp_path / "art", "start")  # what a cell's rows are made from
    by = {r.metric: r for r in rows}
    assert by["battery_voltage"].value == pytest.approx(4.102) and by["battery_voltage"].unit == "V"
    assert (tmp_path / "art" / "dumpsys-battery.start.txt").exists()


def test_a_reset_that_cannot_reach_the_phone_stays_pending(tmp_path, monkeypatch):
    """The reset fails (here a stand-in dumpsys that exits 1 on it; on a phone: the link is gone): the cell's
    own error propagates, the unplugged state stays on record, and the next contact resets it."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    tool = bindir / "dumpsys"
    flag = tmp_path / "link-down"
    tool.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$2" = reset ] && [ -e {flag} ] && exit 1\nexit 0\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    t = LocalTransport("phone-standin", root=str(tmp_path / "wd"))
    state = []
    flag.touch()
    with pytest.raises(RuntimeError, match="link lost"), android.ChargingHygiene(t, {"dumpsys"}, pending=state.append):
        raise RuntimeError("link lost")
    assert state == [True]
    assert not android.restore_if_pending(t, {"dumpsys"}, pending=False)
    flag.unlink()
    assert android.restore_if_pending(t, {"dumpsys"}, pending=True)
    with android.ChargingHygiene(t, {"dumpsys"}, pending=state.append):
        pass
    assert state == [True, True, False]
    assert log.read_text().splitlines() == [
        "battery unplug",
        "battery reset",
        "battery reset",
        "battery unplug",
        "battery reset",
    ]


def test_dumpsys_power_screen_state():
    assert android.power("  mWakefulness=Awake\n")["screen_on"] == 1.0
    assert android.power("  mWakefulness=Asleep\n")["screen_on"] == 0.0
    assert android.power("Display Power: state=OFF\n")["screen_on"] == 0.0
    assert android.power("nothing here")["screen_on"] is None
