"""The battery as Linux shows it (/sys/class/power_supply/*/ of type Battery, read by the sampler every tick):
power from current_now × voltage_now (or power_now), in our sign convention (positive while discharging). The
unit and sign of current_now vary by vendor: they are calibrated against the battery's own counter where it
moved during the cell, else taken from an earlier cell's calibration on this device, else guessed from the
magnitude and the charging status."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..sampler_csv import SamplerTrace
from ..units import voltage_to_v
from .base import Energy, ProbeView, Source

UNITS_TO_A = (("uA", 1e-6), ("mA", 1e-3), ("A", 1.0))

# battery counters that can calibrate current_now, best first: (sysfs name, kind). charge_* are µAh
# (the power_supply ABI), energy_now µWh
COUNTERS = (("charge_counter", "charge"), ("charge_now", "charge"), ("energy_now", "energy"))


def batteries(tr: SamplerTrace) -> list[str]:
    """The folders of the batteries the sampler read."""
    return [d for d, m in tr.meta.items() if m.get("kind") == "power_supply" and m.get("type", "").lower() == "battery"]


def current_to_a(series: pd.Series) -> tuple[pd.Series, str]:
    """µA is the sysfs standard; some vendors report mA, a few A. Decide on the median magnitude:
    phone/board currents lie between ~1 mA and ~10 A."""
    med = float(series.abs().median()) if len(series) else 0.0
    if med >= 1e4:
        return series / 1e6, "uA"
    if med >= 10:
        return series / 1e3, "mA"
    return series, "A"


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
    mean_raw = float(window.mean() if kind == "charge" else (window * v_v.iloc[i0 : i1 + 1].astype(float)).mean())
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
    for name, kind in COUNTERS:
        cal = calibrate_current(t, raw, df.get(f"{d}/{name}"), kind, v_v)
        if cal:
            cal["method"] = name
            return cal
    if prior and prior.get("source") == f"battery:{d}" and prior.get("scale_to_a"):
        cal = {k: prior[k] for k in ("current_unit", "scale_to_a", "current_sign", "agreement")}
        cal["method"] = f"device calibration ({prior.get('method')} in cell {prior.get('cell', '?')})"
        return cal
    return None


def _guess(df: pd.DataFrame, d: str, raw: pd.Series) -> tuple[pd.Series, float, str, dict]:
    """No calibration: the unit from the magnitude; the sign flipped when the battery says it discharges while
    the current is negative."""
    status = df.get(f"{d}/status")
    if status is not None:  # a slow source: read once a second, empty between
        status = status[status.astype(str) != ""]
    i_a, unit = current_to_a(raw)
    sign = 1.0
    if status is not None and (status.astype(str).str.lower() == "discharging").mean() > 0.5 and i_a.median() < 0:
        sign = -1.0  # this device reports discharge as negative: flip to our convention
    return i_a, sign, unit, {"method": "magnitude+status", "scale_to_a": dict(UNITS_TO_A)[unit]}


def battery_power(tr: SamplerTrace, prior: dict | None) -> Energy | None:
    """The first battery with current and voltage (or power_now): W per tick."""
    df = tr.frame
    t = df["t_s"].to_numpy(dtype=float)
    for d in batteries(tr):
        pn, cn, vn = f"{d}/power_now", f"{d}/current_now", f"{d}/voltage_now"
        if cn in df and vn in df:
            raw = df[cn].astype(float)
            v_v = df[vn].astype(float).map(voltage_to_v)
            cal = _calibration(tr, d, t, raw, v_v, prior)
            if cal:
                i_a = raw * cal["scale_to_a"]
                sign, unit = cal["current_sign"], cal["current_unit"]
                info = {k: v for k, v in cal.items() if k not in ("current_unit", "current_sign")}
            else:
                i_a, sign, unit, info = _guess(df, d, raw)
            p = (sign * i_a * v_v).to_numpy()
            return Energy("power", t, p, {"source": f"battery:{d}", "current_unit": unit, "current_sign": sign, **info})
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
