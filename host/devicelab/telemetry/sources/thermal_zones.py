"""Linux thermal zones (/sys/class/thermal/thermal_zone*/temp): the sampler reads them about once a second; the
kit's thermal.sh reads every zone now, for the idle baseline and the cooldown before each cell.

Both ways the hottest zone is taken the same way: each zone is converted on its own (m°C by ABI; some drivers give
°C or d°C, and one SoC can mix all three: a Snapdragon 821's tsens zones in d°C beside its PMIC's in m°C and its
board thermistors in °C), and only zones that are temperatures count. Qualcomm's battery-current-limit driver
registers thermal zones whose `temp` is a battery current (mA, `*-ibat-*`), a voltage (mV, `*-vbat-*`, `vbat`,
`*-vph-*`), a level (`*-bcl-*`) or the state of charge (%, `soc`, `socd`); a Tegra's `PMIC-Die` zone always
reads 100 °C (NVIDIA: a placeholder, not a measurement)."""

from __future__ import annotations

import re
from collections.abc import Iterable

import pandas as pd

from ...transports.base import Transport
from ...transports.commands import KitScript
from ..sampler_csv import SamplerTrace
from ..units import temp_to_c
from .base import ProbeView, Source, folder_meta

ZONE_COLS = r"sys/class/thermal/thermal_zone\d+/temp"
# zone types whose `temp` is not a temperature (see the module's docstring)
NOT_A_TEMPERATURE = re.compile(r"(?:^|.*[-_])(?:ibat|vbat|vph|bcl)(?:[-_].*|$)|soc|socd|pmic-die", re.IGNORECASE)


def _celsius(raw: pd.Series) -> pd.Series:
    """A zone's column of millidegrees (or degrees) in °C; unreadable values NaN."""
    return pd.to_numeric(raw, errors="coerce").map(temp_to_c)


def is_temperature(zone_type: str) -> bool:
    """Whether a zone of this type reports a temperature (an unknown or empty type does)."""
    return not NOT_A_TEMPERATURE.fullmatch(zone_type.strip())


def hottest_zone_c(zones: Iterable[tuple[str, float]]) -> float | None:
    """The hottest temperature (°C) of (type, raw reading) pairs: each converted on its own, temperatures only."""
    temps = [temp_to_c(raw) for t, raw in zones if is_temperature(t)]
    return max(temps) if temps else None


def parse_now(text: str) -> float | None:
    """thermal.sh's output (`ZONE RAW TYPE` a line) → the hottest zone now in °C; None without a zone."""
    zones = []
    for line in text.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) < 2:
            continue
        try:
            zones.append((parts[2] if len(parts) > 2 else "", float(parts[1])))
        except ValueError:
            continue
    return hottest_zone_c(zones)


class ThermalZones(Source):
    name = "thermal-zones"
    title = "thermal zones"
    needs = "readable /sys/class/thermal/thermal_zone*/temp"
    said = {"temperature": "thermal zone"}

    def temperature(self, tr: SamplerTrace) -> pd.Series | None:
        zones = [c for c in tr.columns(ZONE_COLS) if is_temperature(folder_meta(tr, c).get("type", ""))]
        if not zones:
            return None
        return tr.frame[zones].apply(_celsius).max(axis=1)

    def temperature_now(self, t: Transport, kit: str, root: str) -> float | None:
        r = t.execute(KitScript(kit, "thermal.sh", (root,)), timeout=30)
        return parse_now(r.stdout) if r.ok else None

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        z = v.trace.columns(ZONE_COLS)
        return bool(z), f"{len(z)} zones" if z else f"no {self.needs}"


SOURCE = ThermalZones()
