"""Intel/AMD RAPL package energy (/sys/class/powercap/intel-rapl:N/energy_uj, µJ, wrapping at
max_energy_range_uj), read by the sampler every tick: the best energy source where it is readable."""

from __future__ import annotations

import numpy as np

from ..sampler_csv import SamplerTrace
from ..units import counter_j
from .base import Energy, ProbeView, Source, folder_meta

# package domains only: sub-domains (core, uncore, dram) are inside the package figure
DOMAIN_COLS = r"sys/class/powercap/(intel-rapl/)?intel-rapl:\d+/energy_uj"


def package_columns(tr: SamplerTrace) -> list[str]:
    """The top-level zones to sum: the package domains. A psys zone (the whole platform, package and DRAM and more;
    a top-level zone beside package-N on recent Intel laptops) would count the package twice: it is used only where
    there is no package domain."""
    cols = tr.columns(DOMAIN_COLS)
    named = [(c, folder_meta(tr, c).get("name", "")) for c in cols]
    packages = [c for c, n in named if n != "psys"]
    return packages or cols


def package_energy(tr: SamplerTrace, prior: dict | None = None) -> Energy | None:
    cols = package_columns(tr)
    if not cols:
        return None
    df = tr.frame
    total = np.zeros(len(df))
    for c in cols:
        m = folder_meta(tr, c)
        rng = float(m["max_energy_range_uj"]) if m.get("max_energy_range_uj") else None
        total += counter_j(df[c], rng).to_numpy()
    return Energy("energy", df["t_s"].to_numpy(dtype=float), total, {"source": "rapl", "domains": cols})


class Rapl(Source):
    name = "rapl"
    title = "RAPL energy"
    needs = "readable /sys/class/powercap/intel-rapl:*/energy_uj (absent, or root-only since kernel 5.10)"
    said = {"energy": "RAPL"}

    def energy(self):
        return [(10, package_energy)]

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        r = v.trace.columns(DOMAIN_COLS)
        return bool(r), ", ".join(r) if r else f"no {self.needs}"


SOURCE = Rapl()
