"""`devicelab report`: one self-contained HTML file (plots embedded as PNG data URIs) — quality vs bits per
weight per model, prefill/decode t/s vs bits per weight per device, energy per token, the telemetry trace of
each cell, roofline, the seeds' findings, and the recommendation with its reasons."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .analysis import findings, roofline  # noqa: E402
from .recipes import RecommendSpec  # noqa: E402
from .tables import NO_PICK, NONE, RecommendationView, Table, recommendation_views, wide  # noqa: E402
from .telemetry import normalize, sampler_csv  # noqa: E402


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _img(src: str, alt: str) -> str:
    return f'<figure><img src="{src}" alt="{html.escape(alt)}"><figcaption>{html.escape(alt)}</figcaption></figure>'


def _quality_plot(w: pd.DataFrame, rows: pd.DataFrame) -> str | None:
    if w.empty or w.kld_mean.isna().all():
        return None
    acc = rows[(rows.metric == "accuracy") & rows.value.notna()]
    n = 2 if not acc.empty else 1
    fig, axes = plt.subplots(1, n + 1, figsize=(5 * (n + 1), 3.6))
    for model, g in w.groupby("model"):
        g = g.sort_values("bpw")
        axes[0].plot(g.bpw, g.kld_mean, "o-", label=model)
        for _, r in g.iterrows():
            axes[0].annotate(r.quant, (r.bpw, r.kld_mean), fontsize=7, xytext=(3, 3), textcoords="offset points")
        axes[1].plot(g.bpw, g.ppl_ratio, "o-", label=model)
    axes[0].set(
        xlabel="bits per weight (file)", ylabel="mean KLD vs F16 base (nats)", yscale="log", title="KL divergence"
    )
    axes[1].set(xlabel="bits per weight (file)", ylabel="PPL(quant) / PPL(base)", title="perplexity ratio")
    if not acc.empty:
        acc = acc.assign(eval_route=acc["eval_route"].fillna("device-mc") if "eval_route" in acc else "device-mc")
        a = (
            acc.groupby(["model", "test", "eval_route", "quant"])
            .agg(bpw=("bpw", "first"), acc=("value", "mean"))
            .reset_index()
        )
        for (model, test, route), g in a.groupby(["model", "test", "eval_route"]):
            g = g.sort_values("bpw")
            task = test.split(":")[1] if test.startswith("lm-eval:") else test.split(":")[0]
            axes[2].plot(g.bpw, g.acc * 100, "o-", label=f"{model} · {task} ({route})")
        axes[2].set(
            xlabel="bits per weight (file)", ylabel="accuracy (%)", title="task accuracy (own small task files)"
        )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _png(fig)


def _backend_label(d: pd.DataFrame) -> pd.Series:
    """Per row: its backend and layers offloaded ("vulkan ngl=99"), where the lab measured several backends."""
    if "backend" not in d.columns or d["backend"].nunique(dropna=True) < 2:
        return pd.Series("", index=d.index)
    ngl = d["n_gpu_layers"].map(lambda v: f" ngl={int(v)}" if pd.notna(v) else "") if "n_gpu_layers" in d else ""
    return d["backend"].fillna("").astype(str) + ngl


def _speed_plot(rows: pd.DataFrame) -> str | None:
    sp = rows[
        rows.metric.isin(["prefill_tps", "decode_tps"])
        & rows.value.notna()
        & rows.cpu_quota.isna()
        & (rows.contention.fillna(0) == 0)
    ]
    if sp.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    sp = sp.assign(_be=_backend_label(sp))
    for ax, metric in zip(axes, ("prefill_tps", "decode_tps"), strict=True):
        d = sp[sp.metric == metric]
        for (dev, model, th, be), g in d.groupby(["device", "model", "threads", "_be"]):
            g = (
                g.groupby("quant")
                .agg(bpw=("bpw", "first"), v=("value", "max"), sd=("stddev", "max"))
                .sort_values("bpw")
            )
            ax.errorbar(
                g.bpw,
                g.v,
                yerr=g.sd.fillna(0),
                fmt="o-",
                capsize=2,
                label=f"{dev} · {model} · {th} thr" + (f" · {be}" if be else ""),
            )
        ax.set(xlabel="bits per weight (file)", ylabel="tokens/s", title=metric.replace("_tps", " t/s"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _png(fig)


def _energy_plot(rows: pd.DataFrame) -> str | None:
    e = rows[(rows.metric == "energy_per_token") & rows.value.notna()]
    if e.empty:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.4))
    e = e.assign(_be=_backend_label(e))
    for (dev, model, phase, be), g in e.groupby(["device", "model", "phase", "_be"]):
        g = g.groupby("quant").agg(bpw=("bpw", "first"), v=("value", "min")).sort_values("bpw")
        ax.plot(g.bpw, g.v, "o-", label=f"{dev} · {model} · {phase}" + (f" · {be}" if be else ""))
    ax.set(xlabel="bits per weight", ylabel="J / token", title="energy per token")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)


def _trace_plots(rows: pd.DataFrame, artifacts: Path | None, limit: int = 12) -> list[tuple[str, str]]:
    out = []
    if artifacts is None or not artifacts.exists():
        return out
    cells = rows[rows.model_bytes.notna()].drop_duplicates("cell_id")  # the models' cells, any kind
    for _, c in cells.head(limit).iterrows():
        tries = sorted((artifacts / c.cell_id).glob("attempt-*/telemetry.csv"))
        if not tries:
            continue
        tr = sampler_csv.parse(tries[-1].read_text(errors="replace"))
        df = tr.frame
        if len(df) < 2:
            continue
        t = df.t_s - df.t_s.iloc[0]
        fig, ax = plt.subplots(figsize=(4.6, 2.4))
        rss = tr.columns(r"proc/\d+/VmRSS_kB")
        if rss:
            ax.plot(t, df[rss[0]] / 1024, label="RSS (MiB)")
        ax.set(xlabel="s since cell start", ylabel="MiB")
        ax2 = None
        hot, ghz = normalize.hottest_c(tr), normalize.cpu_freq_hz(tr) / 1e9
        temps, freqs = hot.notna().any(), ghz.notna().any()
        if temps or freqs:
            ax2 = ax.twinx()
            if temps:  # read once a second: plot the ticks that have it
                ax2.plot(t[hot.notna()], hot.dropna(), "r-", label="hottest zone (°C)")
            if freqs:
                ax2.plot(t[ghz.notna()], ghz.dropna(), "g-", label="mean CPU GHz")
        note = "" if (temps or freqs) else " (no temperature or CPU clock readable on this device)"
        ax.set_title(f"{c.device} {c.model} {c.quant} {c.payload}{note}", fontsize=8)
        ax.grid(alpha=0.3)
        out.append((_png(fig), f"telemetry trace, cell {c.cell_id}"))
    return out


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(s)}</td>" for s in r) + "</tr>" for r in t.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _table(df: pd.DataFrame, cols: list[str], fmt: dict | None = None) -> str:
    return _html_table(Table.of_frame(df, cols, fmt))


CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}figure{display:inline-block;margin:.5em}
figcaption{font-size:11px;color:#666}.pick{background:#e5f6e5;font-weight:bold}.lost{color:#a33}
.held{color:#161}.not{color:#a33}section{margin-bottom:2em}"""


def _recommendation(v: RecommendationView) -> list[str]:
    """One device's recommendation: the pick, the candidates, why, per task, minimum RAM, KV cache, the knees."""
    p = v.pick
    parts = [
        f"<p class='pick' data-device='{html.escape(v.device)}'>{html.escape(v.device)}: ship "
        f"{html.escape(p.label)} ({p.bpw} bits/weight, {p.mib} MiB)</p>"
        if p
        else f"<p class='lost'>{html.escape(v.device)}: {NO_PICK}</p>",
        _html_table(v.candidates),
        "<ul class='why'>" + "".join(f"<li>{html.escape(x)}</li>" for x in v.reasons) + "</ul>",
    ]
    if v.per_task:
        parts += ["<p>Per task (an easy task can ship a smaller file):</p>", _html_table(v.per_task)]
    if v.min_ram:
        mr = Table(
            columns=("model", "quant", "needs MiB", "runtime measured", "smallest phone", "smallest laptop"),
            rows=tuple(
                (m.model, m.quant, m.need_mib, "yes" if m.measured else "assumed", m.phone, m.laptop) for m in v.min_ram
            ),
        )
        parts += [
            f"<p id='min-ram'>Minimum RAM at a {int(v.spec['context'])}-token context (phones: "
            "5/8 of the RAM less 1.56 GiB for one app; laptops: "
            f"{v.spec['ram_fraction']:.0%} of the RAM):</p>",
            _html_table(mr),
        ]
    if v.kv:
        parts += ["<p>KV cache by context (grows linearly; -ctk/-ctv quantize it):</p>", _html_table(v.kv)]
    knees = "; ".join(f"{k.model}: {k.bpw} bpw ({k.from_quant}→{k.to_quant}, KLD ×{k.jump})" for k in v.knees)
    parts.append(
        f"<p>Quality axis: {html.escape(v.quality_axis)}. Bits-per-weight knee: {html.escape(knees or NONE)}."
        f" Constraints: {html.escape(json.dumps(v.spec))}</p>"
    )
    return parts


def _recommendation_section(views: list[RecommendationView]) -> list[str]:
    """What a person acts on: first."""
    return [
        "<section id='recommendation'><h2>Recommendation</h2>",
        *(x for v in views for x in _recommendation(v)),
        "</section>",
    ]


RESULT_COLUMNS = [
    "device",
    "model",
    "quant",
    "bpw",
    "prefill_tps",
    "decode_tps",
    "kld_mean",
    "ppl_ratio",
    "same_top_p",
    "peak_rss",
    "decode_j_per_tok",
]
RESULT_FMT = {
    "bpw": "{:.2f}",
    "prefill_tps": "{:.1f}",
    "decode_tps": "{:.1f}",
    "kld_mean": "{:.4f}",
    "ppl_ratio": "{:.4f}",
    "same_top_p": "{:.1%}",
    "peak_rss": lambda v: f"{v / 1024**2:.0f} MiB",
    "decode_j_per_tok": "{:.3g}",
}


def _results_section(rows: pd.DataFrame) -> list[str]:
    w = wide(rows)
    parts = ["<section id='results'><h2>Results</h2>"]
    if not w.empty:
        parts.append(_table(w, RESULT_COLUMNS, RESULT_FMT))
    for fn, alt in (
        (lambda: _quality_plot(w, rows), "quality vs bits per weight, per model"),
        (lambda: _speed_plot(rows), "prefill and decode t/s vs bits per weight, per device"),
        (lambda: _energy_plot(rows), "energy per token"),
    ):
        src = fn()
        parts.append(
            _img(src, alt) if src else f"<p>{html.escape(alt)}: no data (e.g. no power source on these devices).</p>"
        )
    return [*parts, "</section>"]


def _roofline_section(rows: pd.DataFrame) -> list[str]:
    rl = roofline(rows)
    parts = ["<section id='roofline'><h2>Roofline</h2>"]
    if not rl.empty and rl.efficiency.notna().any():
        cols = ["device", "model", "quant", "test", "threads", "tps", "limit_tps", "efficiency", "bound"]
        parts.append(_table(rl, cols, {"tps": "{:.1f}", "limit_tps": "{:.1f}", "efficiency": "{:.0%}"}))
    else:
        parts.append("<p>No bandwidth measurement (add a <code>kind: membw</code> payload).</p>")
    return [*parts, "</section>"]


def _findings_section(rows: pd.DataFrame) -> list[str]:
    parts = ["<section id='findings'><h2>The seeds' findings on this data</h2><ul>"]
    for f in findings(rows):
        cls = {True: "held", False: "not", None: ""}[f["held"]]
        word = {True: "held", False: "did not hold", None: "not enough data"}[f["held"]]
        parts.append(
            f"<li><b>{html.escape(f['device'])} {html.escape(f['model'])}</b>: {html.escape(f['claim'])} — "
            f"<span class='{cls}'>{word}</span> ({html.escape(f['evidence'])})</li>"
        )
    return [*parts, "</ul></section>"]


def _traces_section(rows: pd.DataFrame, artifacts: Path | None) -> list[str]:
    traces = _trace_plots(rows, artifacts)
    parts = ["<section id='traces'><h2>Telemetry traces</h2>", *(_img(s, a) for s, a in traces)]
    if not traces:
        parts.append("<p>No raw artifacts available (a report from an exported table has no traces).</p>")
    return [*parts, "</section>"]


def _provenance_section(rows: pd.DataFrame) -> list[str]:
    parts = ["<section id='provenance'><h2>Provenance</h2>"]
    if not rows.empty:
        prov = rows.drop_duplicates("build_key")[["build_commit", "build_key", "target", "build_flags"]]
        parts.append(_table(prov, list(prov.columns)))
    return [*parts, "</section>"]


def build(
    rows: pd.DataFrame, spec: RecommendSpec, out: Path, artifacts: Path | None = None, title: str = "devicelab"
) -> Path:
    _, views = recommendation_views(rows, spec)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
        *_recommendation_section(views),
        *_results_section(rows),
        *_roofline_section(rows),
        *_findings_section(rows),
        *_traces_section(rows, artifacts),
        *_provenance_section(rows),
        "</body></html>",
    ]
    out = Path(out)
    out.write_text("\n".join(parts))
    return out
