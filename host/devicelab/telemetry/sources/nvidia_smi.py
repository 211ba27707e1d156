"""NVIDIA GPUs: where the device has nvidia-smi, run_payload.sh runs it beside the payload at the sampler's
interval (power, memory, utilisation, temperature, SM clock, throttle reasons) into nvidia-smi.csv."""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import pandas as pd

from ..sampler_csv import SamplerTrace
from ..units import integrate_power
from .base import DeviceAccess, ProbeView, Source, present

TOOL = "nvidia-smi"
FILE = "nvidia-smi.csv"


def _isnum(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _sample(d: dict) -> dict | None:
    num = lambda k: (
        float(d[k])
        if d.get(k) not in (None, "", "[N/A]", "[Not Supported]")  # noqa: E731
        and _isnum(d[k])
        else None
    )
    try:
        t = dt.datetime.strptime(d["timestamp"], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except (KeyError, ValueError):
        return None
    thr = d.get("clocks_throttle_reasons.active") or d.get("clocks_event_reasons.active")
    mem, sm = num("memory.used"), num("clocks.sm")
    busy = num("utilization.gpu")
    return {
        "t": t,
        "gpu": int(d.get("index") or 0),
        "name": d.get("name"),
        "power_w": num("power.draw"),
        "mem_bytes": mem * 1024**2 if mem is not None else None,
        "busy": busy / 100 if busy is not None else None,
        "temp_c": num("temperature.gpu"),
        "sm_hz": sm * 1e6 if sm is not None else None,
        "throttle": int(thr, 16) if thr and thr.startswith("0x") else None,
    }


def parse(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=timestamp,index,name,power.draw,… --format=csv,nounits -l…` → one dict per GPU
    and sample, SI units: t (epoch s), gpu (index), name, power_w, mem_bytes, busy (0–1), temp_c, sm_hz,
    throttle (the active reasons' bitmask). '[N/A]' and '[Not Supported]' are None."""
    rows = list(csv.reader(text.splitlines(), skipinitialspace=True))
    if not rows:
        return []
    head = [h.strip().split(" [")[0] for h in rows[0]]
    out = []
    for r in rows[1:]:
        if len(r) != len(head) or r[0] == head[0]:
            continue
        s = _sample(dict(zip(head, (x.strip() for x in r), strict=True)))
        if s is not None:
            out.append(s)
    return out


def gpu_figures(nv: list[dict]) -> dict[str, tuple[float, str]]:
    """Power (mean W, all GPUs summed per timestamp) and energy, peak memory, busy share, peak temperature,
    mean SM clock."""
    s = pd.DataFrame(nv)
    src = "nvidia-smi " + ", ".join(sorted({str(x) for x in s["name"].dropna()}))
    per_t = s.groupby("t")  # all GPUs at one timestamp
    vals = {}
    if s["power_w"].notna().any():
        p = per_t["power_w"].sum(min_count=1).dropna()
        vals["gpu_power_mean"] = (float(p.mean()), src)
        if len(p) > 1:
            tt = p.index.to_numpy(dtype=float)
            vals["gpu_energy"] = (integrate_power(tt, p.to_numpy(dtype=float), tt[0], tt[-1]), src)
    for metric, col, how in (
        ("gpu_mem_peak", "mem_bytes", "max"),
        ("gpu_busy_mean", "busy", "mean"),
        ("gpu_temp_max", "temp_c", "max"),
        ("gpu_freq_mean", "sm_hz", "mean"),
    ):
        if s[col].notna().any():
            agg = per_t[col].sum(min_count=1) if col == "mem_bytes" else s[col]
            vals[metric] = (float(getattr(agg.dropna(), how)()), src)
    return vals


class NvidiaSmi(Source):
    name = TOOL
    title = "NVIDIA GPU telemetry (nvidia-smi)"
    needs = "nvidia-smi on the device's PATH"
    tools = (TOOL,)
    pulled = (FILE,)
    said = {"gpu": TOOL}

    def setup(self, d: DeviceAccess) -> str:
        return "1" if TOOL in d.tools else ""

    def env(self, setting: str) -> dict[str, str]:
        return {"DEVICELAB_NVIDIA_SMI": "1"} if setting else {}

    def read(self, folder: Path) -> list[dict] | None:
        f = folder / FILE
        return parse(f.read_text(errors="replace")) if f.is_file() else None

    def gpu(self, tr: SamplerTrace, samples: list[dict] | None) -> dict[str, tuple[float, str]]:
        return gpu_figures(samples) if samples else {}

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        return present(TOOL, v)


SOURCE = NvidiaSmi()
