"""hwmon power monitors, read by the sampler every tick: energy counters (energyN_input, µJ), and power rails —
powerN_input (µW); inN_input (mV) × currN_input (mA) of a chip that measures no power itself (the mainline
ina3221 driver of a Jetson); the older Jetsons' iio driver's in_powerN_input (mW, rail_name_N). A rail labelled
GPU is also the GPU's power."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..sampler_csv import SamplerTrace
from ..units import counter_j, integrate_power
from .base import Energy, ProbeView, Source

ENERGY_COLS = r".*hwmon\d+/energy\d+_input"

# the rail that feeds the whole board: a Jetson's VDD_IN / POM_5V_IN, a board's VIN. Sub-rails (VDD_CPU_GPU_CV,
# VDD_SOC, …) are inside it: summing them with it would count them twice
INPUT_RAIL = re.compile(r"^(VDD_|POM_5V_|VDD_5V_|SYS_)?IN$|^VIN$|_TOTAL$|^TOTAL", re.I)


def power_rails(tr: SamplerTrace) -> list[tuple[str, str, np.ndarray]]:
    """(label, source columns, W per tick) of every power-monitor rail the sampler read. Unconnected channels
    (label 'NC') are left out."""
    df = tr.frame
    label = lambda c: tr.meta.get(c, {}).get("label", "")

    def num(c: str) -> np.ndarray:
        return pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)

    out = [(label(c), c, num(c) / 1e6) for c in tr.columns(r".*hwmon\d+/power\d+_input")]
    for c in tr.columns(r".*hwmon\d+/curr\d+_input"):
        h, n = c.rsplit("/curr", 1)
        n = n[: -len("_input")]
        v = f"{h}/in{n}_input"
        if v in df and f"{h}/power{n}_input" not in df:
            out.append((label(v) or label(c), f"{v}*{c}", num(v) * num(c) / 1e6))
    out += [(label(c), c, num(c) / 1e3) for c in tr.columns(r".*iio:device\d+/in_power\d+_input")]
    return [r for r in out if r[0].upper() != "NC"]


def counter_energy(tr: SamplerTrace, prior: dict | None = None) -> Energy | None:
    cols = tr.columns(ENERGY_COLS)
    if not cols:
        return None
    df = tr.frame
    total = np.asarray(sum(counter_j(df[c], None).to_numpy() for c in cols))
    return Energy("energy", df["t_s"].to_numpy(dtype=float), total, {"source": "hwmon-energy", "inputs": cols})


def rail_power(tr: SamplerTrace, prior: dict | None = None) -> Energy | None:
    """The board input rail where there is one, else the sum of the rails."""
    rails = power_rails(tr)
    if not rails:
        return None
    inputs = [r for r in rails if INPUT_RAIL.search(r[0])]
    use, how = (inputs, "board input rail") if inputs else (rails, "sum of rails")
    p = np.asarray(sum(r[2] for r in use))
    return Energy(
        "power",
        tr.frame["t_s"].to_numpy(dtype=float),
        p,
        {"source": "power-rails", "method": how, "rails": {r[0] or r[1]: r[1] for r in use}},
    )


class Hwmon(Source):
    name = "hwmon"
    title = "power rails (hwmon, Jetson INA3221)"
    needs = "hwmon power, current×voltage or energy inputs, or a Jetson iio power monitor"
    said = {"gpu": "GPU rail", "energy": "hwmon power"}

    def energy(self):
        return [(20, counter_energy), (40, rail_power)]

    def gpu(self, tr: SamplerTrace, samples) -> dict[str, tuple[float, str]]:
        df = tr.frame
        t = pd.to_numeric(df["t_s"], errors="coerce").to_numpy(dtype=float) if "t_s" in df else np.array([])
        rails = [(lab, w) for lab, _, w in power_rails(tr) if "GPU" in lab.upper()]
        if not rails or len(t) <= 1:
            return {}
        w = np.nansum([r[1] for r in rails], axis=0)
        src = "rails " + "+".join(r[0] for r in rails)
        return {"gpu_power_mean": (float(np.nanmean(w)), src), "gpu_energy": (integrate_power(t, w, t[0], t[-1]), src)}

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        rails = power_rails(v.trace)
        he = v.trace.columns(ENERGY_COLS)
        if rails:
            inp = [lab for lab, _, _ in rails if INPUT_RAIL.search(lab)]
            return True, (
                f"{len(rails)} rails ({', '.join(lab or '?' for lab, _, _ in rails)}); "
                + (f"board input {', '.join(inp)}" if inp else "no board input rail: summed")
            )
        if he:
            return True, f"{len(he)} hwmon energy counters"
        return False, "no hwmon power, current×voltage or energy inputs, nor a Jetson iio power monitor"


SOURCE = Hwmon()
