"""Recommendation per device: the quant that fits RAM (weights + KV cache at the recipe's context +
measured runtime overhead), meets the quality bar, the speed target and the energy budget — with the
reason every other candidate lost. Works from the ledger or from an exported table alone."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import pandas as pd

from .models.gguf_info import kv_scale
from .recipes import RecommendSpec
from .schema import TOKEN_PHASES

DEFAULT_OVERHEAD = 64 * 1024**2   # used only when no peak RSS was measured for the model (and said so)


@dataclass
class Candidate:
    device: str
    model: str
    quant: str
    model_bytes: int
    bpw: float
    kv_bytes: int | None
    overhead_bytes: int | None
    overhead_measured: bool
    ram_need: int | None
    ram_budget: int | None
    decode_tps: float | None
    decode_threads: int | None
    prefill_tps: float | None
    kld_mean: float | None
    ppl_ratio: float | None
    energy_per_token: float | None
    accuracy: float | None = None
    devhost_kld: float | None = None
    failures: list[str] = field(default_factory=list)
    verdict: str = ""
    on_frontier: bool = False

    @property
    def passes(self) -> bool:
        return not self.failures


@dataclass
class DeviceRecommendation:
    device: str
    pick: Candidate | None
    candidates: list[Candidate]
    spec: dict
    quality_axis: str = "kld_mean"
    knees: dict = field(default_factory=dict)       # model -> {"bpw": …, "from": quant, "to": quant, "jump": ×}

    @property
    def frontier(self) -> list[Candidate]:
        return [c for c in self.candidates if c.on_frontier]

    def to_json(self) -> dict:
        return {"device": self.device, "pick": asdict(self.pick) if self.pick else None,
                "candidates": [asdict(c) for c in self.candidates], "constraints": self.spec,
                "quality_axis": self.quality_axis,
                "frontier": [f"{c.model} {c.quant}" for c in self.frontier], "bpw_knee": self.knees}


def _num(x):
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _metric(df: pd.DataFrame, metric: str, how: str = "max", phase: str | None = None):
    d = df[df["metric"] == metric]
    if phase:
        d = d[d["phase"] == phase]
    d = d[d["value"].notna()]
    if d.empty:
        return None, None
    i = d["value"].idxmax() if how == "max" else d["value"].idxmin()
    return float(d.loc[i, "value"]), d.loc[i]


def _mean_accuracy(g: pd.DataFrame) -> float | None:
    """Task accuracy of a candidate: the mean over its tasks (one `test` each, whatever the route)."""
    d = g[(g["metric"] == "accuracy") & g["value"].notna()]
    if d.empty:
        return None
    return float(d.groupby("test")["value"].mean().mean())


def candidates(rows: pd.DataFrame, spec: RecommendSpec) -> list[Candidate]:
    out = []
    rows = rows[rows["model_bytes"].notna()]          # device-level rows (membw) are not candidates
    if rows.empty:
        return out
    for (device, model, quant), g in rows.groupby(["device", "model", "quant"], sort=False):
        first = g.iloc[0]
        mbytes = int(first["model_bytes"])
        kvpt = _num(first["kv_bytes_per_token"])
        # kv_bytes_per_token is for F16 (2 bytes per element); quantized KV scales by ggml's block sizes
        kv = int(kvpt * spec.context * kv_scale(spec.kv_cache_type)) if kvpt else None
        # runtime overhead from the cells that ran prompts/generations (their token counts give the context):
        # peak RSS − weights − KV at that context
        overheads = []
        timed = g[g["phase"].isin(TOKEN_PHASES)]["cell_id"].unique()
        for _, cg in g[g["cell_id"].isin(timed)].groupby("cell_id"):
            rss = cg[(cg["metric"] == "peak_rss") & cg["value"].notna()]["value"]
            if rss.empty:
                continue
            nctx = (cg["n_prompt"].fillna(0) + cg["n_gen"].fillna(0) + cg["n_depth"].fillna(0)).max()
            overheads.append(max(0.0, float(rss.max()) - mbytes - (kvpt or 0) * float(nctx)))
        overhead = int(max(overheads)) if overheads else None
        budget_raw = _num(first["device_mem_bytes"])
        budget = int(budget_raw * spec.ram_fraction) if budget_raw else None
        dec, drow = _metric(g, "decode_tps")
        pre, _ = _metric(g, "prefill_tps")
        kld, _ = _metric(g, "kld_mean")
        ppl, _ = _metric(g, "ppl_ratio")
        ept, _ = _metric(g[g["phase"] == "decode"], "energy_per_token", how="min")
        acc = _mean_accuracy(g)
        dh, _ = _metric(g, "devhost_kld_mean")
        c = Candidate(
            device,
            model,
            quant,
            mbytes,
            float(first["bpw"]),
            kv,
            overhead,
            overhead is not None,
            None,
            budget,
            dec,
            int(drow["threads"]) if drow is not None and pd.notna(drow["threads"]) else None,
            pre,
            kld,
            ppl,
            ept,
            acc,
            dh,
        )
        ov = overhead if overhead is not None else DEFAULT_OVERHEAD
        c.ram_need = mbytes + (kv or 0) + ov
        mb = lambda b: f"{b / 1024**2:.0f} MiB"  # noqa: E731
        if budget is None:
            c.failures.append("device RAM unknown: set ram_budget_bytes in the lab file")
        elif c.ram_need > budget:
            c.failures.append(
                f"needs {mb(c.ram_need)} (weights {mb(mbytes)} + {spec.kv_cache_type} KV@{spec.context} "
                f"{mb(kv or 0)} + "
                f"runtime {mb(ov)}) > budget {mb(budget)}"
            )
        if kld is None:
            c.failures.append("no KLD measured")
        elif kld > spec.max_kld_mean:
            c.failures.append(f"mean KLD {kld:.4f} > {spec.max_kld_mean}")
        if ppl is not None and ppl > spec.max_ppl_ratio:
            c.failures.append(f"PPL ratio {ppl:.4f} > {spec.max_ppl_ratio}")
        if dec is None:
            c.failures.append("no decode speed measured")
        elif dec < spec.min_decode_tps:
            c.failures.append(f"decode {dec:.1f} tok/s < {spec.min_decode_tps}")
        if dh is not None and dh > spec.max_devhost_kld:
            c.failures.append(
                f"the device's logits differ from the host's for this very file (KLD {dh:.4f} > "
                f"{spec.max_devhost_kld}): a backend bug or a silent fallback on the device"
            )
        if spec.min_accuracy is not None:
            if acc is None:
                c.failures.append("no task accuracy measured")
            elif acc < spec.min_accuracy:
                c.failures.append(f"accuracy {acc:.1%} < {spec.min_accuracy:.1%}")
        if spec.max_energy_per_token is not None:
            if ept is None:
                c.failures.append("energy per token not measurable on this device (no power source)")
            elif ept > spec.max_energy_per_token:
                c.failures.append(f"decode energy {ept:.4g} J/tok > {spec.max_energy_per_token}")
        if overhead is None:
            c.verdict = f"runtime overhead not measured: assumed {mb(DEFAULT_OVERHEAD)}"
        out.append(c)
    return out


def _rank_key(prefer: str, axis: str = "kld_mean"):
    if prefer == "fastest":
        return lambda c: (-(c.decode_tps or 0), c.model_bytes)
    if prefer == "best_quality" and axis == "accuracy":
        return lambda c: (-(c.accuracy or 0), c.kld_mean if c.kld_mean is not None else math.inf, c.model_bytes)
    if prefer == "best_quality":
        return lambda c: (c.kld_mean if c.kld_mean is not None else math.inf, c.model_bytes)
    return lambda c: (c.model_bytes, c.kld_mean if c.kld_mean is not None else math.inf)


def _objectives(c: Candidate, axis: str) -> tuple:
    """Smaller is better on every objective (missing energy is neutral)."""
    q = -(c.accuracy or 0.0) if axis == "accuracy" else (c.kld_mean if c.kld_mean is not None else math.inf)
    e = c.energy_per_token if c.energy_per_token is not None else 0.0
    return (q, c.model_bytes, -(c.decode_tps or 0.0), e)


def dominates(a: Candidate, b: Candidate, axis: str) -> bool:
    oa, ob = _objectives(a, axis), _objectives(b, axis)
    return all(x <= y for x, y in zip(oa, ob)) and any(x < y for x, y in zip(oa, ob))


def knee(cs: list[Candidate]) -> dict | None:
    """The bits-per-weight step where mean KLD jumps the most (going down the ladder)."""
    k = sorted((c for c in cs if c.kld_mean and c.kld_mean > 0), key=lambda c: -c.bpw)
    if len(k) < 3:
        return None
    jumps = [(b.kld_mean / a.kld_mean, a, b) for a, b in zip(k, k[1:])]
    j, a, b = max(jumps, key=lambda x: x[0])
    return {"bpw": round(b.bpw, 3), "from": a.quant, "to": b.quant, "jump": round(j, 2)}


def recommend(rows: pd.DataFrame, spec: RecommendSpec) -> list[DeviceRecommendation]:
    recs = []
    cands = candidates(rows, spec)
    for device in dict.fromkeys(c.device for c in cands):
        cs = [c for c in cands if c.device == device]
        # across models KLD is not comparable (each is relative to its own base): use task accuracy when
        # every candidate has it, else KLD (and say which)
        models = {c.model for c in cs}
        axis = "accuracy" if all(c.accuracy is not None for c in cs) and len(models) > 1 else "kld_mean"
        for c in cs:
            pool = cs if axis == "accuracy" else [x for x in cs if x.model == c.model]
            c.on_frontier = not any(dominates(o, c, axis) for o in pool if o is not c)
        # the pick comes from the passing candidates that no other passing candidate dominates
        ok = [c for c in cs if c.passes]
        ok = [
            c
            for c in ok
            if not any(dominates(o, c, axis) for o in ok if o is not c and (axis == "accuracy" or o.model == c.model))
        ]
        ok = sorted(ok, key=_rank_key(spec.prefer, axis))
        pick = ok[0] if ok else None
        for c in cs:
            if c is pick:
                c.verdict = f"picked: {spec.prefer} of {len(ok)} passing" + (f"; {c.verdict}" if c.verdict else "")
            elif c.passes and not any(c is o for o in ok):
                dom = next(
                    o for o in cs if o.passes and dominates(o, c, axis) and (axis == "accuracy" or o.model == c.model)
                )
                c.verdict = f"passes, but {dom.model} {dom.quant} is better on every axis"
            elif c.passes:
                why = {
                    "smallest": f"passes, but larger ({c.model_bytes / 1024**2:.0f} MiB vs "
                    f"{pick.model_bytes / 1024**2:.0f} MiB)",
                    "fastest": f"passes, but slower ({c.decode_tps:.1f} vs {pick.decode_tps:.1f} tok/s)",
                    "best_quality": (
                        (
                            f"passes, but less accurate ({c.accuracy:.1%} vs {pick.accuracy:.1%})"
                            if c.accuracy != pick.accuracy
                            else f"passes, same accuracy but higher KLD ({c.kld_mean:.4f} vs {pick.kld_mean:.4f})"
                        )
                        if axis == "accuracy"
                        else f"passes, but higher KLD ({c.kld_mean:.4f} vs {pick.kld_mean:.4f})"
                    ),
                }[spec.prefer]
                c.verdict = why
            else:
                c.verdict = "; ".join(c.failures)
        knees = {m: knee([c for c in cs if c.model == m]) for m in models}
        recs.append(
            DeviceRecommendation(
                device,
                pick,
                sorted(cs, key=lambda c: (c.model, -c.bpw)),
                spec.model_dump(),
                axis,
                {m: k for m, k in knees.items() if k},
            )
        )
    return recs
