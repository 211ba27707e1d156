"""The telemetry sources' registry: what the session, the cell, the artifacts' derivation, normalize, the snapshots
and `devices probe` ask. Each source is one unit (base.Source); adding one is a module and a line here.

The order is meaningful: snapshots are taken and their rows listed in it, a later source's GPU figure replaces
an earlier's, the first source with a temperature or a CPU clock gives it, and a missing figure's reason names
the sources that could have given it in this order. Energy goes by each reader's own rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...transports.base import Transport
from ..sampler_csv import SamplerTrace
from . import (
    android,
    cpufreq,
    gpu_sysfs,
    harness,
    hwmon,
    mac,
    nvidia_smi,
    power_supply,
    powermetrics,
    rapl,
    thermal_zones,
)
from .base import DeviceAccess, Energy, ProbeView, Snapshot, Source, UnknownSource

SOURCES: tuple[Source, ...] = (
    power_supply.SOURCE,
    thermal_zones.SOURCE,
    cpufreq.SOURCE,
    rapl.SOURCE,
    gpu_sysfs.SOURCE,
    hwmon.SOURCE,
    android.SOURCE,
    mac.SOURCE,
    powermetrics.SOURCE,
    harness.SOURCE,
    nvidia_smi.SOURCE,
)
BY_NAME = {s.name: s for s in SOURCES}

__all__ = [
    "SOURCES",
    "DeviceAccess",
    "DeviceSources",
    "Energy",
    "ProbeView",
    "Snapshot",
    "Source",
    "UnknownSource",
    "get",
    "tools",
    "pulled",
    "snapshots",
    "detect",
    "open_on",
    "said",
    "read_pulled",
    "power_source",
    "keeps_calibration",
    "thermal_rose",
    "temperature_now",
]


def get(name: str) -> Source:
    try:
        return BY_NAME[name]
    except KeyError:
        raise UnknownSource(f"unknown telemetry source {name!r}; available: {', '.join(BY_NAME)}") from None


def tools() -> tuple[str, ...]:
    """Every device command a source runs (found once per session)."""
    return tuple(dict.fromkeys(x for s in SOURCES for x in s.tools))


def pulled() -> tuple[str, ...]:
    """The files sources have run_payload.sh write beside a payload: pulled with its outputs."""
    return tuple(f for s in SOURCES for f in s.pulled)


def snapshots() -> list[Snapshot]:
    return [snap for s in SOURCES for snap in s.snapshots]


def said(figure: str) -> str:
    """The sources that could give a figure, as its missing reason names them: 'a, b or c'."""
    names = [s.said[figure] for s in SOURCES if figure in s.said]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def detect(t: Transport) -> set[str]:
    """The device commands sources run that this device has: one round trip."""
    return t.commands_present(tools())


# ---------------------------------------------------------------- one device, through a run
class DeviceSources:
    """The sources one device has, found at first contact, and what they ask of each cell there."""

    def __init__(self, access: DeviceAccess, settings: dict[str, str]):
        self.access, self.settings = access, settings

    @property
    def tools(self) -> set[str]:
        return self.access.tools

    def env(self) -> dict[str, str]:
        """What the sources ask of run_payload.sh."""
        out: dict[str, str] = {}
        for s in SOURCES:
            out.update(s.env(self.settings.get(s.name, "")))
        return out

    def around(self) -> list:
        """Context managers around the measurement (after the cooldown)."""
        return [cm for s in SOURCES for cm in s.around(self.access)]

    def check(self, start: dict) -> None:
        """The sources' look at the start snapshots (a screen left on)."""
        for s in SOURCES:
            s.check(start, self.access)


def open_on(access: DeviceAccess) -> DeviceSources:
    """First contact: find the sources' commands on the device, then let each set itself up (a charging state
    left behind by a lost run is restored; whether powermetrics may run)."""
    access.tools = detect(access.t)
    return DeviceSources(access, {s.name: s.setup(access) for s in SOURCES})


def temperature_now(t: Transport, kit: str, root: str) -> float | None:
    """The device's hottest temperature now (°C), from the first source that reads one."""
    for s in SOURCES:
        v = s.temperature_now(t, kit, root)
        if v is not None:
            return v
    return None


# ---------------------------------------------------------------- pure: a cell's stored artifacts
def read_pulled(folder: Path) -> dict[str, Any]:
    """The samples of each source that pulled files into a cell's folder, by source."""
    out = {}
    for s in SOURCES:
        v = s.read(folder)
        if v is not None:
            out[s.name] = v
    return out


def power_source(tr: SamplerTrace, prior: dict | None = None) -> Energy | None:
    """The best energy source in the sampler's trace (the lowest-ranked reader that finds one). `prior`: the
    device's battery calibration from an earlier cell, for cells whose own counters did not move."""
    if len(tr.frame) < 2:
        return None
    for _rank, read in sorted((r for s in SOURCES for r in s.energy()), key=lambda r: r[0]):
        e = read(tr, prior)
        if e is not None:
            return e
    return None


def keeps_calibration(calibration: dict) -> bool:
    """Is a cell's energy calibration worth keeping as the device's (its battery counter moved)?"""
    return any(s.keeps(calibration) for s in SOURCES)


def thermal_rose(start: dict, end: dict) -> bool:
    """Did the snapshots see the device's thermal state rise during the cell?"""
    return any(s.rose(start, end) for s in SOURCES)
