"""Once-per-cell snapshots taken through the transport before and after a cell: Android's dumpsys
battery / thermalservice, macOS's ioreg / pmset. Raw text is kept with the cell's artifacts; the parsed
values become rows. Also the charging hygiene on Android: `dumpsys battery unplug` for the measurement
and `dumpsys battery reset` afterwards, always."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..schema import Row
from ..transports.base import Transport
from . import parsers

SOURCES = [
    # name, argv, parser, which facts key says it exists
    ("dumpsys-battery", ["dumpsys", "battery"], parsers.dumpsys_battery, "dumpsys"),
    ("dumpsys-thermalservice", ["dumpsys", "thermalservice"], parsers.dumpsys_thermalservice, "dumpsys"),
    ("dumpsys-power", ["dumpsys", "power"], parsers.dumpsys_power, "dumpsys"),
    ("ioreg-battery", ["ioreg", "-rn", "AppleSmartBattery"], parsers.ioreg_battery, "ioreg"),
    ("pmset-batt", ["pmset", "-g", "batt"], parsers.pmset_batt, "pmset"),
    ("pmset-therm", ["pmset", "-g", "therm"], parsers.pmset_therm, "pmset"),
]
ROW_KEYS = {"battery_level", "battery_voltage", "battery_current", "battery_power", "battery_temp",
            "thermal_status", "cpu_speed_limit", "screen_on"}


def available(t: Transport) -> set[str]:
    r = t.sh('for c in dumpsys ioreg pmset nvidia-smi; do command -v "$c" >/dev/null 2>&1 && echo "$c"; done')
    return set(r.stdout.split())


def powermetrics_access(t: Transport) -> str:
    """How this Mac lets the SSH user run powermetrics (it needs root): 'root', 'sudo' (a NOPASSWD sudoers
    rule for it: `sudo -n -l` says so without running it), or '' (not available: no SoC energy figures)."""
    r = t.sh('command -v powermetrics >/dev/null 2>&1 || exit 0; '
             'if [ "$(id -u)" = 0 ]; then echo root; elif sudo -n -l powermetrics >/dev/null 2>&1; then echo sudo; fi')
    out = r.stdout.strip()
    return out if out in ("root", "sudo") else ""


def take(t: Transport, tools: set[str], when: str, artifacts: Path) -> dict:
    """Run the snapshot commands the device has; their raw text goes to the cell's artifacts
    (NAME.WHEN.txt), where `from_artifacts` reads it back; returns the parsed values by source."""
    parsed = {}
    for name, argv, parse, needs in SOURCES:
        if needs not in tools:
            continue
        r = t.run(argv, timeout=30)
        if r.rc != 0:
            continue
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / f"{name}.{when}.txt").write_text(r.stdout)
        parsed[name] = parse(r.stdout)
    return parsed


def from_artifacts(artifacts: Path, when: str) -> tuple[list[Row], dict]:
    """Rows and parsed values of the snapshots a cell stored (pure but for reading its files)."""
    rows, parsed = [], {}
    for name, _argv, parse, _needs in SOURCES:
        f = artifacts / f"{name}.{when}.txt"
        if not f.is_file():
            continue
        d = parse(f.read_text(errors="replace"))
        parsed[name] = d
        for k, v in d.items():
            if k in ROW_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
                rows.append(Row(metric=k, value=float(v), phase=f"snapshot_{when}", test=name))
        if name == "dumpsys-battery" and d.get("charge_counter_c") is not None:
            rows.append(Row(metric="charge_counter", value=d["charge_counter_c"], phase=f"snapshot_{when}", test=name))
    return rows, parsed


class ChargingHygiene:
    """Context manager: on a device with dumpsys, stop charging updates for the measurement and always
    restore them — on success, failure or Ctrl-C. Where the restore cannot reach the device (the link went
    mid-cell, the host was killed) `pending(True)` stays the last word, so the next contact restores it
    (`restore_if_pending`): a phone is never left believing it is unplugged."""

    def __init__(self, t: Transport, tools: set[str], pending: Callable[[bool], None] | None = None):
        self.t, self.on = t, "dumpsys" in tools
        self.pending = pending or (lambda on: None)
        self.unplugged = False

    def __enter__(self):
        if self.on:
            self.pending(True)
            self.unplugged = self.t.run(["dumpsys", "battery", "unplug"], timeout=30).rc == 0
        return self

    def __exit__(self, etype, e, tb):
        if self.on:
            try:
                restored = _reset(self.t)
            except Exception:
                if etype is None:
                    raise
                restored = False       # the cell's own error (the lost link) is the one to report
            if restored:
                self.pending(False)
        return False


def restore_if_pending(t: Transport, tools: set[str], pending: bool) -> bool:
    """First contact after a run that lost the device mid-cell: reset the battery service it left unplugged.
    True when it did."""
    return pending and "dumpsys" in tools and _reset(t)


def _reset(t: Transport) -> bool:
    return t.run(["dumpsys", "battery", "reset"], timeout=30).rc == 0
