"""A Mac's battery and thermal state before and after each cell: `ioreg -rn AppleSmartBattery` (voltage, current,
level, temperature, plugged), `pmset -g batt` (power source, level) and `pmset -g therm` (the CPU speed limit and
thermal warning level)."""

from __future__ import annotations

import re

from .base import ProbeView, Snapshot, Source, kv_lines, present

IOREG, PMSET = "ioreg", "pmset"


def _ioreg_int(v: str) -> int:
    n = int(v)
    return n - (1 << 64) if n >= (1 << 63) else n  # ioreg prints signed currents as unsigned 64-bit


def ioreg_battery(text: str) -> dict:
    """macOS `ioreg -rn AppleSmartBattery`: Voltage mV, InstantAmperage/Amperage mA (negative while
    discharging), Temperature centi-°C, capacities in % or mAh."""
    kv = {}
    for m in re.finditer(r'^\s*"(\w+)" = (.+)$', text, re.M):
        kv[m.group(1)] = m.group(2).strip()
    ints = {k: _ioreg_int(v) for k, v in kv.items() if re.fullmatch(r"\d+", v)}
    amp = ints.get("InstantAmperage", ints.get("Amperage"))
    volt = ints.get("Voltage")
    cur = -amp / 1e3 if amp is not None else None  # our convention: positive = discharging
    cap, mx = ints.get("CurrentCapacity"), ints.get("MaxCapacity")
    level = (
        (cap / mx) if cap is not None and mx and mx <= 100 else (cap / 100 if cap is not None and cap <= 100 else None)
    )
    return {
        "battery_voltage": volt / 1e3 if volt is not None else None,
        "battery_current": cur,
        "battery_power": (cur * volt / 1e3) if cur is not None and volt is not None else None,
        "battery_level": level,
        "battery_temp": ints["Temperature"] / 100 if "Temperature" in ints else None,
        "plugged": kv.get("ExternalConnected") == "Yes",
        "charging": kv.get("IsCharging") == "Yes",
        "raw_current_unit": "mA",
    }


def pmset_batt(text: str) -> dict:
    src = re.search(r"Now drawing from '([^']+)'", text)
    m = re.search(r"(\d+)%;\s*([^;]+);\s*([^\n]*)", text)
    return {
        "power_source": src.group(1) if src else None,
        "battery_level": int(m.group(1)) / 100 if m else None,
        "status": m.group(2).strip() if m else None,
        "remaining": m.group(3).split(" present")[0].strip() if m else None,
        "plugged": bool(src and "AC" in src.group(1)),
    }


def pmset_therm(text: str) -> dict:
    kv = kv_lines(text, "=")
    limit = kv.get("CPU_Speed_Limit")
    warn = re.search(r"[Tt]hermal warning level (?:set to|is) (\d+)", text)
    return {
        "cpu_speed_limit": int(limit) / 100 if limit and limit.isdigit() else None,
        "cpu_available": int(kv["CPU_Available_CPUs"]) if kv.get("CPU_Available_CPUs", "").isdigit() else None,
        "thermal_warning_level": int(warn.group(1)) if warn else (0 if "No thermal warning" in text else None),
    }


class Mac(Source):
    name = "mac-battery"
    title = "macOS ioreg AppleSmartBattery"
    needs = "ioreg and pmset (a Mac)"
    tools = (IOREG, PMSET)
    snapshots = (
        Snapshot("ioreg-battery", (IOREG, "-rn", "AppleSmartBattery"), ioreg_battery, IOREG),
        Snapshot("pmset-batt", (PMSET, "-g", "batt"), pmset_batt, PMSET),
        Snapshot("pmset-therm", (PMSET, "-g", "therm"), pmset_therm, PMSET),
    )

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        return present(IOREG, v)


SOURCE = Mac()
