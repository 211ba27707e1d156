"""Normalize a sampler trace into schema rows: SI units, one sign convention, energy per phase.

Sign convention: power and current are positive when drawn from the source (battery discharging,
package consuming). Units as read are detected per source and the detection is recorded."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..schema import Row, missing
from .sampler_csv import SamplerTrace

NO_POWER = "no power source readable on this device (no battery current/voltage, RAPL or hwmon power)"


@dataclass
class Phase:
    name: str            # e.g. "pp64" or "cell"
    kind: str            # prefill | decode | pg | perplexity | cell
    start: float         # device clock, s
    end: float
    tokens: int = 0
    reps: int = 0        # timed repetitions inside the window (pg tests: one prompt each)


@dataclass
class Summary:
    rows: list[Row]
    temp_start_c: float | None = None
    temp_end_c: float | None = None
    throttled: bool | None = None
    calibration: dict = field(default_factory=dict)


ZONE_COLS = r"sys/class/thermal/thermal_zone\d+/temp"
FREQ_COLS = r"sys/devices/system/cpu/(cpu\d+/cpufreq|cpufreq/policy\d+)/scaling_cur_freq"


def hottest_c(tr: SamplerTrace) -> pd.Series:
    """Per tick, the hottest thermal zone in °C; NaN on ticks between the sampler's slow reads."""
    zones = tr.columns(ZONE_COLS)
    if not zones:
        return pd.Series(np.nan, index=tr.frame.index)
    return tr.frame[zones].apply(lambda s: pd.to_numeric(s, errors="coerce").map(temp_to_c)).max(axis=1)


def cpu_freq_hz(tr: SamplerTrace) -> pd.Series:
    """Per tick, the mean CPU clock in Hz over all CPUs: a cpufreq policy column counts once per CPU it
    clocks (its meta 'cpus=0,1,2,3'), a per-CPU column once."""
    cols = tr.columns(FREQ_COLS)
    if not cols:
        return pd.Series(np.nan, index=tr.frame.index)
    w = {c: max(1, len([x for x in tr.meta.get(c.rsplit("/", 1)[0], {}).get("cpus", "").split(",") if x]))
         for c in cols}
    total = sum(pd.to_numeric(tr.frame[c], errors="coerce") * 1e3 * w[c] for c in cols)   # kHz → Hz
    return total / sum(w.values())


def temp_to_c(v: float) -> float:
    """Thermal zones report m°C (Linux), some vendors °C or d°C."""
    a = abs(v)
    if a >= 1000:
        return v / 1000
    if a >= 200:
        return v / 10
    return v


def voltage_to_v(v: float) -> float:
    a = abs(v)
    if a >= 1e5:
        return v / 1e6     # µV (sysfs standard)
    if a >= 100:
        return v / 1e3     # mV
    return v


def current_to_a(series: pd.Series) -> tuple[pd.Series, str]:
    """µA is the sysfs standard; some vendors report mA, a few A. Decide on the median magnitude:
    phone/board currents lie between ~1 mA and ~10 A."""
    med = float(series.abs().median()) if len(series) else 0.0
    if med >= 1e4:
        return series / 1e6, "uA"
    if med >= 10:
        return series / 1e3, "mA"
    return series, "A"


def rapl_energy_j(raw: pd.Series, max_range_uj: float | None) -> pd.Series:
    """Cumulative µJ counter → J since the first sample, with wraparound at max_energy_range_uj."""
    v = raw.astype(float).to_numpy()
    d = np.diff(v)
    if max_range_uj and max_range_uj > 0:
        d = np.where(d < 0, d + max_range_uj, d)
    else:
        d = np.where(d < 0, np.nan, d)
    return pd.Series(np.concatenate([[0.0], np.nancumsum(d)]) / 1e6, index=raw.index)


def _interp_energy(t: np.ndarray, e: np.ndarray, a: float, b: float) -> float:
    return float(np.interp(b, t, e) - np.interp(a, t, e))


def _integrate_power(t: np.ndarray, p: np.ndarray, a: float, b: float) -> float:
    """∫ P dt over [a, b] by the trapezoid rule on the samples, interpolating at the edges."""
    ok = ~np.isnan(p)                 # a tick whose read failed (a busy I2C sensor) is left out, not taken as 0
    t, p = t[ok], p[ok]
    if b <= a or len(t) < 2:
        return float("nan")
    inner = (t > a) & (t < b)
    ts = np.concatenate([[a], t[inner], [b]])
    ps = np.concatenate([[np.interp(a, t, p)], p[inner], [np.interp(b, t, p)]])
    return float(np.trapezoid(ps, ts))


UNITS_TO_A = (("uA", 1e-6), ("mA", 1e-3), ("A", 1.0))


# battery counters that can calibrate current_now, best first: (sysfs name, kind). charge_* are µAh
# (the power_supply ABI), energy_now µWh
COUNTERS = (("charge_counter", "charge"), ("charge_now", "charge"), ("energy_now", "energy"))


def calibrate_current(t: np.ndarray, raw: pd.Series, counter: pd.Series | None, kind: str = "charge",
                      v_v: pd.Series | None = None) -> dict | None:
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
    ref = -dq * 1e-6 / dt_h        # A (charge) or W (energy), positive when the battery discharges
    window = raw.iloc[i0:i1 + 1].astype(float)
    mean_raw = float(window.mean() if kind == "charge" else (window * v_v.iloc[i0:i1 + 1].astype(float)).mean())
    if mean_raw == 0 or math.isnan(mean_raw):
        return None
    best = min(((abs(abs(mean_raw) * f - abs(ref)) / abs(ref), u, f) for u, f in UNITS_TO_A))
    if best[0] > 0.5:
        return None
    sign = 1.0 if (mean_raw > 0) == (ref > 0) else -1.0
    return {"current_unit": best[1], "scale_to_a": best[2], "current_sign": sign, "agreement": round(1 - best[0], 4),
            "window_s": round(float(t[i1] - t[i0]), 3)}


def power_source(tr: SamplerTrace, prior: dict | None = None) -> tuple[str, np.ndarray, np.ndarray, dict] | None:
    """Pick the best energy source: ('energy'|'power', t, values in J or W, calibration info).
    `prior`: the device's battery calibration from an earlier cell (its counter moved then), used when
    this cell's counters did not move enough to calibrate on their own."""
    df = tr.frame
    if len(df) < 2:
        return None
    t = df["t_s"].to_numpy(dtype=float)
    # 1. RAPL package domains (top level only: sub-domains are inside the package figure)
    rapl = [c for c in tr.columns(r"sys/class/powercap/(intel-rapl/)?intel-rapl:\d+/energy_uj")]
    if rapl:
        total = np.zeros(len(df))
        for c in rapl:
            m = tr.meta.get(c.rsplit("/", 1)[0], {})
            rng = float(m["max_energy_range_uj"]) if m.get("max_energy_range_uj") else None
            total += rapl_energy_j(df[c], rng).to_numpy()
        return "energy", t, total, {"source": "rapl", "domains": rapl}
    # 2. hwmon energy counters (µJ)
    he = tr.columns(r".*hwmon\d+/energy\d+_input")
    if he:
        total = sum(rapl_energy_j(df[c], None).to_numpy() for c in he)
        return "energy", t, total, {"source": "hwmon-energy", "inputs": he}
    # 3. battery: power_now (µW) or V·I
    for d, m in tr.meta.items():
        if m.get("kind") != "power_supply" or m.get("type", "").lower() != "battery":
            continue
        pn, cn, vn = f"{d}/power_now", f"{d}/current_now", f"{d}/voltage_now"
        status = df.get(f"{d}/status")
        if status is not None:       # a slow source: read once a second, empty between
            status = status[status.astype(str) != ""]
        if cn in df and vn in df:
            raw = df[cn].astype(float)
            v_v = df[vn].astype(float).map(voltage_to_v)
            cal = None
            for name, kind in COUNTERS:
                cal = calibrate_current(t, raw, df.get(f"{d}/{name}"), kind, v_v)
                if cal:
                    cal["method"] = name
                    break
            if not cal and prior and prior.get("source") == f"battery:{d}" and prior.get("scale_to_a"):
                cal = {k: prior[k] for k in ("current_unit", "scale_to_a", "current_sign", "agreement")}
                cal["method"] = f"device calibration ({prior.get('method')} in cell {prior.get('cell', '?')})"
            if cal:
                i_a = raw * cal["scale_to_a"]
                sign, unit = cal["current_sign"], cal["current_unit"]
                info = {k: v for k, v in cal.items() if k not in ("current_unit", "current_sign")}
            else:
                i_a, unit = current_to_a(raw)
                sign = 1.0
                if status is not None and (status.astype(str).str.lower() == "discharging").mean() > 0.5 \
                        and i_a.median() < 0:
                    sign = -1.0        # this device reports discharge as negative: flip to our convention
                info = {"method": "magnitude+status", "scale_to_a": dict(UNITS_TO_A)[unit]}
            p = (sign * i_a * v_v).to_numpy()
            return "power", t, p, {"source": f"battery:{d}", "current_unit": unit, "current_sign": sign, **info}
        if pn in df:
            p = df[pn].astype(float).to_numpy() / 1e6
            return "power", t, np.abs(p), {"source": f"battery:{d}:power_now"}
    # 4. power-monitor rails (hwmon, e.g. a Jetson's INA3221; the older Jetsons' iio driver)
    rails = power_rails(tr)
    if rails:
        inputs = [r for r in rails if INPUT_RAIL.search(r[0])]
        use, how = (inputs, "board input rail") if inputs else (rails, "sum of rails")
        p = sum(r[2] for r in use)
        return "power", t, p, {"source": "power-rails", "method": how, "rails": {r[0] or r[1]: r[1] for r in use}}
    return None


# the rail that feeds the whole board: a Jetson's VDD_IN / POM_5V_IN, a board's VIN. Sub-rails (VDD_CPU_GPU_CV,
# VDD_SOC, …) are inside it: summing them with it would count them twice
INPUT_RAIL = re.compile(r"^(VDD_|POM_5V_|VDD_5V_|SYS_)?IN$|^VIN$|_TOTAL$|^TOTAL", re.I)


def power_rails(tr: SamplerTrace) -> list[tuple[str, str, np.ndarray]]:
    """(label, source columns, W per tick) of every power-monitor rail the sampler read: hwmon powerN_input
    (µW); hwmon inN_input (mV) × currN_input (mA) of a chip that measures no power itself (the mainline
    ina3221 driver: in1..3 are the bus voltages, labelled, curr1..3 their currents); the Jetson iio
    driver's in_powerN_input (mW, rail_name_N). Unconnected channels (label 'NC') are left out."""
    df = tr.frame
    label = lambda c: tr.meta.get(c, {}).get("label", "")
    num = lambda c: pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
    out = [(label(c), c, num(c) / 1e6) for c in tr.columns(r".*hwmon\d+/power\d+_input")]
    for c in tr.columns(r".*hwmon\d+/curr\d+_input"):
        h, n = c.rsplit("/curr", 1)
        n = n[:-len("_input")]
        v = f"{h}/in{n}_input"
        if v in df and f"{h}/power{n}_input" not in df:
            out.append((label(v) or label(c), f"{v}*{c}", num(v) * num(c) / 1e6))
    out += [(label(c), c, num(c) / 1e3) for c in tr.columns(r".*iio:device\d+/in_power\d+_input")]
    return [r for r in out if r[0].upper() != "NC"]


NO_GPU = "no GPU telemetry readable on this device (kgsl, devfreq GPU, Tegra load, GPU rail or nvidia-smi)"


def gpu_rows(tr: SamplerTrace, nv: list[dict] | None = None, pm: list[dict] | None = None) -> list[Row]:
    """The cell's GPU figures, SI units, from the sampler's GPU sources (Adreno kgsl, devfreq GPUs, Tegra load,
    power rails labelled GPU) and nvidia-smi's samples beside the payload: power (mean W) and energy (J), peak
    memory (B), busy share, peak temperature, mean clock. What no source gives is NaN with the reason."""
    df = tr.frame
    num = lambda c: pd.to_numeric(df[c].astype(str).str.split().str[0], errors="coerce")  # noqa: E731
    vals: dict[str, tuple[float, str]] = {}
    t = pd.to_numeric(df["t_s"], errors="coerce").to_numpy(dtype=float) if "t_s" in df else np.array([])
    freq = [num(c) for c in tr.columns(r".*kgsl-3d0/gpuclk") + tr.columns(r".*devfreq/[^/]+/cur_freq")
            if tr.meta.get(c.rsplit("/", 1)[0], {}).get("type") in ("kgsl", "devfreq")]
    freq = [f.dropna() for f in freq if f.notna().any()]
    if freq:
        vals["gpu_freq_mean"] = (float(pd.concat(freq).mean()), "sysfs")
    busy = []
    for c in tr.columns(r".*kgsl-3d0/gpubusy"):           # "busy total" since the last read
        bt = df[c].astype(str).str.split(expand=True)
        if bt.shape[1] >= 2:
            b, tot = pd.to_numeric(bt[0], errors="coerce"), pd.to_numeric(bt[1], errors="coerce")
            busy.append((b / tot.where(tot > 0)).dropna())
    busy += [(num(c) / 1000).dropna() for c in tr.columns(r".*/load")
             if tr.meta.get(c.rsplit("/", 1)[0], {}).get("type") == "tegra"]
    busy = [b for b in busy if len(b)]
    if busy:
        vals["gpu_busy_mean"] = (float(pd.concat(busy).mean()), "sysfs")
    temps = [num(c).dropna().map(temp_to_c) for c in tr.columns(r".*kgsl-3d0/temp")]
    temps = [x for x in temps if len(x)]
    if temps:
        vals["gpu_temp_max"] = (float(pd.concat(temps).max()), "sysfs")
    rails = [(lab, w) for lab, _, w in power_rails(tr) if "GPU" in lab.upper()]
    if rails and len(t) > 1:
        w = np.nansum([r[1] for r in rails], axis=0)
        vals["gpu_power_mean"] = (float(np.nanmean(w)), "rails " + "+".join(r[0] for r in rails))
        vals["gpu_energy"] = (_integrate_power(t, w, t[0], t[-1]), vals["gpu_power_mean"][1])
    pm_g = [x for x in pm or [] if x.get("gpu_j") is not None and x.get("elapsed_s")]
    if pm_g:                                                # a Mac: powermetrics' GPU energy
        e, d = sum(x["gpu_j"] for x in pm_g), sum(x["elapsed_s"] for x in pm_g)
        vals["gpu_energy"], vals["gpu_power_mean"] = (e, "powermetrics"), (e / d, "powermetrics")
    if nv:
        s = pd.DataFrame(nv)
        src = "nvidia-smi " + ", ".join(sorted({str(x) for x in s["name"].dropna()}))
        per_t = s.groupby("t")                             # all GPUs at one timestamp
        if s["power_w"].notna().any():
            p = per_t["power_w"].sum(min_count=1).dropna()
            vals["gpu_power_mean"] = (float(p.mean()), src)
            if len(p) > 1:
                tt = p.index.to_numpy(dtype=float)
                vals["gpu_energy"] = (_integrate_power(tt, p.to_numpy(dtype=float), tt[0], tt[-1]), src)
        for metric, col, how in (("gpu_mem_peak", "mem_bytes", "max"), ("gpu_busy_mean", "busy", "mean"),
                                 ("gpu_temp_max", "temp_c", "max"), ("gpu_freq_mean", "sm_hz", "mean")):
            if s[col].notna().any():
                agg = per_t[col].sum(min_count=1) if col == "mem_bytes" else s[col]
                vals[metric] = (float(getattr(agg.dropna(), how)()), src)
    out = []
    for m in ("gpu_power_mean", "gpu_energy", "gpu_mem_peak", "gpu_busy_mean", "gpu_temp_max", "gpu_freq_mean"):
        if m in vals:
            out.append(Row(metric=m, value=vals[m][0], phase="cell", test=vals[m][1]))
        else:
            out.append(missing(m, NO_GPU, phase="cell"))
    return out


def summarize(tr: SamplerTrace, phases: list[Phase], cell_window: tuple[float, float] | None,
              pm: list[dict] | None = None, prior_calibration: dict | None = None,
              nv: list[dict] | None = None) -> Summary:
    """Rows of one cell from the sampler's trace; `pm`: macOS powermetrics samples (parsers.powermetrics)
    taken beside the payload for its whole life, which supply the energy, clock and thermal pressure
    where there is no sysfs."""
    df = tr.frame
    rows: list[Row] = []
    # ---- peak RSS ----
    # VmHWM (read once a second) is the kernel's own high-water mark; VmRSS (every tick) covers a
    # peak reached after the last VmHWM read
    hwm = tr.columns(r"proc/\d+/VmHWM_kB") + tr.columns(r"proc/\d+/VmRSS_kB")
    vals = pd.concat([pd.to_numeric(df[c], errors="coerce") for c in hwm]).dropna() if hwm else pd.Series(dtype=float)
    if len(vals):
        rows.append(Row(metric="peak_rss", value=float(vals.max()) * 1024, phase="cell", n=int(len(df))))
    else:
        rows.append(missing("peak_rss", "payload exited before the sampler's first read of /proc/PID/status"
                            if hwm else "sampler had no payload pid", phase="cell"))
    # ---- temperatures ----
    hottest = hottest_c(tr).dropna()
    t_start = t_end = None
    if len(hottest):
        t_start, t_end = float(hottest.iloc[0]), float(hottest.iloc[-1])
        rows += [Row(metric="temp_start", value=t_start, phase="cell"),
                 Row(metric="temp_end", value=t_end, phase="cell"),
                 Row(metric="temp_max", value=float(hottest.max()), phase="cell")]
    else:
        for m in ("temp_start", "temp_end", "temp_max"):
            rows.append(missing(m, "no thermal zone readable on this device", phase="cell"))
    # ---- CPU frequency ----
    mean_t = cpu_freq_hz(tr).dropna()
    if not len(mean_t) and pm:
        mean_t = pd.Series([float(np.mean(list(x["cluster_hz"].values()))) for x in pm if x["cluster_hz"]], dtype=float)
    throttled = None
    if len(mean_t):
        rows += [Row(metric="cpu_freq_mean", value=float(mean_t.mean()), phase="cell", n=len(mean_t)),
                 Row(metric="cpu_freq_min", value=float(mean_t.min()), phase="cell", n=len(mean_t))]
        q = max(1, len(mean_t) // 4)
        throttled = bool(mean_t.iloc[-q:].mean() < 0.9 * mean_t.iloc[:q].mean())
    else:
        rows += [missing("cpu_freq_mean", "no cpufreq readable on this device", phase="cell"),
                 missing("cpu_freq_min", "no cpufreq readable on this device", phase="cell")]
    # ---- GPU ----
    rows += gpu_rows(tr, nv, pm)
    # ---- macOS powermetrics: thermal pressure, and the SoC's energy when the sampler has no source ----
    pm = pm or []
    tp = [x["thermal_pressure"] for x in pm if x["thermal_pressure"] is not None]
    if tp:
        rows.append(Row(metric="thermal_status", value=float(max(tp)), phase="cell",
                        test="powermetrics thermal_pressure"))
        if max(tp) > tp[0]:
            throttled = True
    src = power_source(tr, prior_calibration)
    pm_e = [x for x in pm if x["energy_j"] is not None]
    if src is None and pm_e:
        e, dur = sum(x["energy_j"] for x in pm_e), sum(x["elapsed_s"] for x in pm_e)
        how = sorted({x["energy_from"] for x in pm_e})
        rows += [
            Row(metric="energy", value=e, phase="cell", test="powermetrics", n=len(pm_e)),
            Row(metric="power_mean", value=e / dur, phase="cell", test="powermetrics", n=len(pm_e)),
        ]
        for ph in phases:  # phases need the device's clock, which a Mac lacks (no /proc/uptime)
            rows.append(
                missing(
                    "energy",
                    "powermetrics gives the whole cell only: no sub-second device clock to place phases on",
                    phase=ph.kind,
                    test=ph.name,
                )
            )
        return Summary(
            rows,
            t_start,
            t_end,
            throttled,
            {"source": "powermetrics", "energy_from": ",".join(how), "samples": len(pm_e)},
        )
    # ---- energy ----
    calib = {}
    all_phases = list(phases)
    if cell_window:
        all_phases.append(Phase("cell", "cell", cell_window[0], cell_window[1]))
    for ph in all_phases:
        kw = dict(phase=ph.kind, test=ph.name if ph.kind != "cell" else "")
        if src is None:
            rows.append(missing("energy", NO_POWER, **kw))
            if ph.tokens:
                rows.append(missing("energy_per_token", NO_POWER, **kw))
            continue
        kind, t, v, calib = src
        if kind == "energy":
            e = _interp_energy(t, v, ph.start, ph.end)
        else:
            e = _integrate_power(t, v, ph.start, ph.end)
        dur = ph.end - ph.start
        if math.isnan(e) or dur <= 0:
            rows.append(missing("energy", "phase shorter than one sample interval", **kw))
            continue
        rows.append(Row(metric="energy", value=e, **kw))
        rows.append(Row(metric="power_mean", value=e / dur, **kw))
        if ph.tokens:
            rows.append(Row(metric="energy_per_token", value=e / ph.tokens, **kw))
        if ph.kind == "pg" and ph.reps:
            rows.append(
                Row(metric="wh_per_prompt", value=e / ph.reps / 3600, **kw)
            )  # the seeds' energy per instruction
    return Summary(rows, t_start, t_end, throttled, calib)
