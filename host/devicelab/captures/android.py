"""What Android phones print, through the lab's own Android code: the battery and thermal services' dumps (the
snapshot parsers a cell runs before and after), the memory service's Free RAM (the RAM budget at first contact),
and a full `getprop` listing (device_payloads/facts.sh asking `getprop KEY`, then facts.parse)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from .. import budget
from ..telemetry.sources import android
from . import Missing, Unsupported, _sysfs, reader

BATTERY_FIGURES = ("battery_level", "battery_voltage", "battery_temp", "charge_counter_c")
# the facts the lab keeps of an Android device, from its properties (device_payloads/facts.sh)
ANDROID_FACTS = ("os", "android.model", "android.manufacturer", "android.soc", "android.abi")


@reader(android.BATTERY)
def battery_capture(path: Path) -> dict[str, Any]:
    """The battery service's dump as a cell's snapshot parse gives it (android.battery): SI units, and each figure
    the device does not support missing with its reason."""
    text = path.read_text(errors="replace")
    if "level:" not in text:
        raise Unsupported("no battery service state in this capture (no `level:` line)")
    d = android.battery(text)
    out: dict[str, Any] = {k: d[k] for k in ("plugged", "status", "technology")}
    for k in BATTERY_FIGURES:
        out[k] = Missing(d["missing"][k]) if k in d["missing"] else d[k]
    return out


@reader(android.THERMAL)
def thermalservice_capture(path: Path) -> dict[str, Any]:
    """The thermal service's dump (android.thermalservice): its status, the HAL's hottest temperature (°C) and how
    many of the HAL's entries are temperatures and how many are not (battery current limiting: V, mA, %)."""
    d = android.thermalservice(path.read_text(errors="replace"))
    if d["thermal_status"] is None and not d["temperatures"]:
        raise Unsupported("no `Thermal Status:` line and no Temperature{…} entry: not a thermal service dump")
    temps = [t for t in d["temperatures"] if t["temperature"]]
    hottest = max(temps, key=lambda t: t["value"], default=None)
    return {
        "thermal_status": d["thermal_status"] if d["thermal_status"] is not None else Missing("no Thermal Status"),
        "temp_max": d["temp_max"] if d["temp_max"] is not None else Missing("no current temperature from the HAL"),
        "hottest": hottest["name"] if hottest else Missing("no current temperature from the HAL"),
        "temperatures": len(temps),
        "other_entries": len(d["temperatures"]) - len(temps),
    }


@reader(android.MEMINFO)
def meminfo_capture(path: Path) -> dict[str, Any]:
    """The memory service's dump as facts.sh keeps it (its first `Free RAM:` line, `grep -m1`), then the phone's RAM
    budget from those facts (budget.from_facts). A dump without a readable Free RAM line (one app's dump) is
    refused with the reason the budget would give for falling back to MemAvailable."""
    line = next((s for s in path.read_text(errors="replace").splitlines() if "Free RAM:" in s), "")
    f = {"os": "Android", "mem.dumpsys_free": line.strip()}
    b = budget.from_facts(f)
    free_kb = budget.dumpsys_free_kb(f["mem.dumpsys_free"])
    if free_kb is None:
        raise Unsupported(f"the RAM budget cannot use it: {budget.no_free_ram(f)}")
    return {"free_ram_bytes": free_kb * 1024, "ram_budget_bytes": b.bytes, "ram_budget_source": b.source}


_PROP = re.compile(r"^\[([^\]\n]+)\]: \[(.*?)\]$", re.M | re.S)


def props(text: str) -> dict[str, str]:
    """`getprop`'s listing → {key: value} (a value may span lines; a capture saved on Windows has CRLF)."""
    return {k: v for k, v in _PROP.findall(text.replace("\r\n", "\n"))}


_GETPROP = """#!/bin/sh
# stand-in for Android's getprop, answering from a real device's published `getprop` listing (one file a key)
[ $# -eq 0 ] && exec cat "{listing}"
case $1 in */*) exit 0 ;; esac
[ -f "{dir}/$1" ] && cat "{dir}/$1"
exit 0
"""


@reader("getprop")
def getprop_capture(path: Path) -> dict[str, Any]:
    """A full `adb shell getprop` listing, fed to the lab's own first contact: device_payloads/facts.sh runs with a
    test double of `getprop` on PATH that answers `getprop KEY` from this real capture (each value as the phone
    printed it), and facts.parse reads what facts.sh printed. Gives the facts the lab keeps of an Android device."""
    p = props(path.read_bytes().decode("utf-8", errors="replace"))
    if not p.get("ro.build.version.release"):
        raise Unsupported("no [ro.build.version.release] in this listing: not a full `getprop` of an Android device")
    with tempfile.TemporaryDirectory(prefix="devicelab-getprop-") as d:
        base = Path(d)
        (base / "props").mkdir()
        for k, v in p.items():
            if "/" not in k:
                (base / "props" / k).write_text(v + "\n")
        (base / "listing").write_bytes(path.read_bytes())
        f = _sysfs.device_facts({}, {"getprop": _GETPROP.format(listing=base / "listing", dir=base / "props")})
    return {k: f.get(k, Missing("facts.sh printed no such line")) for k in ANDROID_FACTS}
