"""`devicelab report`: the explorer, one self-contained HTML page (plotly's script embedded, nothing fetched
when it opens; it works from a file and from a mail attachment). Filters for device, model, backend, quant and
run that every view follows (kept in the page's address, so a link shows what it showed); the frontier per device
with the pick marked and each other quant's reasons on hover; t/s, KLD and PPL ratio against bits per weight;
energy per prompt; the roofline; the telemetry of every cell on one shared time axis with its phases shaded;
every point's provenance on hover; the recommendation in sentences and the minimum-RAM table.

`data` makes the plotted records, `sections` the text and tables, `explorer.js` draws them in the browser."""

from __future__ import annotations

import html
import time
from importlib import resources
from pathlib import Path

import pandas as pd

from ..recipes import RecommendSpec
from ..tables import recommendation_views
from . import data, sections

__all__ = ["build", "page"]


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _filters(values: dict) -> str:
    out = ["<form id='filters' aria-label='filters'>"]
    for k, vals in values.items():
        boxes = "".join(
            f"<label><input type='checkbox' name='{k}' value='{html.escape(v)}' checked>{html.escape(v)}</label>"
            for v in vals
        )
        out.append(f"<fieldset data-filter='{k}'><legend>{k}</legend>{boxes}</fieldset>")
    return "".join([*out, "</form>"])


def explorer_data(rows: pd.DataFrame, recs, artifacts: Path | None) -> dict:
    return {
        "filters": data.filter_values(rows),
        "points": data.points(rows),
        "frontier": data.frontier(recs, rows),
        "roofline": data.roofline_points(rows),
        "traces": data.traces(rows, artifacts),
        "sustained": data.sustained(rows),
        "notes": {"energy": data.missing(rows, "energy_per_token"), "temperature": data.missing(rows, "temp_max")},
    }


VIEWS = (
    (
        "frontier",
        "The frontier per device",
        "Size against decode speed; quality and energy on hover. ◆ on the Pareto frontier of quality × size × "
        "decode speed × energy, ★ the pick; hover over any other quant for why it lost.",
    ),
    (
        "speed",
        "Tokens per second against bits per weight",
        "Prefill and decode, per device, backend and "
        "thread count; bars are one standard deviation over the repetitions.",
    ),
    (
        "quality",
        "Quality against bits per weight",
        "Mean KL divergence from the base (log scale) and the perplexity ratio, per model and device.",
    ),
    ("energy", "Energy", "Energy per prompt of each candidate and decode/prefill J per token."),
    ("roofline", "Roofline", "Measured t/s against the device's memory-bandwidth (decode) or compute (prefill) limit."),
    (
        "sustained",
        "Sustained speed",
        "Each sustained run's tokens per second (solid) and hottest zone (dotted) in each slice of the run, against "
        "the time from its start; the legend gives its stability (the last quarter's speed ÷ the first burst_s's) "
        "and the time to its first throttle (a slice below 90 % of the burst).",
    ),
    (
        "traces",
        "Telemetry traces",
        "Every cell on one shared time axis, a row per device: RSS, the hottest "
        "zone and the CPU clock; prefill shaded blue, decode orange, a throttled cell red.",
    ),
)


def page(rows: pd.DataFrame, spec: RecommendSpec, artifacts: Path | None = None, title: str = "devicelab") -> str:
    """The explorer as one HTML string."""
    recs, views = recommendation_views(rows, spec)
    d = explorer_data(rows, recs, artifacts)
    runs = ", ".join(d["filters"]["run"]) or "—"
    view_html = "".join(
        f"<section id='{k}'><h2>{t}</h2><p class='note'>{note}</p><div class='plot' id='plot-{k}'>"
        f"</div><p class='empty' id='empty-{k}' hidden></p></section>"
        for k, t, note in VIEWS
    )
    return "\n".join(
        [
            f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
            f"<style>{_asset('explorer.css')}</style>",
            f"<script>{_plotly_js()}</script></head><body>",
            f"<header><h1>{html.escape(title)}</h1><p class='note'>{len(rows)} rows from run(s) {html.escape(runs)}; "
            f"written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>{_filters(d['filters'])}</header>",
            "<main>",
            sections.recommendations(views),
            view_html,
            sections.roofline_table(rows)
            and f"<section id='roofline-table'><h2>Roofline table</h2>{sections.roofline_table(rows)}</section>",
            sections.comparisons(rows),
            sections.results(rows),
            sections.findings_section(rows),
            sections.builds(rows),
            "</main>",
            f"<script type='application/json' id='dl-data'>{data.dumps(d)}</script>",
            f"<script>{_asset('explorer.js')}</script></body></html>",
        ]
    )


def build(
    rows: pd.DataFrame, spec: RecommendSpec, out: Path, artifacts: Path | None = None, title: str = "devicelab"
) -> Path:
    out = Path(out)
    out.write_text(page(rows, spec, artifacts, title), encoding="utf-8")
    return out
