"""NVIDIA GPUs: where the device has nvidia-smi, run_payload.sh runs it beside the payload at the sampler's
interval (power, memory, utilisation, temperature, SM clock, throttle reasons) into nvidia-smi.csv.

What nvidia-smi prints, as real machines print it (tests/fixtures/real/nvidia-smi/): the header names each field
with the unit it is in (`power.draw [W]`, `memory.used [MiB]`, `clocks.current.sm [MHz]` — nvidia-smi writes the
canonical name even when the query used an alias such as `clocks.sm`); without `nounits` every value carries
its unit too (`45.12 W`, `1024 MiB`, `100 %`); a field the GPU does not support reads `[N/A]` or
`[Not Supported]` (utilisation on a MIG-enabled H100, power on some GeForce boards). With several GPUs each
sampling round prints one row per GPU, each with its own timestamp a few ms apart: a round is a run of rows of
distinct GPUs, and power, energy and memory are summed over the GPUs of a round."""

from __future__ import annotations

import csv
import datetime as dt
import math
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..sampler_csv import SamplerTrace
from ..units import integrate_power
from .base import DeviceAccess, ProbeView, Source, present

TOOL = "nvidia-smi"
FILE = "nvidia-smi.csv"
# the query run_payload.sh sends (kept in step with device_payloads/run_payload.sh)
QUERY = (
    "timestamp",
    "index",
    "name",
    "power.draw",
    "memory.used",
    "utilization.gpu",
    "temperature.gpu",
    "clocks.sm",
    "clocks_throttle_reasons.active",
)

# sample key: (the field names nvidia-smi may print for it, first preferred; its unit when none is written;
# factor from that unit to SI)
FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "power_w": (("power.draw", "power.draw.instant", "power.draw.average"), "W"),
    "mem_bytes": (("memory.used",), "MiB"),
    "busy": (("utilization.gpu",), "%"),
    "temp_c": (("temperature.gpu",), "C"),
    "sm_hz": (("clocks.current.sm", "clocks.sm"), "MHz"),
}
_IDS = ("uuid", "gpu_uuid", "pci.bus_id", "gpu_bus_id")
_NAMES = ("name", "gpu_name")
_THROTTLE = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
# units nvidia-smi writes, to SI (its MiB are 2^20 bytes; drivers before ~R340 labelled the same numbers "MB")
UNITS = {
    "W": 1.0,
    "mW": 1e-3,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "MB": 2**20,
    "MHz": 1e6,
    "GHz": 1e9,
    "%": 0.01,
    "C": 1.0,
}
_HEAD = re.compile(r"^(?P<field>[A-Za-z_][\w.]*)(?:\s*\[(?P<unit>[^\]]*)\])?$")
_NUM = re.compile(r"^(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[A-Za-z%]*)$")
# a value nvidia-smi writes where it has none: [N/A], [Not Supported], [Unknown Error], [Insufficient Permissions]
_NONE = re.compile(r"^\[[^\]]*\]$|^N/A$", re.IGNORECASE)
_ROUND_GAP_S = 0.05  # rows with no GPU identity: a new round where the clock moved on by more than this


def _header(cells: list[str]) -> list[tuple[str, str | None]] | None:
    """[(field, unit)] when the row is nvidia-smi's header line, else None."""
    out = []
    for c in cells:
        m = _HEAD.match(c.strip())
        if not m:
            return None
        out.append((m["field"], m["unit"]))
    return out


def _value(raw: str, unit: str | None) -> tuple[float | None, str | None]:
    """(value in SI, None) or (None, why): the unit the value or its header states; a value the GPU does not
    give ('[N/A]', '[Not Supported]') is None with that text as the reason."""
    raw = raw.strip()
    if not raw:
        return None, "empty"
    if _NONE.match(raw):
        return None, f"nvidia-smi reports {raw}"
    m = _NUM.match(raw)
    if not m:
        return None, f"not a number: {raw!r}"
    u = m["unit"] or unit
    if u is None:
        return float(m["num"]), None
    if u not in UNITS:
        return None, f"unknown unit {u!r} in {raw!r}"
    return float(m["num"]) * UNITS[u], None


def _time(raw: str | None) -> float | None:
    try:
        return dt.datetime.strptime((raw or "").strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        return None


def parse(text: str, fields: list[str] | tuple[str, ...] | None = None) -> list[dict]:
    """`nvidia-smi --query-gpu=… --format=csv[,noheader][,nounits] [-lms N]` → one dict per GPU and sample, SI
    units: t (epoch s, None without a timestamp column), gpu (index), gpu_id (index, uuid or bus id), name,
    power_w, mem_bytes, busy (0–1), temp_c, sm_hz, throttle (the active reasons' bitmask), round (the sampling
    round: consecutive rows of distinct GPUs), why ({key: why it is None} for fields the GPU does not give).
    `fields`: the query that was sent, for output printed with `noheader` (a header line, where there is one,
    names the columns instead); [] when there is neither."""
    rows = [r for r in csv.reader((ln.strip() for ln in text.splitlines()), skipinitialspace=True) if any(r)]
    head: list[tuple[str, str | None]] | None = [(f.strip(), None) for f in fields] if fields else None
    out: list[dict] = []
    seen: set[str] = set()
    rnd, prev_t = -1, None
    for r in rows:
        h = _header(r)
        if h is not None:
            head = h  # the header line (again, where several runs were appended to one file)
            continue
        if head is None or len(r) != len(head):
            continue
        s = _sample({f: (u, x.strip()) for (f, u), x in zip(head, r, strict=True)})
        ident = s["gpu_id"]
        if rnd < 0:
            new = True
        elif ident is not None:
            new = ident in seen
        else:  # no GPU identity in the query: the clock moving on starts a round (one round without a clock)
            new = s["t"] is not None and prev_t is not None and s["t"] - prev_t > _ROUND_GAP_S
        if new:
            rnd, seen = rnd + 1, set()
        if ident is None:  # the GPUs of a round in the order nvidia-smi prints them (by index)
            ident = s["gpu_id"] = f"#{len(seen)}"
        seen.add(ident)
        prev_t = s["t"]
        s["round"] = rnd
        out.append(s)
    return out


def _sample(d: dict[str, tuple[str | None, str]]) -> dict:
    def first(names):
        return next((d[n] for n in names if n in d), None)

    s: dict = {"why": {}}
    ts = first(("timestamp",))
    s["t"] = _time(ts[1]) if ts else None
    idx = first(("index",))
    s["gpu"] = int(idx[1]) if idx and idx[1].isdigit() else 0
    ident = idx or first(_IDS)
    s["gpu_id"] = ident[1] if ident and ident[1] else None
    nm = first(_NAMES)
    s["name"] = nm[1] if nm else None
    for key, (names, default) in FIELDS.items():
        cell = first(names)
        if cell is None:
            s[key] = None
            continue
        v, why = _value(cell[1], cell[0] or default)
        s[key] = v
        if why:
            s["why"][key] = why
    thr = first(_THROTTLE)
    s["throttle"] = int(thr[1], 16) if thr and thr[1].lower().startswith("0x") else None
    return s


def _reason(nv: pd.DataFrame, key: str) -> str:
    """Why a figure is missing, from the rows: what nvidia-smi printed for it, on which GPUs."""
    whys = {(r["name"] or f"GPU {r['gpu_id']}", r["why"][key]) for _, r in nv.iterrows() if key in r["why"]}
    if not whys:
        return f"{FIELDS[key][0][0]} is not in the nvidia-smi query"
    return "; ".join(f"{w} on {n}" for n, w in sorted(whys))


def _frame(nv: list[dict]) -> pd.DataFrame:
    s = pd.DataFrame(nv)
    defaults: dict[str, Callable[[], Any]] = {"why": lambda: [{} for _ in range(len(s))],
                "round": lambda: range(len(s)), "gpu_id": lambda: s["gpu"].astype(str), "t": lambda: None}  # fmt: skip
    for col, make in defaults.items():
        if col not in s:
            s[col] = make()
    return s


def _per_round(s: pd.DataFrame, col: str) -> tuple[list[float], list[float]]:
    """(round times, the column summed over the GPUs of each complete round with a value from every GPU): a round
    that lacks a GPU (the run ended halfway through it) or a GPU's value is left out, so a sum is never partial."""
    n_gpus = max(s["gpu_id"].nunique(), 1)
    ts, vs = [], []
    for _, g in s.groupby("round"):
        if len(g) == n_gpus and g["gpu_id"].nunique() == n_gpus and g[col].notna().all():
            t = pd.to_numeric(g["t"], errors="coerce").dropna()
            ts.append(float(t.iloc[0]) if len(t) else math.nan)
            vs.append(float(g[col].sum()))
    return ts, vs


def gpu_figures(nv: list[dict]) -> dict[str, tuple[float, str]]:
    """Power (mean W over the sampling rounds, all GPUs of a round summed) and energy, peak memory (the round's
    sum), busy share (mean over GPUs and rounds), peak temperature, mean SM clock: {metric: (value, source)}.
    A figure nvidia-smi does not give is (NaN, why): printed as unsupported, or not queried."""
    s = _frame(nv)
    if not len(s):
        return {}
    src = "nvidia-smi " + ", ".join(sorted({str(x) for x in s["name"].dropna()}))
    vals: dict[str, tuple[float, str]] = {}
    tt, p = _per_round(s, "power_w")
    if p:
        vals["gpu_power_mean"] = (sum(p) / len(p), src)
        if len(p) < 2:
            vals["gpu_energy"] = (math.nan, "one nvidia-smi sample: energy needs two")
        elif any(math.isnan(t) for t in tt):
            vals["gpu_energy"] = (math.nan, "the nvidia-smi query has no timestamp: no time axis for energy")
        else:
            vals["gpu_energy"] = (integrate_power(np.array(tt), np.array(p), tt[0], tt[-1]), src)
    else:
        vals["gpu_power_mean"] = vals["gpu_energy"] = (math.nan, _reason(s, "power_w"))
    _, m = _per_round(s, "mem_bytes")
    vals["gpu_mem_peak"] = (max(m), src) if m else (math.nan, _reason(s, "mem_bytes"))
    for metric, col, how in (("gpu_busy_mean", "busy", "mean"), ("gpu_temp_max", "temp_c", "max"),
                             ("gpu_freq_mean", "sm_hz", "mean")):  # fmt: skip
        v = pd.to_numeric(s[col], errors="coerce").dropna()
        vals[metric] = (float(getattr(v, how)()), src) if len(v) else (math.nan, _reason(s, col))
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
        return parse(f.read_text(errors="replace"), QUERY) if f.is_file() else None

    def gpu(self, tr: SamplerTrace, samples: list[dict] | None) -> dict[str, tuple[float, str]]:
        return gpu_figures(samples) if samples else {}

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        return present(TOOL, v)


SOURCE = NvidiaSmi()
