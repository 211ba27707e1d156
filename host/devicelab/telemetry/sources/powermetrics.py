"""macOS powermetrics (Apple silicon): where the SSH user may run it (it needs root: as root, or by a NOPASSWD
sudoers rule), run_payload.sh runs it beside the payload into powermetrics.plist — the SoC energy model's CPU,
GPU and ANE energy, thermal pressure and the clusters' clocks. A Mac has no sysfs and no sub-second device clock:
its figures cover the whole cell. powermetrics' default text output (what people paste, what an older runner or
a user's own capture holds) is read into the same samples; on an Intel Mac it gives the package power only."""

from __future__ import annotations

import plistlib
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ...schema import Row, missing
from ...transports.base import Transport
from ..sampler_csv import SamplerTrace
from .base import DeviceAccess, ProbeView, Source

TOOL = "powermetrics"
FILE = "powermetrics.plist"

THERMAL_PRESSURE = {"nominal": 0, "light": 1, "moderate": 2, "heavy": 3, "trapping": 4, "sleeping": 4, "critical": 4}

NO_ROOT = "needs root: allow it with a sudoers rule (NOPASSWD: /usr/bin/powermetrics) for the SSH user"


def access(t: Transport) -> str:
    """How this Mac lets the SSH user run powermetrics (it needs root): 'root', 'sudo' (a NOPASSWD sudoers
    rule for it: `sudo -n -l` says so without running it), or '' (not available: no SoC energy figures)."""
    r = t.sh(
        "command -v powermetrics >/dev/null 2>&1 || exit 0; "
        'if [ "$(id -u)" = 0 ]; then echo root; elif sudo -n -l powermetrics >/dev/null 2>&1; then echo sudo; fi'
    )
    out = r.stdout.strip()
    return out if out in ("root", "sudo") else ""


def _joules(v) -> float | None:
    return v / 1e3 if isinstance(v, (int, float)) else None


def _sample(d: dict) -> dict | None:
    proc, gpu = d.get("processor") or {}, d.get("gpu") or {}
    dt = d.get("elapsed_ns")
    if not isinstance(dt, (int, float)) or dt <= 0:
        return None
    dt = dt / 1e9
    parts = {k: proc.get(f"{k}_energy", gpu.get(f"{k}_energy") if k == "gpu" else None) for k in ("cpu", "gpu", "ane")}
    if any(isinstance(v, (int, float)) for v in parts.values()):
        energy = sum(float(v) for v in parts.values() if isinstance(v, (int, float))) / 1e3
        how = "energy"
    elif isinstance(proc.get("combined_power"), (int, float)):
        energy = float(proc["combined_power"]) / 1e3 * dt
        how = "combined_power"
    else:
        energy, how = None, None
    tp = d.get("thermal_pressure")
    return {
        "elapsed_s": dt,
        "energy_j": energy,
        "energy_from": how,
        "cpu_j": _joules(parts["cpu"]),
        "gpu_j": _joules(parts["gpu"]),
        "ane_j": _joules(parts["ane"]),
        "thermal_pressure": THERMAL_PRESSURE.get(str(tp).lower()) if tp is not None else None,
        "cluster_hz": {
            c.get("name", str(i)): float(c["freq_hz"])
            for i, c in enumerate(proc.get("clusters") or [])
            if isinstance(c, dict) and isinstance(c.get("freq_hz"), (int, float))
        },
    }


def parse(raw: bytes) -> list[dict]:
    """`powermetrics -f plist -s cpu_power,gpu_power,thermal`: one plist per sample, samples separated by NUL
    bytes. Per sample: its length (elapsed_ns), the SoC energy model's CPU, GPU and ANE energy over it
    (processor.cpu_energy / gpu_energy / ane_energy, mJ; the GPU's may sit in the gpu dict) or, without those,
    combined_power (mW) × length; thermal_pressure; each CPU cluster's clock (freq_hz). A sample cut off by the
    stop (the last, half-written) is skipped. A capture in powermetrics' text format is read by parse_text."""
    if b"<plist" not in raw and b"system activity (" in raw:
        return parse_text(raw.decode("utf-8", "replace"))
    out = []
    for chunk in raw.split(b"\0"):
        chunk = chunk.strip()
        if not chunk:
            continue
        try:
            d = plistlib.loads(chunk)
        except Exception:  # plistlib raises several types for a torn document
            continue
        s = _sample(d)
        if s is not None:
            out.append(s)
    return out


# `*** Sampled system activity (Tue Nov 28 14:37:01 2023 +0100) (1006.50ms elapsed) ***` (or `Summary …`, the
# whole run's averages with --show-summary)
_HEAD = re.compile(r"^\*\*\* (?:Sampled|Summary) system activity \(.*\) \(([\d.]+)\s*ms elapsed\) \*\*\*", re.M)
_POWER = re.compile(
    r"^(CPU|GPU|ANE|Combined|Package) Power(?: \(CPU \+ GPU \+ ANE\))?:\s*([\d.]+)\s*(mW|W)\s*$"
    r"|^Intel energy model derived package power \(CPUs\+GT\+SA\):\s*([\d.]+)\s*(mW|W)\s*$",
    re.M,
)
_CLUSTER = re.compile(r"^(\S+-Cluster) HW active frequency:\s*([\d.]+)\s*MHz", re.M)
_INTEL_CLOCK = re.compile(
    r"^System Average frequency as fraction of nominal:\s*[\d.]+%\s*\(([\d.]+)\s*Mhz\)", re.M | re.I
)
_PRESSURE = re.compile(r"^Current pressure level:\s*(\w+)", re.M)


def parse_text(text: str) -> list[dict]:
    """powermetrics' default text output (`powermetrics -s cpu_power,gpu_power,thermal`, or the default samplers)
    into the samples parse() gives: per `*** Sampled system activity (…) (N ms elapsed) ***` block, its length;
    `CPU Power: N mW`, `GPU Power`, `ANE Power` (the first of each: the GPU sampler repeats `GPU Power`) as energy
    over the block; without them `Combined Power (CPU + GPU + ANE)` or macOS 12's `Package Power`, or an Intel Mac's
    `Intel energy model derived package power (CPUs+GT+SA): 2.52W` × the length; `Current pressure level`; each
    cluster's `HW active frequency` (an Intel Mac: the `System Average frequency`). A block with no power line (a
    tasks-only block, a sample cut off) gives no sample."""
    heads = list(_HEAD.finditer(text))
    out = []
    for i, h in enumerate(heads):
        body = text[h.end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        dt = float(h.group(1)) / 1e3
        if dt <= 0:
            continue
        watts: dict[str, float] = {}
        for m in _POWER.finditer(body):
            name = (m.group(1) or "Intel").lower()
            value, unit = (m.group(2), m.group(3)) if m.group(1) else (m.group(4), m.group(5))
            watts.setdefault(name, float(value) / (1e3 if unit == "mW" else 1.0))
        if not watts:
            continue
        parts = {k: watts.get(k) for k in ("cpu", "gpu", "ane")}
        if any(v is not None for v in parts.values()):
            energy, how = sum(v for v in parts.values() if v is not None) * dt, "energy"
        elif "combined" in watts or "package" in watts:
            energy, how = (watts["combined"] if "combined" in watts else watts["package"]) * dt, "combined_power"
        else:
            energy, how = watts["intel"] * dt, "package_power"
        tp = _PRESSURE.search(body)
        clusters = {m.group(1): float(m.group(2)) * 1e6 for m in _CLUSTER.finditer(body)}
        if not clusters and (ic := _INTEL_CLOCK.search(body)):
            clusters = {"System": float(ic.group(1)) * 1e6}
        out.append(
            {
                "elapsed_s": dt,
                "energy_j": energy,
                "energy_from": how,
                "cpu_j": parts["cpu"] * dt if parts["cpu"] is not None else None,
                "gpu_j": parts["gpu"] * dt if parts["gpu"] is not None else None,
                "ane_j": parts["ane"] * dt if parts["ane"] is not None else None,
                "thermal_pressure": THERMAL_PRESSURE.get(tp.group(1).lower()) if tp else None,
                "cluster_hz": clusters,
            }
        )
    return out


class Powermetrics(Source):
    name = TOOL
    title = "macOS powermetrics (SoC energy, thermal pressure)"
    needs = "powermetrics, run as root or by a NOPASSWD sudoers rule"
    tools = (TOOL,)
    pulled = (FILE,)

    def setup(self, d: DeviceAccess) -> str:
        if TOOL not in d.tools:
            return ""
        how = access(d.t)
        if not how:
            d.note(f"note: {d.name} has no power figures without powermetrics, which {NO_ROOT}")
        return how

    def env(self, setting: str) -> dict[str, str]:
        return {"DEVICELAB_POWERMETRICS": setting} if setting else {}

    def read(self, folder: Path) -> list[dict] | None:
        f = folder / FILE
        return parse(f.read_bytes()) if f.is_file() else None

    def cpu_clock(self, tr: SamplerTrace, samples: list[dict] | None) -> pd.Series | None:
        if not samples:
            return None
        return pd.Series(
            [float(np.mean(list(x["cluster_hz"].values()))) for x in samples if x["cluster_hz"]], dtype=float
        )

    def gpu(self, tr: SamplerTrace, samples: list[dict] | None) -> dict[str, tuple[float, str]]:
        pm_g = [x for x in samples or [] if x.get("gpu_j") is not None and x.get("elapsed_s")]
        if not pm_g:
            return {}
        e, d = sum(x["gpu_j"] for x in pm_g), sum(x["elapsed_s"] for x in pm_g)
        return {"gpu_energy": (e, TOOL), "gpu_power_mean": (e / d, TOOL)}

    def pressure(self, samples: list[dict] | None) -> tuple[list[Row], bool]:
        tp = [x["thermal_pressure"] for x in samples or [] if x["thermal_pressure"] is not None]
        if not tp:
            return [], False
        return [
            Row(metric="thermal_status", value=float(max(tp)), phase="cell", test="powermetrics thermal_pressure")
        ], max(tp) > tp[0]

    def cell_energy(self, samples: list[dict] | None, phases: list) -> tuple[list[Row], dict] | None:
        pm_e = [x for x in samples or [] if x["energy_j"] is not None]
        if not pm_e:
            return None
        e, dur = sum(x["energy_j"] for x in pm_e), sum(x["elapsed_s"] for x in pm_e)
        rows = [
            Row(metric="energy", value=e, phase="cell", test=TOOL, n=len(pm_e)),
            Row(metric="power_mean", value=e / dur, phase="cell", test=TOOL, n=len(pm_e)),
        ]
        # phases need the device's clock, which a Mac lacks (no /proc/uptime)
        rows += [
            missing(
                "energy",
                "powermetrics gives the whole cell only: no sub-second device clock to place phases on",
                phase=ph.kind,
                test=ph.name,
            )
            for ph in phases
        ]
        how = sorted({x["energy_from"] for x in pm_e})
        return rows, {"source": TOOL, "energy_from": ",".join(how), "samples": len(pm_e)}

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        how = access(v.t) if TOOL in v.tools else ""
        if how:
            return True, f"runs as {how}"
        return False, f"present but {NO_ROOT}" if TOOL in v.tools else "not on this device"


SOURCE = Powermetrics()
