"""A recipe's precision target (`rounds: auto`): is every ratio a user would compare on one device known well enough?

The compared pairs are what `compare` would be asked on one device: two values of a swept axis (two quants, two
llama.cpp commits, two backends, two thread counts or CPU quotas…), everything else equal. Each pair is compared
with `compare`'s own paired test over the rounds both sides share; its precision is the half-width of the 95 %
interval of B/A. The lab adds rounds until every pair's half-width is at most the target."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pandas as pd

from . import compare as cmpmod
from . import kinds
from .schema import METRIC_DEFS

# a row's llama.cpp commit: what `sources:` sweeps (not a kind's key property: compare takes it as a side)
COMMIT = "build_commit"
NOT_COMPARED = ("device", "model")  # a precision target is about one device's choices for one model
SHOWN = ("model", "test", "backend", "threads")  # what names a pair's other properties in a line


@dataclass
class Interval:
    device: str
    axis: str
    a: str
    b: str
    metric: str
    key: str  # what else the pair is (its shape: "tg32", its threads…)
    ratio: float
    half_width: float | None  # None: too few rounds to say

    def label(self) -> str:
        hw = "?" if self.half_width is None else f"±{self.half_width:.3f}"
        return f"{self.device}: {self.metric} {self.axis} {self.b}/{self.a} {self.ratio:.3f} {hw} ({self.key})"


def axes(rows: pd.DataFrame) -> list[str]:
    """The columns the rows sweep on one device: a key property of their kind that is not a shape of the
    measurement (each kind says which are: `shape_properties`), and the llama.cpp commit."""
    cols: list[str] = []
    for payload in sorted(rows["payload"].dropna().unique()):
        k = kinds.get(str(payload)) if payload in kinds.REGISTRY else kinds.base.Kind
        cols += [c for c in k.key_properties if c not in k.shape_properties and c not in NOT_COMPARED]
    cols.append(COMMIT)
    return [c for c in dict.fromkeys(cols) if c in rows.columns]


def target_metrics() -> list[str]:
    """The metrics a precision target holds: each with a direction, less durations (a test's seconds restate its
    rate; a cell's wall time is not a figure anyone compares)."""
    return [m for m, (unit, better) in METRIC_DEFS.items() if better is not None and unit != "s"]


def intervals(rows: pd.DataFrame, metrics: list[str] | None = None) -> list[Interval]:
    """Every compared pair of the rows (one recipe's, in rounds) with its paired interval, device by device."""
    out: list[Interval] = []
    metrics = metrics or target_metrics()
    rows = rows[pd.to_numeric(rows["value"], errors="coerce").notna()]
    for device, mine in rows.groupby("device", sort=True):
        for _model, rm in mine.groupby("model", sort=True):
            for axis in axes(rm):
                # the commit is no key property of a kind: two quants are compared within one commit
                within = [COMMIT] if axis != COMMIT and COMMIT in rm.columns else []
                for held, g in rm.groupby(within, sort=True) if within else [((), rm)]:
                    at = f" at {str(held[0])[:12]}" if within and rm[COMMIT].nunique() > 1 else ""
                    out += _pairs(str(device), axis, g, metrics, at)
    return out


def _pairs(device: str, axis: str, rows: pd.DataFrame, metrics: list[str], at: str) -> list[Interval]:
    out = []
    values = sorted(rows[axis].dropna().astype(str).unique())
    for va, vb in itertools.combinations(values, 2):
        ra, rb = rows[rows[axis].astype(str) == va], rows[rows[axis].astype(str) == vb]
        side_a, side_b = cmpmod.Side(f"{axis}={va}", {axis: va}), cmpmod.Side(f"{axis}={vb}", {axis: vb})
        for p in cmpmod.compare(ra, rb, side_a, side_b, metrics, max_busy=None).pairs:
            if p.ratio is None:
                continue
            hw = (p.ci[1] - p.ci[0]) / 2 if p.test == cmpmod.PAIRED and p.ci is not None else None
            key = " ".join(str(v) for k, v in p.key.items() if k in SHOWN and str(v) not in ("", "nan", "<NA>"))
            out.append(Interval(device, axis, va[:12], vb[:12], p.metric, key + at, p.ratio, hw))
    return out


def unmet(found: list[Interval], target: float) -> list[Interval]:
    """The pairs whose interval is wider than the target (or not known yet)."""
    return [i for i in found if i.half_width is None or i.half_width > target]
