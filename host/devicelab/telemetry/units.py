"""Units as devices report them → SI, and the integrals a cell's energy is made of. Shared by the sources."""

from __future__ import annotations

import numpy as np
import pandas as pd


def temp_to_c(v: float) -> float:
    """Temperatures come in m°C (Linux), some vendors' °C or d°C."""
    a = abs(v)
    if a >= 1000:
        return v / 1000
    if a >= 200:
        return v / 10
    return v


def voltage_to_v(v: float) -> float:
    a = abs(v)
    if a >= 1e5:
        return v / 1e6  # µV (sysfs standard)
    if a >= 100:
        return v / 1e3  # mV
    return v


def counter_j(raw: pd.Series, max_range_uj: float | None) -> pd.Series:
    """Cumulative µJ counter → J since the first sample, with wraparound at max_range_uj (none given: a step
    back is a gap, not energy)."""
    v = raw.astype(float).to_numpy()
    d = np.diff(v)
    d = np.where(d < 0, d + max_range_uj, d) if max_range_uj and max_range_uj > 0 else np.where(d < 0, np.nan, d)
    return pd.Series(np.concatenate([[0.0], np.nancumsum(d)]) / 1e6, index=raw.index)


def interp_energy(t: np.ndarray, e: np.ndarray, a: float, b: float) -> float:
    """Energy over [a, b] from a cumulative energy curve, interpolating at the edges."""
    return float(np.interp(b, t, e) - np.interp(a, t, e))


def integrate_power(t: np.ndarray, p: np.ndarray, a: float, b: float) -> float:
    """∫ P dt over [a, b] by the trapezoid rule on the samples, interpolating at the edges."""
    ok = ~np.isnan(p)  # a tick whose read failed (a busy I2C sensor) is left out, not taken as 0
    t, p = t[ok], p[ok]
    if b <= a or len(t) < 2:
        return float("nan")
    inner = (t > a) & (t < b)
    ts = np.concatenate([[a], t[inner], [b]])
    ps = np.concatenate([[np.interp(a, t, p)], p[inner], [np.interp(b, t, p)]])
    return float(np.trapezoid(ps, ts))
