"""The explorer's HTML sections that are text and tables: the recommendation (the constraints in sentences, the
pick, every candidate and why it lost, the minimum-RAM and KV tables), the results table, the roofline and the
findings of the on-device study analysis.STUDY, the builds. Every table row carries the filter fields (data-device,
data-model, …) so the page's filters hide what they exclude."""

from __future__ import annotations

import html

import pandas as pd

from ..analysis import STUDY, findings, roofline
from ..tables import NONE, RecommendationView, Table, wide

E = html.escape


def html_table(t: Table, cls: str = "") -> str:
    """A plain table; the page's filters read its device/model/quant/backend columns by their headers (and the
    device of the recommendation it is in)."""
    head = "".join(f"<th>{E(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{E(s)}</td>" for s in r) + "</tr>" for r in t.rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _min_ram(v: RecommendationView, first: bool) -> list[str]:
    if not v.min_ram:
        return []
    mr = Table(
        columns=("model", "quant", "needs MiB", "runtime overhead", "smallest phone", "smallest laptop"),
        rows=tuple(
            (m.model, m.quant, m.need_mib, "measured" if m.measured else "assumed (64 MiB)", m.phone, m.laptop)
            for m in v.min_ram
        ),
    )
    anchor = " id='min-ram'" if first else ""
    return [
        f"<h4{anchor}>Minimum RAM at a {int(v.spec['context']):,}-token context</h4><p class='note'>Phones: 5/8 of "
        f"the marketed RAM less 1.56 GiB for one app; laptops: {v.spec['ram_fraction']:.0%} of the RAM.</p>",
        html_table(mr, "min-ram"),
    ]


def recommendation(v: RecommendationView, first: bool = True) -> str:
    """One device's recommendation, as sentences first and tables after."""
    p = v.pick
    head = (
        f"<p class='pick'>{E(v.device)}: ship {E(p.label)} ({p.bpw} bits/weight, {p.mib} MiB)</p>"
        f"<p>It decodes {p.decode} tokens per second; its mean KL divergence from the base is {p.kld}.</p>"
        if p
        else f"<p class='lost'>{E(v.device)}: {E(v.no_pick)}</p>"
    )
    knees = "; ".join(
        f"for {k.model} at {k.bpw} bits per weight (mean KLD ×{k.jump} from {k.from_quant} to {k.to_quant})"
        for k in v.knees
    )
    parts = [
        f"<div class='rec' data-device='{E(v.device)}'>",
        f"<h3>{E(v.device)}</h3>",
        head,
        "<p>The constraints:</p><ul class='constraints'>",
        *(f"<li>{E(s)}</li>" for s in v.sentences),
        "</ul>",
        "<ul class='why'>",
        *(f"<li>{E(x)}</li>" for x in v.reasons),
        "</ul>",
        "<h4>Every candidate, and why it lost</h4>",
        html_table(v.candidates, "candidates"),
        f"<p class='note'>Quality is judged by {E(v.quality_axis)}. The bits-per-weight knee: "
        f"{E(knees or 'none found')}.</p>",
    ]
    if v.per_task:
        parts += ["<h4>Per task (an easy task can ship a smaller file)</h4>", html_table(v.per_task)]
    parts += _min_ram(v, first)
    if v.kv:
        parts += [
            "<h4>KV cache by context</h4><p class='note'>It grows linearly; -ctk/-ctv quantize it.</p>",
            html_table(v.kv),
        ]
    return "\n".join([*parts, "</div>"])


def recommendations(views: list[RecommendationView]) -> str:
    body = "\n".join(recommendation(v, i == 0) for i, v in enumerate(views)) or "<p>No results to recommend from.</p>"
    return f"<section id='recommendation'><h2>Recommendation</h2>{body}</section>"


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


def results(rows: pd.DataFrame) -> str:
    w = wide(rows)
    if w.empty:
        return "<section id='results'><h2>Results</h2><p>No results.</p></section>"
    return (
        "<section id='results'><h2>Results (best over threads)</h2>"
        + html_table(Table.of_frame(w, RESULT_COLUMNS, RESULT_FMT), "results")
        + "</section>"
    )


def roofline_table(rows: pd.DataFrame) -> str:
    rl = roofline(rows)
    if rl.empty or not rl.efficiency.notna().any():
        return ""
    cols = ["device", "model", "quant", "test", "threads", "tps", "limit_tps", "efficiency", "bound"]
    return html_table(
        Table.of_frame(rl, cols, {"tps": "{:.1f}", "limit_tps": "{:.1f}", "efficiency": "{:.0%}"}), "roofline"
    )


def findings_section(rows: pd.DataFrame) -> str:
    items = []
    for f in findings(rows):
        cls = {True: "held", False: "not", None: ""}[f["held"]]
        word = {True: "held", False: "did not hold", None: "not enough data"}[f["held"]]
        items.append(
            f"<li data-device='{E(f['device'])}' data-model='{E(f['model'])}'><b>{E(f['device'])} "
            f"{E(f['model'])}</b>: {E(f['claim'])} — <span class='{cls}'>{word}</span> "
            f"({E(f['evidence'])})</li>"
        )
    return (
        f"<section id='findings'><h2>The findings of “{E(STUDY)}” on this data</h2><ul>"
        + "".join(items)
        + (f"<li>{NONE}</li>" if not items else "")
        + "</ul></section>"
    )


def builds(rows: pd.DataFrame) -> str:
    if rows.empty:
        return ""
    cols = [c for c in ("build_commit", "build_key", "target", "build_flags") if c in rows]
    prov = rows.drop_duplicates("build_key")[cols]
    return "<section id='provenance'><h2>Builds</h2>" + html_table(Table.of_frame(prov, cols)) + "</section>"


# what the explorer compares, where the rows hold two or more of it: (the side's key, the row column)
COMPARED = (("backend", "backend"), ("commit", "build_commit"), ("device", "device"), ("run", "run_id"))
# what a comparison reads of a row besides the properties rows pair on: its measurement, unit and host load
MEASURED = ("payload", "metric", "unit", "value", "stddev", "n", "samples", "host_busy_cpus", "recorded_at")


def compared_columns() -> set[str]:
    """The columns `compare` reads: the measurement, every kind's key properties, the sides' columns."""
    from .. import compare as cmpmod
    from .. import kinds

    keys = {*kinds.base.Kind.key_properties, *(c for k in kinds.REGISTRY.values() for c in k.key_properties)}
    return {*MEASURED, *keys, *(c for _, c in COMPARED), *(c for c, _ in cmpmod.ALIASES.values())}


def _comparison(rows: pd.DataFrame, key: str, col: str) -> str:
    from .. import compare as cmpmod

    vals = rows[col].dropna().astype(str)
    if vals.nunique() < 2:
        return ""
    last = rows.assign(_v=rows[col].astype(str)).groupby("_v")["recorded_at"].max().sort_values()
    a, b = list(last.index[-2:]) if key == "run" else list(dict.fromkeys(vals))[:2]
    sa, sb = cmpmod.Side.parse(f"{key}={a}"), cmpmod.Side.parse(f"{key}={b}")
    ra, rb = sa.select(rows), sb.select(rows)
    cmp = cmpmod.compare(ra, rb, sa, sb, noise=cmpmod.noise_beside(rows, ra, rb))
    if not cmp.pairs:
        return ""
    headers, body, common = cmpmod.view(cmp)
    shared = ", ".join(f"{k} = {v}" for k, v in common.items())
    return (
        f"<h3>{E(key)}: {E(a)} against {E(b)}</h3><p>{E(cmpmod.summary(cmp))}</p>"
        + (f"<p class='note'>Common to every pair: {E(shared)}.</p>" if shared else "")
        + html_table(Table(columns=tuple(headers), rows=tuple(tuple(r) for r in body)), "compare")
    )


def comparisons(rows: pd.DataFrame) -> str:
    """Where the rows hold two backends, commits, devices or runs: the first two side by side, paired on the
    properties that make two rows comparable (devicelab compare's pairs), each change judged for significance.
    Each reads only the columns a comparison does (a row's provenance is not compared)."""
    if not rows.empty and any(c in rows for _, c in COMPARED):
        rows = rows[[c for c in rows.columns if c in compared_columns()]]
    parts = [_comparison(rows, k, c) for k, c in COMPARED if not rows.empty and c in rows]
    body = "".join(p for p in parts if p) or (
        "<p>Nothing to compare: these rows hold one backend, commit, device "
        "and run (`devicelab compare A B` compares any two sides).</p>"
    )
    return f"<section id='compare'><h2>Compare</h2>{body}</section>"
