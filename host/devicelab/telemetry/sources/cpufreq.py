"""CPU clocks (cpufreq's scaling_cur_freq, per CPU or per policy), read by the sampler every tick."""

from __future__ import annotations

import pandas as pd

from ..sampler_csv import SamplerTrace
from .base import ProbeView, Source, folder_meta

FREQ_COLS = r"sys/devices/system/cpu/(cpu\d+/cpufreq|cpufreq/policy\d+)/scaling_cur_freq"


def cpu_freq_hz(tr: SamplerTrace) -> pd.Series | None:
    """Per tick, the mean CPU clock in Hz over all CPUs: a policy column counts once per CPU it clocks (its
    meta 'cpus=0,1,2,3'), a per-CPU column once. None without such columns."""
    cols = tr.columns(FREQ_COLS)
    if not cols:
        return None
    w = {c: max(1, len([x for x in folder_meta(tr, c).get("cpus", "").split(",") if x])) for c in cols}
    parts = [pd.to_numeric(tr.frame[c], errors="coerce") * 1e3 * w[c] for c in cols]  # kHz → Hz
    total = sum(parts[1:], parts[0])
    return total / sum(w.values())


class CpuFreq(Source):
    name = "cpufreq"
    title = "CPU frequency"
    needs = "readable cpufreq/scaling_cur_freq"
    said = {"cpu_clock": "cpufreq"}

    def cpu_clock(self, tr: SamplerTrace, samples) -> pd.Series | None:
        return cpu_freq_hz(tr)

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        f = v.trace.columns(FREQ_COLS)
        pol = [c for c in f if "/policy" in c]
        if not f:
            return False, f"no {self.needs}"
        return True, f"{len(pol)} cpufreq policies (clusters)" if pol else f"{len(f)} CPUs"


SOURCE = CpuFreq()
