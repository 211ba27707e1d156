"""The devicelab harness's own columns in the sampler CSV (device_payloads/harness, `run`): on an iPhone or iPad
ProcessInfo.thermalState (nominal / fair / serious / critical, recorded as such), UIDevice's battery level (1 %
steps) and state, and the process's CPU time; on Linux the thermal and battery columns are empty (the sysfs
sources read those there) and only the CPU time is given.

Thermal state: the worst state seen over the cell is a `thermal_status` row (0 nominal … 3 critical) whose test
names the state. Energy: iOS gives an app no battery current, voltage or energy counter, only the level in 1 %
steps, so the cell's energy is NaN with that reason; what it does give, the battery-percent drop over the cell,
is the `battery_drop` row (a share of a full charge, its 1 % resolution in its test). Joules from it need the
battery's capacity, which iOS does not report to an app."""

from __future__ import annotations

import math
from pathlib import Path

from ...schema import Row, missing
from ..sampler_csv import SamplerTrace
from ..sampler_csv import parse as parse_csv
from .base import ProbeView, Source

PREFIX = "harness/"
THERMAL, LEVEL, STATE, CPU = (
    "harness/thermal_state",
    "harness/battery_level_pct",
    "harness/battery_state",
    "harness/cpu_time_s",
)
THERMAL_STATES = ("nominal", "fair", "serious", "critical")  # ProcessInfo.ThermalState, in order
NO_ENERGY = (
    "iOS gives an app no battery current or energy counter, only the level in 1 % steps "
    "(see battery_drop; joules would need the battery's capacity, which iOS does not report)"
)


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v).strip()


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def samples(tr: SamplerTrace) -> dict | None:
    """The harness's columns of a sampler trace, per tick; None when the trace has none (not a harness run)."""
    df = tr.frame
    if not any(c.startswith(PREFIX) for c in df.columns):
        return None

    def col(name: str) -> list:
        return list(df[name]) if name in df else [None] * len(df)

    return {
        "t": [float(x) for x in df["t_s"]],
        "thermal_state": [_text(x) for x in col(THERMAL)],
        "battery_level_pct": [_num(x) for x in col(LEVEL)],
        "battery_state": [_text(x) for x in col(STATE)],
        "cpu_time_s": [_num(x) for x in col(CPU)],
    }


def thermal_state_max(s: dict | None) -> str | None:
    """The worst thermal state seen over the cell (nominal … critical), None where the device gave none."""
    seen = [x for x in (s or {}).get("thermal_state", []) if x in THERMAL_STATES]
    return max(seen, key=THERMAL_STATES.index) if seen else None


def battery_drop(s: dict | None) -> tuple[float, float, float, float] | None:
    """(level at the first read, level at the last, their times) in % and s, where the level was read twice."""
    s = s or {}
    pts = [(t, x) for t, x in zip(s.get("t", []), s.get("battery_level_pct", []), strict=True) if x is not None]
    if len(pts) < 2:
        return None
    (t0, a), (t1, b) = pts[0], pts[-1]
    return a, b, t0, t1


class Harness(Source):
    name = "harness"
    title = "devicelab harness (iOS thermal state, battery level, CPU time)"
    needs = "a payload run by devicelab-harness (the iOS app; its Linux build leaves thermal and battery empty)"

    def read(self, folder: Path) -> dict | None:
        f = folder / "telemetry.csv"
        return samples(parse_csv(f.read_text(errors="replace"))) if f.is_file() else None

    def pressure(self, s: dict | None) -> tuple[list[Row], bool]:
        worst = thermal_state_max(s)
        if worst is None or s is None:  # (no thermal state without its samples)
            return [], False
        seen = [THERMAL_STATES.index(x) for x in s["thermal_state"] if x in THERMAL_STATES]
        row = Row(
            metric="thermal_status",
            value=float(THERMAL_STATES.index(worst)),
            phase="cell",
            test=f"harness thermal_state {worst}",
            n=len(seen),
        )
        return [row], max(seen) > seen[0]

    def cell_energy(self, s: dict | None, phases: list) -> tuple[list[Row], dict] | None:
        drop = battery_drop(s)
        if drop is None or s is None:  # (no drop without its samples)
            return None
        a, b, t0, t1 = drop
        states = sorted({x for x in s["battery_state"] if x})
        reason = NO_ENERGY
        if set(states) & {"charging", "full"}:
            reason = f"the device was {' / '.join(states)}: no battery drop to read; " + NO_ENERGY
        rows = [
            Row(
                metric="battery_drop",
                value=(a - b) / 100,
                phase="cell",
                test=f"harness battery_level {a:g}% -> {b:g}% over {t1 - t0:.0f} s (1 % steps)",
                samples=[a / 100, b / 100],
            ),
            missing("energy", reason, phase="cell"),
        ]
        for ph in phases:
            rows.append(missing("energy", reason, phase=ph.kind, test=ph.name))
            if ph.tokens:
                rows.append(missing("energy_per_token", reason, phase=ph.kind, test=ph.name))
        calibration = {
            "source": "harness:battery_level_pct",
            "battery_level_start_pct": a,
            "battery_level_end_pct": b,
            "window_s": round(t1 - t0, 3),
            "resolution_pct": 1,
            "battery_state": ",".join(states),
        }
        return rows, calibration

    def probe(self, v: ProbeView) -> tuple[bool, str]:
        s = samples(v.trace)
        if s is None:
            return False, "not a device the harness runs on (an iPhone or iPad through its Mac)"
        worst, level = thermal_state_max(s), next((x for x in s["battery_level_pct"] if x is not None), None)
        if worst is None and level is None:
            return True, "present: CPU time only (no thermal state or battery on this platform)"
        return True, f"thermal state {worst or 'unknown'}, battery {f'{level:g} %' if level is not None else 'unknown'}"


SOURCE = Harness()
