"""Android's services, through `dumpsys` before and after each cell: battery (level, voltage, temperature, charge
counter, plugged), thermalservice (the overall thermal status, the HAL's temperatures) and power (is the screen
on?). Also the charging hygiene: `dumpsys battery unplug` for the measurement and `dumpsys battery reset`
afterwards, always — and at the next contact when the device was lost while unplugged."""

from __future__ import annotations

import re
from typing import Any, Callable

from ...transports.base import Transport
from .base import DeviceAccess, ProbeView, Snapshot, Source, kv_lines, present, snapshot_values

TOOL = "dumpsys"
UNPLUGGED = "battery-unplugged"  # the ledger's device fact: set while a cell has it unplugged

ANDROID_BATTERY_STATUS = {1: "unknown", 2: "charging", 3: "discharging", 4: "not-charging", 5: "full"}


# A phone's or tablet's battery, full, in mAh: what a charge counter can imply (rugged phones reach 22,000 mAh)
PLAUSIBLE_FULL_MAH = (500.0, 30_000.0)
# a lithium cell's terminal voltage (V): where a counter in a vendor's mAh is believed (the ABI's µAh needs no check)
CELL_VOLTS = (2.5, 4.6)
# Temperature.java: BCL (battery current limiting) monitors the thermal HAL lists among its temperatures — volts,
# milliamps, percent — are not temperatures
NOT_TEMPERATURE_TYPES = {6: "BCL_VOLTAGE", 7: "BCL_CURRENT", 8: "BCL_PERCENTAGE"}


def battery(text: str) -> dict:
    """Android BatteryService dump (BatteryService.dumpInternal): voltage mV, temperature deci-°C, `Charge counter`
    batteryChargeCounterUah (µAh by the health HAL's contract). Figures in SI units; a figure the device does not
    support is None with its reason under `missing` (never a measured zero):

    - `Charge counter: 0` (or absent): the HAL has no counter (tests/fixtures/real/dumpsys-battery/pixel-c-…);
    - `voltage: 0`: no voltage reading; `temperature: 0` with no voltage either: no battery readings at all
      (…/appium-2016-no-readings); a temperature of 0 beside a real voltage is kept (a cold phone);
    - `present: false`: no battery, every battery figure is missing;
    - the counter's unit, decided by what the device says: µAh unless the full charge it implies (counter / level)
      is impossible for a battery (< 500 mAh) while as mAh it is plausible (500–30,000 mAh) on a lithium cell's
      voltage — a vendor HAL in mAh (…/redmi-note-14-hyperos3: 4274 at 80 % on a 5,500 mAh phone is 5.3 Ah as
      mAh, 5.3 mAh as µAh). Plausible in neither: missing (…/emulator-avd-2021: 10000 at 100 % beside 5.0 V)."""
    kv = kv_lines(text)
    num = lambda k: float(kv[k]) if k in kv and re.fullmatch(r"-?\d+(\.\d+)?", kv[k]) else None
    status_n, level_n, scale = num("status"), num("level"), num("scale")
    status = int(status_n) if status_n is not None else None
    plugged = any(kv.get(k) == "true" for k in ("AC powered", "USB powered", "Wireless powered", "Dock powered"))
    level = (level_n / scale) if level_n is not None and scale else None
    volts, deci = num("voltage"), num("temperature")
    missing: dict[str, str] = {}
    if kv.get("present") == "false":
        missing.update(dict.fromkeys(("battery_level", "battery_voltage", "battery_temp", "charge_counter_c"),
                                     "no battery present (present: false)"))  # fmt: skip
    if volts == 0:
        missing.setdefault("battery_voltage", "not supported by this device (voltage: 0)")
    if deci == 0 and not volts:
        missing.setdefault("battery_temp", "not supported by this device (temperature: 0, and no voltage either)")
    for k, raw, reason in (
        ("battery_voltage", volts, "no voltage line"),
        ("battery_temp", deci, "no temperature line"),
    ):
        if raw is None:
            missing.setdefault(k, reason)
    counter = None
    if "charge_counter_c" not in missing:
        counter, why = _charge_counter_c(num("Charge counter"), level, volts / 1e3 if volts else None)
        if counter is None:
            missing["charge_counter_c"] = why
    value = {"battery_level": level, "battery_voltage": volts / 1e3 if volts is not None else None,
             "battery_temp": deci / 10 if deci is not None else None, "charge_counter_c": counter}  # fmt: skip
    return {
        "plugged": plugged,
        "updates_stopped": "UPDATES STOPPED" in text,  # after `dumpsys battery unplug`
        "status": ANDROID_BATTERY_STATUS.get(status, str(status)) if status is not None else None,
        **{k: (None if k in missing else v) for k, v in value.items()},
        "technology": kv.get("technology"),
        "missing": missing,
    }


def _charge_counter_c(raw: float | None, level: float | None, volts: float | None) -> tuple[float | None, str]:
    """`Charge counter` in coulombs and, when it cannot be had, why (see `battery`)."""
    if raw is None:
        return None, "not reported (no Charge counter line)"
    if raw <= 0:
        return None, f"not supported by this device (Charge counter: {raw:g})"
    if not level or level < 0.05:
        return raw * 3.6e-3, ""  # too little charge to tell the unit by: the contract's µAh
    lo, hi = PLAUSIBLE_FULL_MAH
    full_if_uah, full_if_mah = raw / 1e3 / level, raw / level
    cell = volts is not None and CELL_VOLTS[0] <= volts <= CELL_VOLTS[1]
    if lo <= full_if_uah <= hi:
        return raw * 3.6e-3, ""  # µAh → C
    if full_if_uah < lo and lo <= full_if_mah <= hi and cell:
        return raw * 3.6, ""  # mAh → C (a vendor HAL's unit)
    return None, (
        f"implausible in either unit: Charge counter {raw:g} at {level:.0%} implies a full charge of "
        f"{full_if_uah:.3g} mAh as µAh, {full_if_mah:.0f} mAh as mAh"
        + ("" if cell else f" (and {volts} V is no lithium cell's voltage)")
    )


_TEMP = re.compile(
    r"Temperature\{mValue=(?P<v>-?[\d.]+(?:E-?\d+)?|NaN), mType=(?P<t>-?\d+), mName=(?P<n>[^,]+), "
    r"mStatus=(?P<s>-?\d+)\}"
)


def _hal_section(text: str) -> str:
    """The HAL's current temperatures (up to the next header line: `Current cooling devices from HAL:` …); without
    that section (HAL not ready), the whole dump less its `Cached temperatures` (the last ones notified: stale)."""
    cur = text.split("Current temperatures from HAL:", 1)
    if len(cur) == 2:
        return re.split(r"^\s*[A-Za-z][^{}\n]*:\s*$", cur[1], maxsplit=1, flags=re.M)[0]
    return re.sub(r"Cached temperatures:[ \t]*\n(?:[ \t]*Temperature\{[^\n]*\n?)*", "", text)


def thermalservice(text: str) -> dict:
    """Android ThermalManagerService dump: the overall thermal status (0 none … 6 shutdown) and the HAL's current
    temperatures (°C). The maximum counts only temperatures: entries of the BCL types (Temperature.TYPE_BCL_VOLTAGE,
    _CURRENT, _PERCENTAGE: volts, milliamps, percent) are listed but not counted (a Tensor Pixel lists a GPU
    current limit of 11900 among them), nor are values below absolute zero (a HAL's -FLT_MAX for 'no reading')."""
    m = re.search(r"Thermal Status:\s*(-?\d+)", text)
    temps: list[dict[str, Any]] = [
        {"name": t["n"], "type": int(t["t"]), "value": float(t["v"]), "status": int(t["s"])}
        for t in _TEMP.finditer(_hal_section(text))
    ]
    for t in temps:
        t["temperature"] = t["type"] not in NOT_TEMPERATURE_TYPES and t["value"] >= -273.15
    return {
        "thermal_status": int(m.group(1)) if m else None,
        "temperatures": temps,
        "temp_max": max((t["value"] for t in temps if t["temperature"]), default=None),
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
MEMINFO = "dumpsys-meminfo"  # not a snapshot: the RAM budget reads its Free RAM at first contact (budget.py)


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
