"""Linux thermal zones (/sys/class/thermal/thermal_zone*/temp): the sampler reads them about once a second; the
kit's thermal.sh reads the hottest now, for the idle baseline and the cooldown before each cell."""

from __future__ import annotations

import pandas as pd

from ...transports.base import Transport
from ..sampler_csv import SamplerTrace
from ..units import temp_to_c
from .base import ProbeView, Source

ZONE_COLS = r"sys/class/thermal/thermal_zone\d+/temp"


class ThermalZones(Source):
    name = "thermal-zones"
    title = "thermal zones"
    needs = "readable /sys/class/thermal/thermal_zone*/temp"
    said = {"temperature": "thermal zone"}

    def temperature(self, tr: SamplerTrace) -> pd.Series | None:
        zones = tr.columns(ZONE_COLS)
        if not zones:
            return None
        return tr.frame[zones].apply(lambda s: pd.to_numeric(s, errors="coerce").map(temp_to_c)).max(axis=1)

    def temperature_now(self, t: Transport, kit: str, root: str) -> float | None:
        r = t.run(["sh", f"{kit}/thermal.sh", root], timeout=30)
        try:
            return temp_to_c(float(r.stdout.strip()))
        except ValueError:
            return None

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        z = v.trace.columns(ZONE_COLS)
        return bool(z), f"{len(z)} zones" if z else f"no {self.needs}"


SOURCE = ThermalZones()
