"""Analyses over normalized rows: roofline per bench row, and the findings of an on-device study (STUDY) checked on
the user's data.

Roofline: decode reads every weight once per token plus the KV cache so far, so its limit is
bandwidth ÷ (weight bytes + KV bytes per token × context); prefill reads the weights once per micro-batch;
prefill does ≈ 2 × n_params FLOPs per token,
so its limit is the measured FMA peak ÷ that. The bound named for a row is the resource it uses the
larger fraction of."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .schema import TOKEN_PHASES


def _device_peaks(rows: pd.DataFrame) -> pd.DataFrame:
    r = rows[rows.metric.isin(["mem_bandwidth", "peak_flops"]) & rows.value.notna()]
    if r.empty:
        return pd.DataFrame(columns=["device", "mem_bandwidth", "peak_flops"])
    return r.pivot_table(index="device", columns="metric", values="value", aggfunc="max").reset_index()


def roofline(rows: pd.DataFrame) -> pd.DataFrame:
    bench = rows[rows.metric.isin(["prefill_tps", "decode_tps"]) & rows.value.notna()].copy()
    if bench.empty:
        return pd.DataFrame()
    bench = bench.merge(_device_peaks(rows), on="device", how="left")
    for c in ("mem_bandwidth", "peak_flops"):
        if c not in bench:
            bench[c] = np.nan
    ctx_tok = (
        bench.n_prompt.fillna(0).astype(float)
        + bench.n_depth.fillna(0).astype(float)
        + bench.n_gen.fillna(0).astype(float) / 2
    )
    # decode reads every weight once per token; prefill once per micro-batch (llama.cpp's default 512)
    per_pass = np.where(
        bench.metric == "prefill_tps", np.minimum(bench.n_prompt.fillna(1).astype(float).clip(lower=1), 512), 1.0
    )
    bytes_per_tok = (
        bench.model_bytes.astype(float) / per_pass + bench.kv_bytes_per_token.astype(float).fillna(0) * ctx_tok
    )
    flops_per_tok = 2.0 * bench.n_params.astype(float)
    tps = bench.value.astype(float)
    bench["bytes_per_token"] = bytes_per_tok
    bench["flops_per_token"] = flops_per_tok
    bench["mem_util"] = tps * bytes_per_tok / bench.mem_bandwidth
    bench["compute_util"] = tps * flops_per_tok / bench.peak_flops
    bench["limit_tps"] = np.where(
        bench.metric == "decode_tps", bench.mem_bandwidth / bytes_per_tok, bench.peak_flops / flops_per_tok
    )
    bench["efficiency"] = tps / bench.limit_tps
    bench["bound"] = np.where(
        bench.mem_util.isna() | bench.compute_util.isna(),
        "unknown",
        np.where(bench.mem_util >= bench.compute_util, "memory", "compute"),
    )
    keep = [
        "device",
        "model",
        "quant",
        "bpw",
        "metric",
        "test",
        "threads",
        "cpu_quota",
        "contention",
        "value",
        "limit_tps",
        "efficiency",
        "mem_util",
        "compute_util",
        "bound",
    ]
    return (
        bench[keep]
        .rename(columns={"value": "tps"})
        .sort_values(["device", "model", "metric", "bpw"])
        .reset_index(drop=True)
    )


def _spearman(x, y) -> float:
    if len(x) < 3:
        return float("nan")
    return float(pd.Series(x).rank().corr(pd.Series(y).rank()))


# the study whose findings `findings` checks: decode speed against bits per weight, the quality knee near 3.5 bits per
# weight, a larger model at a lower bit width against a smaller one at a higher, the laptop/server sweeps
STUDY = "A Systematic Evaluation of On-Device LLMs: Quantization, Performance, and Resources"

# Each of the study's claims, checked on one device's and model's figures per quant (found for every device and
# model at once, in `_PerQuant`): (claim, held: True/False/None = not enough data, evidence), or None where the
# rows cannot speak to it.

GROUP = ["device", "model"]


def _split(df: pd.DataFrame | pd.Series, levels: int = 2) -> dict:
    """A frame or series indexed by (device, model, …, quant), split per its first `levels` index levels."""
    if df.empty:
        return {}
    return {k: g.droplevel(list(range(levels))) for k, g in df.groupby(level=list(range(levels)), sort=False)}


class _PerQuant:
    """The figures each claim reads, per device and model and quant, from the rows measured without a CPU quota
    or a co-running load: one grouped pass over the rows per figure."""

    def __init__(self, plain: pd.DataFrame):
        per = [*GROUP, "quant"]
        dec = plain[(plain.metric == "decode_tps") & plain.value.notna()]
        self.top_threads = dec.groupby(GROUP)["threads"].max().to_dict()
        top = dec[dec.threads == dec.groupby(GROUP)["threads"].transform("max")]
        self.decode = _split(top.groupby(per).agg(bpw=("bpw", "first"), tps=("value", "max")))
        speed = plain[plain.metric.isin(["prefill_tps", "decode_tps"]) & plain.value.notna()]
        by = speed.groupby([*GROUP, "metric"])["threads"]
        self.threads = by.agg(["nunique", "min", "max"]).to_dict("index")
        at = {}
        for end in ("min", "max"):
            m = speed[speed.threads == by.transform(end)]
            at[end] = _split(m.groupby([*GROUP, "metric", "quant"])["value"].max(), 3)
        self.speed_lo, self.speed_hi = at["min"], at["max"]
        kld = plain[(plain.metric == "kld_mean") & plain.value.notna()]
        self.kld = _split(kld.groupby(per).agg(bpw=("bpw", "first"), kld=("value", "min")))
        cell = plain.cell_id.astype(object).where(plain.cell_id.notna(), None)
        tok = plain.phase.isin(TOKEN_PHASES)
        timed = set(zip(plain.device[tok], plain.model[tok], cell[tok], strict=True))
        rss = plain[(plain.metric == "peak_rss") & plain.value.notna()]
        rss = rss[np.array([k in timed for k in zip(rss.device, rss.model, cell[rss.index], strict=True)], bool)]
        self.rss = _split(rss.groupby(per).agg(b=("model_bytes", "first"), rss=("value", "max")))


def _decode_vs_bpw(f: _PerQuant, key: tuple):
    if key not in f.top_threads:
        return None
    t = int(f.top_threads[key])
    d = f.decode.get(key, pd.DataFrame({"bpw": [], "tps": []})).sort_values("bpw")
    rho = _spearman(d.bpw, d.tps)
    mono = bool((np.diff(d.tps.values) <= 0).all()) if len(d) > 1 else None
    return (
        "decode t/s falls as bits per weight rise",
        None if len(d) < 3 else bool(rho < -0.5),
        f"Spearman ρ(bpw, decode t/s) = {rho:.2f} over {len(d)} quants at {t} threads"
        + ("" if mono is None else f"; strictly monotone: {mono}"),
    )


def _core_scaling(f: _PerQuant, key: tuple):
    sp = {}
    for metric in ("prefill_tps", "decode_tps"):
        th = f.threads.get((*key, metric))
        if th is not None and th["nunique"] >= 2:
            lo, hi = int(th["min"]), int(th["max"])
            a, b = f.speed_lo[(*key, metric)], f.speed_hi[(*key, metric)]
            sp[metric] = (float((b / a).median()), lo, hi)
    if len(sp) != 2:
        return None
    (ps, lo, hi), (ds, _, _) = sp["prefill_tps"], sp["decode_tps"]
    return (
        "adding cores speeds prefill almost linearly, decode only marginally",
        bool(ps >= 0.7 * hi / lo and ds < ps),
        f"{lo}→{hi} threads: prefill ×{ps:.2f}, decode ×{ds:.2f} (median over quants)",
    )


def _quality_knee(f: _PerQuant, key: tuple):
    k = f.kld.get(key)
    if k is None:
        return None
    k = k[k.kld > 0].sort_values("bpw", ascending=False)
    if len(k) < 3:
        return None
    ratios = k.kld.values[1:] / k.kld.values[:-1]
    i = int(np.argmax(ratios))
    knee = float(k.bpw.values[i + 1])
    return (
        "quality collapses below ~3.5 bits per weight",
        bool(knee < 4.0),
        f"largest KLD jump ×{ratios[i]:.1f} going {k.index[i]} ({k.bpw.values[i]:.2f} bpw) → "
        f"{k.index[i + 1]} ({knee:.2f} bpw): the knee is at {knee:.2f} bpw",
    )


def _memory_vs_bpw(f: _PerQuant, key: tuple):
    rss = f.rss.get(key)
    if rss is None or len(rss) < 3:
        return None
    r = float(np.corrcoef(rss.b.astype(float), rss.rss.astype(float))[0, 1])
    slope = float(np.polyfit(rss.b.astype(float), rss.rss.astype(float), 1)[0])
    return (
        "memory grows linearly with bits per weight",
        bool(r > 0.95),
        f"peak RSS vs file size: r = {r:.3f}, slope {slope:.2f}",
    )


def _quota(g: pd.DataFrame, free: pd.DataFrame) -> list[tuple]:
    out = []
    for quota, gq in g[g.cpu_quota.notna()].groupby("cpu_quota"):
        f = free[free.threads.isin(gq.threads)].groupby("quant").value.max()
        s = (gq.groupby("quant").value.max() / f).dropna()
        if len(s):
            out.append(
                (
                    f"a CPU quota of {quota:g} cores slows decode",
                    bool(s.median() < 0.9),
                    f"decode under quota / free = {s.median():.2f}",
                )
            )
    return out


def _contention(g: pd.DataFrame, free: pd.DataFrame) -> list[tuple]:
    cc = g[g.contention.fillna(0) > 0]
    if cc.empty:
        return []
    f = free[free.threads.isin(cc.threads)].groupby("quant").value.max()
    s = (cc.groupby("quant").value.max() / f).dropna()
    if not len(s):
        return []
    return [
        ("a co-running load slows decode", bool(s.median() < 0.95), f"decode with load / without = {s.median():.2f}")
    ]


# on the rows measured without a CPU quota or a co-running load
PLAIN_CLAIMS = (_decode_vs_bpw, _core_scaling, _quality_knee, _memory_vs_bpw)


# what the claims read of a row
FINDINGS_READ: tuple[str, ...] = (
    *("device", "model", "quant", "bpw", "model_bytes", "cell_id", "metric", "phase", "value", "threads"),
    *("cpu_quota", "contention"),
)


def findings(rows: pd.DataFrame) -> list[dict]:
    """Each of the study's claims: claim, held (True/False/None = not enough data), evidence."""
    rows = rows[[c for c in FINDINGS_READ if c in rows.columns]]
    found = []
    plain = rows[(rows.contention.fillna(0) == 0) & rows.cpu_quota.isna()]
    per_quant = _PerQuant(plain)
    for dev, model in plain.groupby(GROUP).size().index:
        found += [(dev, model, f) for f in (claim(per_quant, (dev, model)) for claim in PLAIN_CLAIMS) if f is not None]
    q = rows[(rows.metric == "decode_tps") & rows.value.notna()]
    for (dev, model), g in q.groupby(["device", "model"]):
        free = g[g.cpu_quota.isna() & (g.contention.fillna(0) == 0)]
        if not free.empty:
            found += [(dev, model, f) for f in (*_quota(g, free), *_contention(g, free))]
    return [
        {"device": dev, "model": model, "claim": claim, "held": held, "evidence": evidence}
        for dev, model, (claim, held, evidence) in found
    ]
