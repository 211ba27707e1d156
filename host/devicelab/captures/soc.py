"""A SoC's own files as people publish them: thermal zones, cpufreq policies, devfreq GPUs, /proc/cpuinfo.

Each capture becomes the file tree it was read from and goes through what the lab runs on a live device: the
sampler (device_payloads/sampler.sh) and the host's parsers of its trace; thermal.sh and the host's reading of it
(the cooldown's temperature now); facts.sh and the build target's ARM flag (GGML_CPU_ARM_ARCH)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ..build import targets
from ..telemetry import normalize
from ..telemetry.sources import thermal_zones
from . import Missing, Unsupported, _sysfs, reader

_ZONE_DIR = re.compile(r"^/sys/(?:class|devices/virtual)/thermal/(thermal_zone\d+)/(type|temp)$")
# a zone written as a pair, one a line or several: `TYPE RAW` (a for-loop's echo), `TYPE: RAW`, `TYPE=RAW`; a value
# with a decimal point or a °C unit was converted by whoever printed it (`41.5°C`, Python's raw/1000)
_ZONE_PAIR = re.compile(r"(?<![\w.@/-])([A-Za-z][\w.+-]*)(?:\s*[:=]\s*|\s+)(-?\d+(?:\.\d+)?)\s*(°C)?(?![\w.])")
_QUOTING = re.compile(r"[`'\"|{},*]")


def _unquote(text: str) -> str:
    """A capture as quoted in a mail reply: its `> ` markers off."""
    return "\n".join(re.sub(r"^(?:>\s?)+", "", line) for line in text.splitlines())


def _zone_files(text: str) -> dict[str, str]:
    """The thermal zones of a capture as sysfs files: from `grep . …/thermal_zone*/{type,temp}` output (either
    sysfs view), or from zones written as pairs (numbered in the order the capture lists them). A pair whose value a
    person or a tool already turned into °C is written back in the kernel's m°C."""
    files: dict[str, str] = {}
    for path, value in _sysfs.grep_files(_unquote(text)).items():
        m = _ZONE_DIR.match(path)
        if m:
            files[f"/sys/class/thermal/{m[1]}/{m[2]}"] = value.strip()
    if any(p.endswith("/temp") for p in files):
        return files
    for i, (zone_type, value, unit) in enumerate(_ZONE_PAIR.findall(_QUOTING.sub(" ", text))):
        raw = str(round(float(value) * 1000)) if unit or "." in value else value
        files[f"/sys/class/thermal/thermal_zone{i}/type"] = zone_type
        files[f"/sys/class/thermal/thermal_zone{i}/temp"] = raw
    return files


def _number(v) -> float | Missing:
    v = float(v)
    return Missing("the lab read no value from this capture") if math.isnan(v) else v


@reader("thermal-zones")
def thermal_zone_capture(path: Path) -> dict[str, Any]:
    """The hottest zone (°C) as a cell's trace gives it (the sampler, then normalize.hottest_c) and as the cooldown
    reads it now (thermal.sh on the device, then the host's conversion of each zone)."""
    files = _zone_files(path.read_text(errors="replace"))
    temps = [p for p in files if p.endswith("/temp")]
    if not temps:
        raise Unsupported("no thermal zone in this capture (expected `grep . …/thermal_zone*/{type,temp}` or TYPE RAW)")
    hottest = normalize.hottest_c(_sysfs.sample(files)).dropna()
    now = thermal_zones.parse_now(_sysfs.run_script("thermal.sh", files))
    return {
        "zones": len(temps),
        "hottest_c": float(hottest.max()) if len(hottest) else Missing(normalize.NO_TEMPERATURE),
        "hottest_now_c": now if now is not None else Missing(normalize.NO_TEMPERATURE),
    }


_PROMPT = re.compile(r"^(?:[\w.-]+@[\w.-]+:(?P<dir>[^$#\s]*))?\s*[$#]\s*(?P<cmd>.*)$")
_DEVFREQ = re.compile(r"^/sys/.*/devfreq/([^/]+)/([^/]+)$")


def _transcript_files(text: str) -> dict[str, str]:
    """Files read in a shell transcript: `PROMPT:DIR$ cat FILE` and the lines after it, and `grep . *` run in the
    folder a `cd DIR` line went to (`NAME:VALUE` lines)."""
    files: dict[str, str] = {}
    cwd, reading = "", ""
    for line in text.splitlines():
        p = _PROMPT.match(line)
        cd = re.match(r"^\s*cd\s+(/\S+)\s*$", line)
        if p or cd:
            reading = ""
            if cd:
                cwd = cd[1]
            elif p:
                cwd = p["dir"] or cwd
            cat = re.match(r"cat\s+(\S+)\s*$", p["cmd"]) if p else None
            if cat:
                reading = cat[1] if cat[1].startswith("/") else f"{cwd.rstrip('/')}/{cat[1]}"
            continue
        rel = re.match(r"^([a-z][a-z0-9_]*):(.*)$", line)
        if reading and line.strip() and not line.startswith("```"):
            files[reading] = files[reading] + "\n" + line.strip() if reading in files else line.strip()
        elif rel and cwd.startswith("/sys/"):
            path = f"{cwd.rstrip('/')}/{rel[1]}"
            files[path] = files[path] + "\n" + rel[2] if path in files else rel[2]
        else:
            reading = ""
    return files


def _sysfs_files(path: Path, what: str) -> dict[str, str]:
    """A capture of sysfs files: `grep . FILES` output (also as quoted in a mail reply), else a shell transcript.
    A devfreq device's folder is written where the sampler looks for it (/sys/class/devfreq/NAME)."""
    text = path.read_text(errors="replace")
    files = _sysfs.grep_files(_unquote(text)) or _transcript_files(text)
    out = {}
    for p, v in files.items():
        m = _DEVFREQ.match(p)
        out[f"/sys/class/devfreq/{m[1]}/{m[2]}" if m else p] = v
    if not out:
        raise Unsupported(f"no {what} file in this capture (expected `grep . FILES` output or a shell transcript)")
    return out


@reader("cpufreq")
def cpufreq_capture(path: Path) -> dict[str, Any]:
    """`grep . /sys/devices/system/cpu/cpufreq/policy*/…` (or per-CPU cpu*/cpufreq/…): the mean CPU clock in Hz
    the cell's trace gives (normalize.cpu_freq_hz: each policy weighted by the CPUs it clocks)."""
    tr = _sysfs.sample(_sysfs_files(path, "cpufreq"))
    return {"cpu_freq_hz": _number(normalize.cpu_freq_hz(tr).dropna().mean())}


@reader("devfreq")
def gpu_capture(path: Path) -> dict[str, Any]:
    """A devfreq GPU's files (a Mali's, the msm driver's Adreno): the cell's GPU figures (normalize.gpu_rows), SI units.
    (No `kgsl` format yet: no verbatim capture of /sys/class/kgsl/kgsl-3d0 was found to test it against.)"""
    tr = _sysfs.sample(_sysfs_files(path, "GPU"))
    out: dict[str, Any] = {}
    for r in normalize.gpu_rows(tr):
        out[r.metric] = Missing(r.missing_reason or "missing") if math.isnan(r.value) else r.value
    return out


@reader("cpuinfo")
def cpuinfo_capture(path: Path) -> dict[str, Any]:
    """A device's /proc/cpuinfo through facts.sh (its ROOT) and the host's facts: the model line, the features, the
    cores by part number, and the GGML_CPU_ARM_ARCH an aarch64 build for that device gets."""
    text = path.read_text(errors="replace")
    if not re.search(r"^(Features|flags)\s*:", text, re.M):
        raise Unsupported("no Features/flags line: not a /proc/cpuinfo the lab can take CPU features from")
    f = _sysfs.device_facts({"/proc/cpuinfo": text.rstrip("\n")})
    feats = set((f.get("cpu.features") or "").split())
    return {
        "cpu.model": f.get("cpu.model", ""),
        "cpu.features": f.get("cpu.features", ""),
        "cpu.parts": f.get("cpu.parts", ""),
        "arm_arch_flag": targets.arm_arch_flag(feats),
    }
