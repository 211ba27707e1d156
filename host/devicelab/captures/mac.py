"""What a Mac printed for other people: powermetrics (plist and text), ioreg's AppleSmartBattery, vm_stat,
memory_pressure, sysctl and pmset, each read through the lab's own path on a live Mac.

powermetrics goes through telemetry.sources.powermetrics (its parser, then what the Powermetrics source derives
for a cell: energy, power, GPU power, thermal pressure, clock). ioreg and pmset go through the mac-battery
source's snapshot parsers. vm_stat, memory_pressure, sysctl and ioreg's capacity are what device_payloads/facts.sh
reads on a Mac: facts.sh runs here with stand-ins for those tools on PATH that print the capture (test doubles fed
a real capture; no Mac is attached), and the host's facts, budget and battery reckoning take its output."""

from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

from .. import budget
from ..telemetry import sampler_csv
from ..telemetry.sources import mac, powermetrics
from . import Missing, Unsupported, _sysfs, reader

NOT_IN_CAPTURE = "not in the capture"


def _or_missing(v, why: str = NOT_IN_CAPTURE):
    return Missing(why) if v is None else v


# ---------------------------------------------------------------- facts.sh with stand-ins


_SYSCTL = r"""#!/bin/sh
# stand-in for macOS sysctl: answers `sysctl [-n] KEY…` from a capture of `sysctl` output (KEY: VALUE lines)
n=""; [ "$1" = -n ] && { n=1; shift; }
rc=0
for k in "$@"; do
  found=""
  while IFS= read -r line; do
    case $line in "$k: "*) found=1; if [ -n "$n" ]; then echo "${line#"$k: "}"; else echo "$line"; fi; break ;; esac
  done < %(cap)s
  [ -n "$found" ] || { echo "sysctl: unknown oid '$k'" >&2; rc=1; }
done
exit $rc
"""


def _facts_with(standins: dict[str, str]) -> dict:
    """device_payloads/facts.sh run here with stand-ins on PATH: {tool: capture text} (the tool prints the
    capture, whatever its arguments; `sysctl` answers the keys asked from a sysctl capture). The ROOT is an empty
    tree, so no /sys file of this machine is read; the facts a Mac's tools do not give are this machine's and are
    not taken from here."""
    with tempfile.TemporaryDirectory(prefix="devicelab-mac-") as d:
        tools = {}
        for tool, text in standins.items():
            cap = Path(d) / f"{tool}.capture"
            cap.write_text(text)
            tools[tool] = _SYSCTL % {"cap": shlex.quote(str(cap))} if tool == "sysctl" else f"#!/bin/sh\ncat {cap}\n"
        return _sysfs.device_facts({}, tools)


# ---------------------------------------------------------------- powermetrics


def _pm_figures(samples: list[dict]) -> dict[str, Any]:
    """What the Powermetrics source makes of a cell's samples: energy and mean power (cell_energy), the GPU's
    (gpu), the thermal status (pressure), the mean CPU clock (cpu_clock); and the CPU's and ANE's mean power,
    their energy over the same samples' length (the source keeps them in the samples)."""
    if not samples:
        raise Unsupported("no powermetrics sample with a length and a power figure in this capture")
    src = powermetrics.SOURCE
    out: dict[str, Any] = {"samples": len(samples), "elapsed_s": sum(x["elapsed_s"] for x in samples)}
    cell = src.cell_energy(samples, [])
    if cell is None:
        out["energy_j"] = out["power_w"] = Missing("no energy or combined power in the capture")
    else:
        by = {r.metric: r.value for r in cell[0]}
        out["energy_j"], out["power_w"], out["energy_from"] = by["energy"], by["power_mean"], cell[1]["energy_from"]
    gpu = src.gpu(sampler_csv.parse("# clock none\ntick,t_s\n"), samples)
    out["gpu_power_w"] = gpu["gpu_power_mean"][0] if gpu else Missing("no GPU power in the capture")
    for part in ("cpu", "ane"):
        have = [x for x in samples if x.get(f"{part}_j") is not None]
        out[f"{part}_power_w"] = (
            sum(x[f"{part}_j"] for x in have) / sum(x["elapsed_s"] for x in have)
            if have
            else Missing(f"no {part.upper()} power in the capture")
        )
    rows, _ = src.pressure(samples)
    out["thermal_status"] = rows[0].value if rows else Missing("no thermal pressure in the capture (thermal sampler)")
    clock = src.cpu_clock(sampler_csv.parse("# clock none\ntick,t_s\n"), samples)
    out["cpu_freq_hz"] = float(clock.mean()) if clock is not None and len(clock) else Missing("no CPU cluster clock")
    for name in {n for x in samples for n in x["cluster_hz"]}:
        vals = [x["cluster_hz"][name] for x in samples if name in x["cluster_hz"]]
        out[f"{name}_hz"] = sum(vals) / len(vals)
    return out


@reader("powermetrics-plist")
def powermetrics_plist(path: Path) -> dict[str, Any]:
    """`powermetrics -f plist` (one plist a sample, NUL-separated, as run_payload.sh writes powermetrics.plist)."""
    raw = path.read_bytes()
    if b"<plist" not in raw:
        raise Unsupported("not a powermetrics plist (no <plist> document)")
    return _pm_figures(powermetrics.parse(raw))


@reader("powermetrics-text")
def powermetrics_text(path: Path) -> dict[str, Any]:
    """powermetrics' default text output: `*** Sampled system activity … (N ms elapsed) ***` blocks."""
    raw = path.read_bytes()
    if b"system activity (" not in raw:
        raise Unsupported("no `*** Sampled system activity (…) (N ms elapsed) ***` block: not powermetrics' text")
    return _pm_figures(powermetrics.parse(raw))  # the source's own reading of its file, which takes either form


# ---------------------------------------------------------------- ioreg


@reader("ioreg")
def ioreg(path: Path) -> dict[str, Any]:
    """`ioreg -rn AppleSmartBattery` (or the AppleSmartBattery entry of `ioreg -l`): the mac-battery snapshot's
    figures in SI units, and the full-charge capacity facts.sh reads from it (budget.battery: Wh)."""
    text = path.read_text(errors="replace")
    if not mac.ioreg_props(text):
        raise Unsupported('no `"Key" = value` property of AppleSmartBattery in this capture')
    d = mac.ioreg_battery(text)
    out = {k: _or_missing(d[k]) for k in d if k not in ("raw_current_unit", "raw_capacity_unit")}
    out["capacity_unit"] = _or_missing(d["raw_capacity_unit"])
    wh, how = budget.battery(_facts_with({"ioreg": text}))
    out["battery_wh"] = Missing(how) if wh is None else wh
    return out


# ---------------------------------------------------------------- vm_stat, memory_pressure, sysctl


@reader("vm-stat")
def vm_stat(path: Path) -> dict[str, Any]:
    """`vm_stat` through facts.sh (mem.vm_stat) and the budget the host reckons from it (budget.from_facts)."""
    text = path.read_text(errors="replace")
    if "Mach Virtual Memory Statistics" not in text:
        raise Unsupported("no `Mach Virtual Memory Statistics:` header: not vm_stat output")
    f = _facts_with({"vm_stat": text})
    raw = str(f.get("mem.vm_stat", "")).replace(";", "\n")
    page = re.search(r"page size of (\d+) bytes", raw)
    b = budget.from_facts({k: v for k, v in f.items() if k.startswith("mem.vm_stat")})
    return {
        "page_size": int(page.group(1)) if page else Missing("no page size in the header"),
        "available_bytes": _or_missing(budget.vm_stat_available(raw), "no `Pages free:` line"),
        "budget_bytes": _or_missing(b.bytes, b.detail),
        "budget_source": b.source,
    }


@reader("memory-pressure")
def memory_pressure(path: Path) -> dict[str, Any]:
    """`memory_pressure` through facts.sh (the `free percentage` line: mem.free_percent); where the capture says
    the machine's size (`The system has N (…)` or `Physical memory: N bytes`), the budget the host reckons from
    the share (budget.from_facts, no vm_stat)."""
    text = path.read_text(errors="replace")
    f = _facts_with({"memory_pressure": text})
    if "mem.free_percent" not in f:
        raise Unsupported("no `System-wide memory free percentage: N%` line: the lab reads nothing else of it")
    pct = int(f["mem.free_percent"])
    out: dict[str, Any] = {"free_fraction": pct / 100}
    size = re.search(r"(?:The system has|Physical memory:)\s*(\d+)", text)
    if size:
        total = int(size.group(1))
        b = budget.from_facts({"mem.free_percent": str(pct), "mem.total_kB": str(total // 1024)})
        out["total_bytes"], out["budget_bytes"], out["budget_source"] = total, b.bytes, b.source
    else:
        out["budget_bytes"] = Missing("the capture does not say the machine's memory size")
    return out


@reader("sysctl")
def sysctl(path: Path) -> dict[str, Any]:
    """`sysctl` output (KEY: VALUE lines) through facts.sh: cpu.model, cpu.features, cpu.count, mem.total_kB."""
    text = path.read_text(errors="replace")
    if not re.search(r"^(hw|machdep|kern)\.[\w.]+: ", text, re.M):
        raise Unsupported("no `hw.…: VALUE` / `machdep.…: VALUE` line: not sysctl output")
    f = _facts_with({"sysctl": text})
    if not f.get("cpu.model"):
        raise Unsupported("no machdep.cpu.brand_string: facts.sh takes a capture without one for another OS's")
    kb = f.get("mem.total_kB")
    ncpu = re.search(r"^hw\.ncpu: ", text, re.M)
    return {
        "cpu.model": f["cpu.model"],
        "cpu.features": f.get("cpu.features", ""),
        # without hw.ncpu facts.sh asks getconf, which answers for this machine, not the capture's
        "cpu.count": int(f["cpu.count"]) if ncpu else Missing("no hw.ncpu in the capture"),
        "mem_total_bytes": int(kb) * 1024 if kb else Missing("no hw.memsize in the capture"),
    }


# ---------------------------------------------------------------- pmset


@reader("pmset")
def pmset(path: Path) -> dict[str, Any]:
    """`pmset -g batt` (the power source and the level) or `pmset -g therm` (the CPU speed limit, the warning)."""
    text = path.read_text(errors="replace")
    if "drawing from" in text:
        d = mac.pmset_batt(text)
        if d["battery_level"] is None and d["power_source"] is None:
            raise Unsupported("no power source or battery line in this `pmset -g batt` capture")
        return {k: _or_missing(v) for k, v in d.items()}
    if "thermal warning" not in text and "CPU_Speed_Limit" not in text:
        raise Unsupported("neither `pmset -g batt` (Now drawing from …) nor `pmset -g therm` output")
    d = mac.pmset_therm(text)
    why = "no CPU power status recorded (Apple silicon's pmset keeps none)" if d["cpu_power_status"] is False else ""
    return {
        "cpu_speed_limit": _or_missing(d["cpu_speed_limit"], why or NOT_IN_CAPTURE),
        "cpu_available": _or_missing(d["cpu_available"], why or NOT_IN_CAPTURE),
        "thermal_warning_level": _or_missing(d["thermal_warning_level"]),
    }
