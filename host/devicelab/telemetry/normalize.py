"""Normalize a sampler trace into schema rows: SI units, one sign convention, energy per phase.

Sign convention: power and current are positive when drawn from the source (battery discharging,
package consuming). Units as read are detected per source and the detection is recorded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..schema import Row, missing
from . import sources
from .sampler_csv import SamplerTrace
from .sources import SOURCES, Energy
from .units import integrate_power, interp_energy

# what no source gives is NaN with the reason, which names the sources that could have given it
NO_POWER = f"no power source readable on this device (no {sources.said('energy')})"
NO_GPU = f"no GPU telemetry readable on this device ({sources.said('gpu')})"
NO_TEMPERATURE = f"no {sources.said('temperature')} readable on this device"
NO_CPU_CLOCK = f"no {sources.said('cpu_clock')} readable on this device"


@dataclass
class Phase:
    name: str  # e.g. "pp64" or "cell"
    kind: str  # prefill | decode | pg | perplexity | cell
    start: float  # device clock, s
    end: float
    tokens: int = 0
    reps: int = 0  # timed repetitions inside the window (pg tests: one prompt each)
    temperature: bool = False  # its own hottest temperature too (a slice of a sustained run), beside its energy


@dataclass
class Summary:
    rows: list[Row]
    temp_start_c: float | None = None
    temp_end_c: float | None = None
    throttled: bool | None = None
    calibration: dict = field(default_factory=dict)


def hottest_c(tr: SamplerTrace) -> pd.Series:
    """Per tick, the hottest temperature in °C; NaN on ticks between the sampler's slow reads."""
    for s in SOURCES:
        v = s.temperature(tr)
        if v is not None:
            return v
    return pd.Series(np.nan, index=tr.frame.index)


def cpu_freq_hz(tr: SamplerTrace) -> pd.Series:
    """Per tick, the mean CPU clock in Hz over all CPUs."""
    for s in SOURCES:
        v = s.cpu_clock(tr, None)
        if v is not None:
            return v
    return pd.Series(np.nan, index=tr.frame.index)


def power_source(tr: SamplerTrace, prior: dict | None = None) -> Energy | None:
    """Pick the best energy source: ('energy'|'power', t, values in J or W, calibration info).
    `prior`: the device's battery calibration from an earlier cell (its counter moved then), used when
    this cell's counters did not move enough to calibrate on their own."""
    return sources.power_source(tr, prior)


def gpu_rows(tr: SamplerTrace, beside: dict | None = None) -> list[Row]:
    """The cell's GPU figures, SI units, from the sampler's GPU sources and those beside the payload (`beside`:
    their samples by source): power (mean W) and energy (J), peak memory (B), busy share, peak temperature,
    mean clock. What no source gives is NaN with the reason (a source may give (NaN, why): the device marks
    the figure unsupported)."""
    beside = beside or {}
    vals: dict[str, tuple[float, str]] = {}
    for s in SOURCES:  # a later source's figure replaces an earlier's; a (NaN, why) never replaces a figure
        for m, (v, what) in s.gpu(tr, beside.get(s.name)).items():
            if not math.isnan(v) or m not in vals or math.isnan(vals[m][0]):
                vals[m] = (v, what)
    out = []
    for m in ("gpu_power_mean", "gpu_energy", "gpu_mem_peak", "gpu_busy_mean", "gpu_temp_max", "gpu_freq_mean"):
        if m in vals and not math.isnan(vals[m][0]):
            out.append(Row(metric=m, value=vals[m][0], phase="cell", test=vals[m][1]))
        else:
            out.append(missing(m, vals[m][1] if m in vals else NO_GPU, phase="cell"))
    return out


def _peak_rss(tr: SamplerTrace) -> list[Row]:
    # VmHWM (read once a second) is the kernel's own high-water mark; VmRSS (every tick) covers a
    # peak reached after the last VmHWM read
    df = tr.frame
    hwm = tr.columns(r"proc/\d+/VmHWM_kB") + tr.columns(r"proc/\d+/VmRSS_kB")
    vals = pd.concat([pd.to_numeric(df[c], errors="coerce") for c in hwm]).dropna() if hwm else pd.Series(dtype=float)
    if len(vals):
        return [Row(metric="peak_rss", value=float(vals.max()) * 1024, phase="cell", n=int(len(df)))]
    return [
        missing(
            "peak_rss",
            "payload exited before the sampler's first read of /proc/PID/status"
            if hwm
            else "sampler had no payload pid",
            phase="cell",
        )
    ]


def _temperatures(tr: SamplerTrace) -> tuple[list[Row], float | None, float | None]:
    hottest = hottest_c(tr).dropna()
    if not len(hottest):
        return [missing(m, NO_TEMPERATURE, phase="cell") for m in ("temp_start", "temp_end", "temp_max")], None, None
    t_start, t_end = float(hottest.iloc[0]), float(hottest.iloc[-1])
    return (
        [
            Row(metric="temp_start", value=t_start, phase="cell"),
            Row(metric="temp_end", value=t_end, phase="cell"),
            Row(metric="temp_max", value=float(hottest.max()), phase="cell"),
        ],
        t_start,
        t_end,
    )


def _cpu_clock(tr: SamplerTrace, beside: dict) -> tuple[list[Row], bool | None]:
    """Mean and lowest CPU clock, from the first source that gives one; throttled: the last quarter ran more than
    10 % slower than the first."""
    mean_t = pd.Series(dtype=float)
    for s in SOURCES:
        v = s.cpu_clock(tr, beside.get(s.name))
        if v is not None and len(v.dropna()):
            mean_t = v.dropna()
            break
    if not len(mean_t):
        return [
            missing("cpu_freq_mean", NO_CPU_CLOCK, phase="cell"),
            missing("cpu_freq_min", NO_CPU_CLOCK, phase="cell"),
        ], None
    q = max(1, len(mean_t) // 4)
    return [
        Row(metric="cpu_freq_mean", value=float(mean_t.mean()), phase="cell", n=len(mean_t)),
        Row(metric="cpu_freq_min", value=float(mean_t.min()), phase="cell", n=len(mean_t)),
    ], bool(mean_t.iloc[-q:].mean() < 0.9 * mean_t.iloc[:q].mean())


def _phase_temperature(t: pd.Series, hottest: pd.Series, ph: Phase) -> Row:
    """The hottest zone's highest reading inside the phase (t: the trace's tick times; hottest: read ticks only)."""
    inside = hottest[(t >= ph.start) & (t <= ph.end)]
    kw: dict[str, Any] = dict(phase=ph.kind, test=ph.name)
    if hottest.empty:
        return missing("temp_max", NO_TEMPERATURE, **kw)
    if inside.empty:
        return missing("temp_max", "no temperature read inside this phase (shorter than the sampler's reads)", **kw)
    return Row(metric="temp_max", value=float(inside.max()), n=len(inside), **kw)


def _phase_energy(src: Energy | None, ph: Phase) -> list[Row]:
    kw: dict[str, Any] = dict(phase=ph.kind, test=ph.name if ph.kind != "cell" else "")  # every row's
    if src is None:
        per_token = [missing("energy_per_token", NO_POWER, **kw)] if ph.tokens else []
        return [missing("energy", NO_POWER, **kw), *per_token]
    kind, t, v, info = src
    if info.get("missing"):  # the source is there but its figures cannot be told (e.g. a current of unknown unit)
        per_token = [missing("energy_per_token", info["missing"], **kw)] if ph.tokens else []
        return [missing("energy", info["missing"], **kw), *per_token]
    e = interp_energy(t, v, ph.start, ph.end) if kind == "energy" else integrate_power(t, v, ph.start, ph.end)
    dur = ph.end - ph.start
    if math.isnan(e) or dur <= 0:
        return [missing("energy", "phase shorter than one sample interval", **kw)]
    rows = [Row(metric="energy", value=e, **kw), Row(metric="power_mean", value=e / dur, **kw)]
    if ph.tokens:
        rows.append(Row(metric="energy_per_token", value=e / ph.tokens, **kw))
    if ph.kind == "pg" and ph.reps:  # energy per prompt, as on-device studies report it
        rows.append(Row(metric="wh_per_prompt", value=e / ph.reps / 3600, **kw))
    return rows


def summarize(
    tr: SamplerTrace,
    phases: list[Phase],
    cell_window: tuple[float, float] | None,
    beside: dict | None = None,
    prior_calibration: dict | None = None,
) -> Summary:
    """Rows of one cell from the sampler's trace; `beside`: the samples of the sources run beside the payload
    for its whole life (sources.read_pulled), which supply the energy, clock and thermal state where there is
    no sysfs."""
    beside = beside or {}
    rows = _peak_rss(tr)
    temps, t_start, t_end = _temperatures(tr)
    clock, throttled = _cpu_clock(tr, beside)
    rows += temps + clock + gpu_rows(tr, beside)
    for s in SOURCES:
        more, rose = s.pressure(beside.get(s.name))
        rows += more
        throttled = True if rose else throttled
    src = power_source(tr, prior_calibration)
    if src is None:  # the whole cell's energy from a source beside the payload
        for s in SOURCES:
            whole = s.cell_energy(beside.get(s.name), phases)
            if whole is not None:
                return Summary(rows + whole[0], t_start, t_end, throttled, whole[1])
    all_phases = list(phases)
    if cell_window:
        all_phases.append(Phase("cell", "cell", cell_window[0], cell_window[1]))
    hottest = hottest_c(tr).dropna() if any(ph.temperature for ph in all_phases) else None
    t = tr.frame["t_s"].astype(float).loc[hottest.index] if hottest is not None else None
    for ph in all_phases:
        rows += _phase_energy(src, ph)
        if hottest is not None and t is not None and ph.temperature:
            rows.append(_phase_temperature(t, hottest, ph))
    calib = src.info if src is not None and all_phases else {}
    return Summary(rows, t_start, t_end, throttled, calib)
