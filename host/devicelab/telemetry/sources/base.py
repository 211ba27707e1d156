"""What a telemetry source is. One unit says: how it is found on a device and what it needs there; what it adds
to a cell's run (files run_payload.sh writes beside the payload and the environment that asks for them,
snapshots before and after, a condition around the measurement); how its raw output becomes figures (pure, from
the cell's stored artifacts); and its line in `devicelab devices probe`. Every hook is optional: a source
overrides what it has. The registry (`sources/__init__.py`) is what the rest of devicelab asks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, NamedTuple

import numpy as np
import pandas as pd

from ...errors import DevicelabError
from ...schema import Row
from ...transports.base import Transport
from ..sampler_csv import SamplerTrace


class UnknownSource(DevicelabError):
    pass


# the values a snapshot's parse may give that become rows (phase snapshot_start / snapshot_end)
SNAPSHOT_METRICS = frozenset(
    {
        "battery_level",
        "battery_voltage",
        "battery_current",
        "battery_power",
        "battery_temp",
        "thermal_status",
        "cpu_speed_limit",
        "screen_on",
    }
)


def snapshot_values(d: dict) -> list[tuple[str, float]]:
    """(metric, value) of a snapshot's parsed values that are rows: the numeric SNAPSHOT_METRICS."""
    return [
        (k, float(v))
        for k, v in d.items()
        if k in SNAPSHOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)
    ]


def kv_lines(text: str, sep: str = ":") -> dict[str, str]:
    """'key: value' lines (or another separator) of a command's text."""
    out = {}
    for line in text.splitlines():
        k, s, v = line.strip().partition(sep)
        if s and k:
            out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class Snapshot:
    """A command run through the transport before and after a cell; its raw text is kept as NAME.WHEN.txt."""

    name: str  # the artifact's name and its rows' test
    argv: tuple[str, ...]
    parse: Callable[[str], dict]  # pure: text → values (SI units)
    needs: str  # the device command it runs
    rows: Callable[[dict], list[tuple[str, float]]] = snapshot_values


class Energy(NamedTuple):
    """A cell's energy from a sampler source, placeable on the device's clock: kind 'energy' (values: J since the
    first tick) or 'power' (values: W per tick) at times t (s); info: which source and how it was read (the
    cell's energy calibration)."""

    kind: str
    t: np.ndarray
    values: np.ndarray
    info: dict


EnergyReader = Callable[[SamplerTrace, "dict | None"], "Energy | None"]


@dataclass
class DeviceAccess:
    """What a source may use of one device at first contact and around a cell: its transport, the commands
    found on it, the ledger's facts about it, and the run's stage lines."""

    name: str
    t: Transport
    tools: set[str] = field(default_factory=set)
    fact: Callable[[str], Any] = lambda key: None
    set_fact: Callable[[str, Any], None] = lambda key, value: None
    note: Callable[[str], None] = lambda text: None
    warn: Callable[..., None] = lambda text, key=None: None


@dataclass
class ProbeView:
    """What a probe line looks at: the transport, one sampler tick of the device, the commands found on it."""

    t: Transport
    trace: SamplerTrace
    tools: set[str]


def folder_meta(tr: SamplerTrace, column: str) -> dict:
    """The sampler's description of the folder a column's file is in (its kind, type, cpus, range, …)."""
    return tr.meta.get(column.rsplit("/", 1)[0], {})


class Source:
    name: ClassVar[str]
    title: ClassVar[str]  # its `devices probe` line
    needs: ClassVar[str] = ""  # what it needs on the device, said plainly
    tools: ClassVar[tuple[str, ...]] = ()  # device commands it runs: found once per session (`command -v`)
    pulled: ClassVar[tuple[str, ...]] = ()  # files run_payload.sh writes beside the payload: pulled after it
    snapshots: ClassVar[tuple[Snapshot, ...]] = ()
    # how a figure's missing reason names this source, by figure ('temperature', 'cpu_clock', 'gpu', 'energy')
    said: ClassVar[dict[str, str]] = {}

    # ------------------------------------------------------------ on the device
    def setup(self, d: DeviceAccess) -> str:
        """At first contact: what it found out, kept for the session and handed to `env` ('' for nothing)."""
        return ""

    def env(self, setting: str) -> dict[str, str]:
        """What it asks of run_payload.sh (given what `setup` found)."""
        return {}

    def around(self, d: DeviceAccess) -> list:
        """Context managers around the measurement, entered after the cooldown, left however the cell ends."""
        return []

    def check(self, start: dict, d: DeviceAccess) -> None:
        """A look at the parsed start snapshots (by snapshot name): warn about what spoils a measurement."""

    def temperature_now(self, t: Transport, kit: str, root: str) -> float | None:
        """The device's hottest temperature now, °C (the cooldown's reading)."""
        return None

    # ------------------------------------------------------------ pure: a cell's stored artifacts → figures
    def read(self, folder: Path) -> Any:
        """Its samples from the files it pulled into a cell's folder; None when it pulled none."""
        return None

    def temperature(self, tr: SamplerTrace) -> pd.Series | None:
        """Per tick, the hottest temperature in °C (NaN between slow reads); None without its columns."""
        return None

    def cpu_clock(self, tr: SamplerTrace, samples: Any) -> pd.Series | None:
        """The mean CPU clock in Hz, per tick or per sample."""
        return None

    def gpu(self, tr: SamplerTrace, samples: Any) -> dict[str, tuple[float, str]]:
        """GPU figures it gives: {metric: (value, which source)}; a later source's figure replaces an earlier's."""
        return {}

    def pressure(self, samples: Any) -> tuple[list[Row], bool]:
        """Rows on the device's thermal state over the cell, and whether it rose (throttled)."""
        return [], False

    def energy(self) -> list[tuple[int, EnergyReader]]:
        """Its energy readers with their rank: the lowest-ranked reader that finds something is the cell's."""
        return []

    def cell_energy(self, samples: Any, phases: list) -> tuple[list[Row], dict] | None:
        """Where no sampler source gives energy: the whole cell's energy rows (phases only as missing rows) and
        its calibration."""
        return None

    def keeps(self, calibration: dict) -> bool:
        """Is this cell's energy calibration worth keeping as the device's, for cells too short to calibrate?"""
        return False

    def rose(self, start: dict, end: dict) -> bool:
        """Did the snapshots (parsed, by name) see the device's thermal state rise during the cell?"""
        return False

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        raise NotImplementedError


def present(tool: str, v: ProbeView) -> tuple[bool, str]:
    """The probe line of a source that is a device command."""
    ok = tool in v.tools
    return ok, "present" if ok else "not on this device"
