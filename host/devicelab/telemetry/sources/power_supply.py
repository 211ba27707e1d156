"""The battery as Linux shows it (/sys/class/power_supply/*/ of type Battery, read by the sampler every tick):
power from current_now × voltage_now (or power_now), in our sign convention (positive while discharging).

The unit of current_now: the kernel's power-supply ABI (Documentation/ABI/testing/sysfs-class-power) says µA, as
it says µV for voltage_now and µAh / µWh for charge_now / energy_now. Some vendors deviate (Samsung's sec_battery
reports current_now in mA beside voltage_now in µV and a charge_now that is its charging mode). The unit is taken,
best first, from a calibration against the battery's own counter where it moved during the cell; else from an
earlier cell's calibration on this device; else from what the device says: the driver's own µA file beside it
(Samsung's batt_current_ua_now), else the ABI's µA unless the same driver's other files break the ABI (voltage_now
not in µV, a charge or energy far below any battery's at its reported level). The magnitude of the current alone
never decides between µA and mA for a driver that follows the ABI: a phone on USB at 3.7 mA reads 3700, as a
trickle at full reads −25000, and neither is 3.7 A or 25 A. Where nothing can decide, the power is missing with
the reason, until a counter calibrates it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..sampler_csv import SamplerTrace
from ..units import voltage_to_v
from .base import Energy, ProbeView, Source

UNITS_TO_A = (("uA", 1e-6), ("mA", 1e-3), ("A", 1.0))
SCALE_TO_A = dict(UNITS_TO_A)

# battery counters that can calibrate current_now, best first: (sysfs name, kind). charge_* are µAh
# (the power_supply ABI), energy_now µWh
COUNTERS = (("charge_counter", "charge"), ("charge_now", "charge"), ("energy_now", "energy"))

# the driver's own µA reading beside current_now (Samsung's sec_battery: batt_current_ua_now, where current_now is mA)
UA_FILES = ("batt_current_ua_now",)

# a level (%) from which a charge_now (µAh) or energy_now (µWh) below this is no battery's: 10 mAh, 10 mWh
LEVEL_FOR_CHECK, LEAST_ABI_STORE = 5.0, 1e4


def batteries(tr: SamplerTrace) -> list[str]:
    """The folders of the batteries the sampler read."""
    return [d for d, m in tr.meta.items() if m.get("kind") == "power_supply" and m.get("type", "").lower() == "battery"]


def _median_abs(series: pd.Series | None) -> float | None:
    """|median| of a column's numeric values (empty cells of a slow source left out); None without any."""
    if series is None:
        return None
    v = pd.to_numeric(series, errors="coerce").dropna()
    return float(v.abs().median()) if len(v) else None


def abi_breaches(df: pd.DataFrame, d: str) -> dict[str, str]:
    """The files of battery folder `d` whose values break the power-supply ABI's units, with what is wrong:
    voltage_now not in µV, a charge_now (µAh) or energy_now (µWh) far below any battery's at its reported level
    (Samsung's charge_now is its charging mode, 0–4). A driver that breaks the ABI in one file is not taken on the
    ABI's word for current_now either."""
    out = {}
    v = _median_abs(df.get(f"{d}/voltage_now"))
    if v is not None and 0 < v < 1e5:
        out["voltage_now"] = f"voltage_now {v:g} is not in µV"
    level = _median_abs(df.get(f"{d}/capacity"))
    if level is not None and level >= LEVEL_FOR_CHECK:
        for name, unit in (("charge_now", "µAh"), ("energy_now", "µWh")):
            x = _median_abs(df.get(f"{d}/{name}"))
            if x is not None and x < LEAST_ABI_STORE:
                out[name] = f"{name} {x:g} at {level:g} % is no {unit} figure"
    return out


def _discharging(df: pd.DataFrame, d: str) -> bool:
    """Does the battery say it is discharging (most of its status reads)?"""
    status = df.get(f"{d}/status")
    if status is None:
        return False
    status = status[status.astype(str) != ""]  # a slow source: read once a second, empty between
    return bool(len(status)) and (status.astype(str).str.lower() == "discharging").mean() > 0.5


def current_unit(df: pd.DataFrame, d: str, raw: pd.Series) -> tuple[str | None, str]:
    """The unit of battery `d`'s current_now where no counter calibrated it, from what the device says:
    (unit, how) or (None, why it cannot be told)."""
    cur = _median_abs(raw)
    for f in UA_FILES:
        ua = _median_abs(df.get(f"{d}/{f}"))
        if ua and cur:
            r = ua / cur
            if 0.5 <= r <= 2:
                return "uA", f"current_now matches the driver's own µA reading ({f})"
            if 500 <= r <= 2000:
                return "mA", f"current_now is a thousandth of the driver's own µA reading ({f})"
            return None, f"current_now is {r:.3g}× the driver's own µA reading ({f}): neither µA nor mA"
    breaches = abi_breaches(df, d)
    if not breaches:
        return "uA", "the kernel's power-supply ABI (µA), which this driver's voltage and charge files follow"
    said = "the driver breaks the power-supply ABI (" + "; ".join(breaches.values()) + ")"
    if (cur or 0) >= 2e4:  # 20 000 mA would be 20 A: no battery-powered device's
        return "uA", f"{said}, but {cur:g} cannot be mA: µA"
    if _discharging(df, d):  # a device running on its battery draws well over 20 mA: below that, µA cannot be
        return "mA", f"{said}, and {cur:g} µA is too little for a device running on its battery: mA"
    return None, f"{said} and {cur:g} could be µA or mA (not discharging); a battery counter over a longer cell tells"


def calibrate_current(
    t: np.ndarray, raw: pd.Series, counter: pd.Series | None, kind: str = "charge", v_v: pd.Series | None = None
) -> dict | None:
    """Decide the unit and sign of current_now from a battery counter's drop over the same window.
    kind 'charge' (charge_counter / charge_now, µAh): the unit whose mean current best matches −ΔQ/Δt wins.
    kind 'energy' (energy_now, µWh): the unit whose mean V·I best matches −ΔE/Δt wins (`v_v`: volts).
    The sign is flipped if current_now disagrees with the direction the counter moved. None if the
    counter did not move (coarse counters over a short cell) or matches no unit within a factor of 2."""
    if counter is None or (kind == "energy" and v_v is None):
        return None
    cc = pd.to_numeric(counter, errors="coerce")
    ok = cc.notna().to_numpy()
    if ok.sum() < 2:
        return None
    i0, i1 = np.flatnonzero(ok)[[0, -1]]
    dq = float(cc.iloc[i1] - cc.iloc[i0])
    dt_h = (t[i1] - t[i0]) / 3600
    if dq == 0 or dt_h <= 0:
        return None
    ref = -dq * 1e-6 / dt_h  # A (charge) or W (energy), positive when the battery discharges
    window = raw.iloc[i0 : i1 + 1].astype(float)
    if kind == "charge":
        mean_raw = float(window.mean())
    else:
        assert v_v is not None, "an energy counter comes with its voltage (checked above)"
        mean_raw = float((window * v_v.iloc[i0 : i1 + 1].astype(float)).mean())
    if mean_raw == 0 or math.isnan(mean_raw):
        return None
    best = min(((abs(abs(mean_raw) * f - abs(ref)) / abs(ref), u, f) for u, f in UNITS_TO_A))
    if best[0] > 0.5:
        return None
    sign = 1.0 if (mean_raw > 0) == (ref > 0) else -1.0
    return {
        "current_unit": best[1],
        "scale_to_a": best[2],
        "current_sign": sign,
        "agreement": round(1 - best[0], 4),
        "window_s": round(float(t[i1] - t[i0]), 3),
    }


def _calibration(
    tr: SamplerTrace, d: str, t: np.ndarray, raw: pd.Series, v_v: pd.Series, prior: dict | None
) -> dict | None:
    """current_now's unit and sign from this cell's counters, else from the device's earlier calibration."""
    df = tr.frame
    breaches = abi_breaches(df, d)
    for name, kind in COUNTERS:
        if name in breaches:  # not a counter in the ABI's units (Samsung's charge_now is its charging mode)
            continue
        cal = calibrate_current(t, raw, df.get(f"{d}/{name}"), kind, v_v)
        if cal:
            cal["method"] = name
            return cal
    if prior and prior.get("source") == f"battery:{d}" and prior.get("scale_to_a"):
        cal = {k: prior[k] for k in ("current_unit", "scale_to_a", "current_sign", "agreement")}
        cal["method"] = f"device calibration ({prior.get('method')} in cell {prior.get('cell', '?')})"
        return cal
    return None


def _sign(df: pd.DataFrame, d: str, i_a: pd.Series) -> float:
    """-1 where the battery says it discharges while the current is negative (this device reports discharge as
    negative): our convention is positive while discharging. Otherwise the device's own sign."""
    return -1.0 if _discharging(df, d) and i_a.median() < 0 else 1.0


def _from_device(df: pd.DataFrame, d: str, raw: pd.Series) -> tuple[pd.Series | None, float, str | None, dict]:
    """No calibration: the unit from what the device says (current_unit), the sign from its status."""
    unit, how = current_unit(df, d, raw)
    if unit is None:
        return None, 1.0, None, {"method": "undecided", "missing": f"battery current unit unknown: {how}"}
    i_a = raw * SCALE_TO_A[unit]
    info = {"method": "device units+status", "unit_basis": how, "scale_to_a": SCALE_TO_A[unit]}
    return i_a, _sign(df, d, i_a), unit, info


def battery_power(tr: SamplerTrace, prior: dict | None) -> Energy | None:
    """The first battery with current and voltage (or power_now): W per tick."""
    df = tr.frame
    t = df["t_s"].to_numpy(dtype=float)
    for d in batteries(tr):
        pn, cn, vn = f"{d}/power_now", f"{d}/current_now", f"{d}/voltage_now"
        if cn in df and vn in df:
            raw = pd.to_numeric(df[cn], errors="coerce").astype(float)
            v_raw = pd.to_numeric(df[vn], errors="coerce").astype(float)
            src = {"source": f"battery:{d}"}
            if not (v_raw > 0).any():  # 0 (or nothing) where a battery's voltage cannot be 0: not reported
                why = "battery voltage_now reads 0: the driver does not report it"
                return Energy("power", t, np.full(len(t), np.nan), {**src, "method": "undecided", "missing": why})
            v_v = v_raw.where(v_raw > 0).map(voltage_to_v)
            cal = _calibration(tr, d, t, raw, v_v, prior)
            if cal:
                i_a = raw * cal["scale_to_a"]
                sign, unit = cal["current_sign"], cal["current_unit"]
                info = {k: v for k, v in cal.items() if k not in ("current_unit", "current_sign")}
            else:
                i_a, sign, unit, info = _from_device(df, d, raw)
                if i_a is None:
                    return Energy("power", t, np.full(len(t), np.nan), {**src, **info})
            p = (sign * i_a * v_v).to_numpy()
            return Energy("power", t, p, {**src, "current_unit": unit, "current_sign": sign, **info})
        if pn in df:
            p = df[pn].astype(float).to_numpy() / 1e6
            return Energy("power", t, np.abs(p), {"source": f"battery:{d}:power_now"})
    return None


class PowerSupply(Source):
    name = "power-supply"
    title = "battery (current, voltage, level)"
    needs = "readable /sys/class/power_supply/*/ of type Battery"
    said = {"energy": "battery current/voltage"}

    def energy(self):
        return [(30, battery_power)]

    def keeps(self, calibration: dict) -> bool:
        # the battery's counter moved during this cell: the device's calibration from now on
        return calibration.get("method") in {n for n, _ in COUNTERS}

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        bat = batteries(v.trace)
        return bool(bat), ", ".join(bat) if bat else f"no {self.needs}"


SOURCE = PowerSupply()
