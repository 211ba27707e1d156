"""GPUs the kernel shows, read by the sampler every tick: Adreno's kgsl (gpuclk, gpubusy, temp), devfreq GPUs
(a Mali's cur_freq) and a Tegra's load (‰); the sampler marks each folder with its type."""

from __future__ import annotations

import pandas as pd

from ..sampler_csv import SamplerTrace
from ..units import temp_to_c
from .base import ProbeView, Source, folder_meta


def _freq(tr: SamplerTrace, num) -> list[pd.Series]:
    cols = tr.columns(r".*kgsl-3d0/gpuclk") + tr.columns(r".*devfreq/[^/]+/cur_freq")
    freq = [num(c) for c in cols if folder_meta(tr, c).get("type") in ("kgsl", "devfreq")]  # not the memory bus's
    return [f.dropna() for f in freq if f.notna().any()]


def _busy(tr: SamplerTrace, num) -> list[pd.Series]:
    busy = []
    for c in tr.columns(r".*kgsl-3d0/gpubusy"):  # "busy total" since the last read
        bt = tr.frame[c].astype(str).str.split(expand=True)
        if bt.shape[1] >= 2:
            b, tot = pd.to_numeric(bt[0], errors="coerce"), pd.to_numeric(bt[1], errors="coerce")
            busy.append((b / tot.where(tot > 0)).dropna())
    busy += [(num(c) / 1000).dropna() for c in tr.columns(r".*/load") if folder_meta(tr, c).get("type") == "tegra"]
    return [b for b in busy if len(b)]


class GpuSysfs(Source):
    name = "gpu-sysfs"
    title = "GPU telemetry (kgsl, devfreq, Tegra load)"
    needs = "a readable GPU clock or load (kgsl, a devfreq GPU, a Tegra's load)"
    said = {"gpu": "kgsl, devfreq GPU, Tegra load"}

    def gpu(self, tr: SamplerTrace, samples) -> dict[str, tuple[float, str]]:
        df = tr.frame
        num = lambda c: pd.to_numeric(df[c].astype(str).str.split().str[0], errors="coerce")
        vals = {}
        freq = _freq(tr, num)
        if freq:
            vals["gpu_freq_mean"] = (float(pd.concat(freq).mean()), "sysfs")
        busy = _busy(tr, num)
        if busy:
            vals["gpu_busy_mean"] = (float(pd.concat(busy).mean()), "sysfs")
        temps = [num(c).dropna().map(temp_to_c) for c in tr.columns(r".*kgsl-3d0/temp")]
        temps = [x for x in temps if len(x)]
        if temps:
            vals["gpu_temp_max"] = (float(pd.concat(temps).max()), "sysfs")
        return vals

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        gpus = [f"{d} ({m.get('type')})" for d, m in v.trace.meta.items() if m.get("kind") == "gpu"]
        return bool(gpus), "; ".join(gpus) or "no readable GPU clock or load"


SOURCE = GpuSysfs()
