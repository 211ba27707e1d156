"""Android's services, through `dumpsys` before and after each cell: battery (level, voltage, temperature, charge
counter, plugged), thermalservice (the overall thermal status, the HAL's temperatures) and power (is the screen
on?). Also the charging hygiene: `dumpsys battery unplug` for the measurement and `dumpsys battery reset`
afterwards, always — and at the next contact when the device was lost while unplugged."""

from __future__ import annotations

import re
from typing import Callable

from ...transports.base import Transport
from .base import DeviceAccess, ProbeView, Snapshot, Source, kv_lines, present, snapshot_values

TOOL = "dumpsys"
UNPLUGGED = "battery-unplugged"  # the ledger's device fact: set while a cell has it unplugged

ANDROID_BATTERY_STATUS = {1: "unknown", 2: "charging", 3: "discharging", 4: "not-charging", 5: "full"}


def battery(text: str) -> dict:
    """Android BatteryService dump. voltage is mV, temperature deci-°C, Charge counter µAh."""
    kv = kv_lines(text)
    num = lambda k: float(kv[k]) if k in kv and re.fullmatch(r"-?\d+(\.\d+)?", kv[k]) else None  # noqa: E731
    status = int(num("status")) if num("status") is not None else None
    plugged = any(kv.get(k) == "true" for k in ("AC powered", "USB powered", "Wireless powered", "Dock powered"))
    out = {
        "plugged": plugged,
        "updates_stopped": "UPDATES STOPPED" in text,  # after `dumpsys battery unplug`
        "status": ANDROID_BATTERY_STATUS.get(status, str(status)) if status is not None else None,
        "battery_level": (num("level") / num("scale")) if num("level") is not None and num("scale") else None,
        "battery_voltage": num("voltage") / 1e3 if num("voltage") is not None else None,
        "battery_temp": num("temperature") / 10 if num("temperature") is not None else None,
        "charge_counter_c": num("Charge counter") * 3.6e-3 if num("Charge counter") is not None else None,
        "technology": kv.get("technology"),
    }
    return out


_TEMP = re.compile(
    r"Temperature\{mValue=(?P<v>-?[\d.]+), mType=(?P<t>-?\d+), mName=(?P<n>[^,]+), mStatus=(?P<s>-?\d+)\}"
)


def thermalservice(text: str) -> dict:
    """Android ThermalManagerService dump: the overall thermal status (0 none … 6 shutdown) and the HAL's
    current temperatures (°C)."""
    m = re.search(r"Thermal Status:\s*(-?\d+)", text)
    cur = text.split("Current temperatures from HAL:", 1)
    section = cur[1].split("Current cooling devices", 1)[0] if len(cur) == 2 else text
    temps = [
        {"name": t["n"], "type": int(t["t"]), "value": float(t["v"]), "status": int(t["s"])}
        for t in _TEMP.finditer(section)
    ]
    return {
        "thermal_status": int(m.group(1)) if m else None,
        "temperatures": temps,
        "temp_max": max((t["value"] for t in temps), default=None),
    }


def power(text: str) -> dict:
    """Android PowerManagerService dump: is the screen on? (mWakefulness=Awake / Display Power: state=ON)."""
    m = re.search(r"mWakefulness=(\w+)", text)
    d = re.search(r"Display Power: state=(\w+)", text)
    on = None
    if m:
        on = m.group(1) == "Awake"
    elif d:
        on = d.group(1) == "ON"
    return {"screen_on": float(on) if on is not None else None}


def _battery_rows(d: dict) -> list[tuple[str, float]]:
    out = snapshot_values(d)
    if d.get("charge_counter_c") is not None:
        out.append(("charge_counter", d["charge_counter_c"]))
    return out


BATTERY, THERMAL, POWER = "dumpsys-battery", "dumpsys-thermalservice", "dumpsys-power"


class ChargingHygiene:
    """Context manager: on a device with dumpsys, stop charging updates for the measurement and always
    restore them — on success, failure or Ctrl-C. Where the restore cannot reach the device (the link went
    mid-cell, the host was killed) `pending(True)` stays the last word, so the next contact restores it
    (`restore_if_pending`): a phone is never left believing it is unplugged."""

    def __init__(self, t: Transport, tools: set[str], pending: Callable[[bool], None] | None = None):
        self.t, self.on = t, TOOL in tools
        self.pending = pending or (lambda on: None)
        self.unplugged = False

    def __enter__(self):
        if self.on:
            self.pending(True)
            self.unplugged = self.t.run([TOOL, "battery", "unplug"], timeout=30).rc == 0
        return self

    def __exit__(self, etype, e, tb):
        if self.on:
            try:
                restored = _reset(self.t)
            except Exception:
                if etype is None:
                    raise
                restored = False  # the cell's own error (the lost link) is the one to report
            if restored:
                self.pending(False)
        return False


def restore_if_pending(t: Transport, tools: set[str], pending: bool) -> bool:
    """First contact after a run that lost the device mid-cell: reset the battery service it left unplugged.
    True when it did."""
    return pending and TOOL in tools and _reset(t)


def _reset(t: Transport) -> bool:
    return t.run([TOOL, "battery", "reset"], timeout=30).rc == 0


class Android(Source):
    name = "android"
    title = "Android dumpsys battery/thermalservice"
    needs = "dumpsys (an Android device)"
    tools = (TOOL,)
    snapshots = (
        Snapshot(BATTERY, (TOOL, "battery"), battery, TOOL, _battery_rows),
        Snapshot(THERMAL, (TOOL, "thermalservice"), thermalservice, TOOL),
        Snapshot(POWER, (TOOL, "power"), power, TOOL),
    )

    def setup(self, d: DeviceAccess) -> str:
        if restore_if_pending(d.t, d.tools, bool(d.fact(UNPLUGGED))):
            d.set_fact(UNPLUGGED, False)
            d.note(
                f"{d.name}: charging state restored (dumpsys battery reset): an earlier run lost "
                "the device while it was set unplugged"
            )
        return ""

    def around(self, d: DeviceAccess) -> list:
        return [ChargingHygiene(d.t, d.tools, lambda on: d.set_fact(UNPLUGGED, on))] if TOOL in d.tools else []

    def check(self, start: dict, d: DeviceAccess) -> None:
        if start.get(POWER, {}).get("screen_on"):
            d.warn(
                "its screen is on: turn it off for measurements (the display draws power and heats the "
                "phone); its state is recorded with every cell",
                key="screen",
            )

    def rose(self, start: dict, end: dict) -> bool:
        ts0, ts1 = start.get(THERMAL, {}).get("thermal_status"), end.get(THERMAL, {}).get("thermal_status")
        return ts0 is not None and ts1 is not None and ts1 > ts0  # Android's thermal status rose

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        return present(TOOL, v)


SOURCE = Android()
