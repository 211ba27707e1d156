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


_NODE = re.compile(r"^[\s|]*\+-o (\S+)\s", re.M)
_PROP = re.compile(r'^[\s|]*"(\w+)" = (.+)$', re.M)


def ioreg_props(text: str, node: str = "AppleSmartBattery") -> dict[str, str]:
    """Top-level `"Key" = value` properties of one registry entry as ioreg prints it: `ioreg -rn NODE` (the entry
    alone), or a whole `ioreg -l` tree (its `| |` prefixes; only NODE's own block is read, the other entries' keys
    are not its own)."""
    heads = list(_NODE.finditer(text))
    mine = [i for i, m in enumerate(heads) if m.group(1) == node]
    if mine:
        i = mine[0]
        text = text[heads[i].end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
    return {m.group(1): m.group(2).strip() for m in _PROP.finditer(text)}


def ioreg_battery(text: str) -> dict:
    """macOS `ioreg -rn AppleSmartBattery`: Voltage mV, InstantAmperage/Amperage mA (negative while
    discharging), Temperature centi-°C. CurrentCapacity/MaxCapacity share one unit, whichever it is: a percent on
    Apple silicon (MaxCapacity 100; the mAh are AppleRawCurrentCapacity/AppleRawMaxCapacity), mAh on Intel Macs
    (no AppleRaw* keys before macOS 10.15 or so): the level is their ratio either way."""
    kv = ioreg_props(text)
    ints = {k: _ioreg_int(v) for k, v in kv.items() if re.fullmatch(r"\d+", v)}
    amp = ints.get("InstantAmperage", ints.get("Amperage"))
    volt = ints.get("Voltage")
    cur = -amp / 1e3 if amp is not None else None  # our convention: positive = discharging
    cap, mx = ints.get("CurrentCapacity"), ints.get("MaxCapacity")
    level = cap / mx if cap is not None and mx else None
    percent = mx == 100  # Apple silicon: a percent; an Intel Mac's MaxCapacity is its full charge in mAh
    full_mah = ints.get("AppleRawMaxCapacity", mx if mx is not None and not percent else None)
    now_mah = ints.get("AppleRawCurrentCapacity", cap if cap is not None and not percent else None)
    return {
        "battery_voltage": volt / 1e3 if volt is not None else None,
        "battery_current": cur,
        "battery_power": (cur * volt / 1e3) if cur is not None and volt is not None else None,
        "battery_level": level,
        "battery_temp": ints["Temperature"] / 100 if "Temperature" in ints else None,
        "battery_full_mah": full_mah,
        "battery_charge_mah": now_mah,
        "battery_design_mah": ints.get("DesignCapacity"),
        "plugged": kv.get("ExternalConnected") == "Yes" if "ExternalConnected" in kv else None,
        "charging": kv.get("IsCharging") == "Yes" if "IsCharging" in kv else None,
        "raw_current_unit": "mA",
        "raw_capacity_unit": "%" if percent else ("mAh" if mx is not None else None),
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
        # Apple silicon's pmset has never recorded one ("No CPU power status has been recorded"): no speed limit
        "cpu_power_status": False if "No CPU power status has been recorded" in text else (True if limit else None),
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
