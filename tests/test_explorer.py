"""The explorer page without a browser or a build: what it embeds (every point with its filter fields and its
provenance, the frontier with the pick and each loser's reasons, the roofline), that it names nothing on a
network, and that it is built from rows with no quality measured, no energy, no artifacts."""

from __future__ import annotations

import json
import re

import pandas as pd
from test_views import ladder

from devicelab.recipes import RecommendSpec
from devicelab.report import build, page


def _data(html: str) -> dict:
    return json.loads(re.search(r"<script type='application/json' id='dl-data'>(.*?)</script>", html, re.S).group(1))


def _rows() -> pd.DataFrame:
    rows = pd.DataFrame(ladder() + ladder(device="tiny", budget=100 * 1024**2))
    rows["run_id"], rows["recorded_at"], rows["payload"], rows["unit"] = "run-1", "2026-12-04T00:00:00Z", "bench", ""
    rows["backend"], rows["test"], rows["n_prompt"], rows["n_depth"] = "cpu", "tg64", 0, 0
    membw = {c: None for c in rows.columns} | {
        "device": "phone",
        "model": "-",
        "quant": "-",
        "metric": "mem_bandwidth",
        "value": 20e9,
        "cell_id": "membw",
        "run_id": "run-1",
    }
    return pd.concat([rows, pd.DataFrame([membw])], ignore_index=True)


def test_every_point_carries_its_filters_and_provenance(tmp_path):
    html = build(_rows(), RecommendSpec(context=512), tmp_path / "r.html").read_text()
    d = _data(html)
    assert d["filters"]["device"] == ["phone", "tiny"] and d["filters"]["quant"][0] == "f16"
    assert d["filters"]["run"] == ["run-1"] and d["filters"]["backend"] == ["cpu"]
    assert {p["metric"] for p in d["points"]} == {"decode_tps", "kld_mean", "energy_per_token"}
    for p in d["points"]:
        assert {p[k] for k in ("device", "model", "backend", "quant", "run")} <= {
            "phone",
            "tiny",
            "m",
            "cpu",
            p["quant"],
            "run-1",
        }
        assert f"cell {p['cell']} · run run-1" in p["hover"] and "llama.cpp c" in p["hover"]
    # the frontier: at most one pick a device (the smallest that passes), and every loser says why
    picks = {f["device"]: f["quant"] for f in d["frontier"] if f["role"] == "pick"}
    assert picks["phone"] == "q2_k" and len([f for f in d["frontier"] if f["role"] == "pick"]) == len(picks)
    for f in d["frontier"]:
        assert f["verdict"] and f["verdict"].split("; ")[0] in f["hover"].replace("&gt;", ">")
        assert f["role"] == "pick" or "why it lost" in f["hover"]
        assert "cells " in f["hover"] and "run run-1" in f["hover"]
    # the roofline: phone's decode against its bandwidth, each point with its row's provenance
    assert d["roofline"] and all(r["device"] == "phone" and "cell phone" in r["hover"] for r in d["roofline"])
    # nothing to fetch: no external script, stylesheet, image or frame
    assert not re.search(r"<(script|img|iframe)[^>]+src=|<link ", html)
    assert "The constraints:" in html and "<ul class='constraints'>" in html


def test_a_page_from_rows_with_no_quality_no_energy_no_artifacts():
    rows = _rows()
    rows = rows[~rows.metric.isin(["kld_mean", "energy_per_token"])]
    html = page(rows, RecommendSpec(context=512))
    d = _data(html)
    assert d["traces"] == [] and not any(p["metric"] == "kld_mean" for p in d["points"])
    assert "no quality measured: the speed and memory picks alone" in html
    assert "add `- kind: kld`" in html


def test_the_comparison_reads_only_what_it_compares():
    """The report's comparison section is given only the columns a comparison reads (not each row's provenance),
    and says what a comparison over every column says."""
    from devicelab.report import sections

    rows = _rows()
    rows["samples"] = rows["value"].map(lambda v: f"[{v * 0.99}, {v}, {v * 1.01}]" if v == v else None)
    rows["host_busy_cpus"] = 0.0
    full = "".join(sections._comparison(rows, k, c) for k, c in sections.COMPARED if c in rows)
    assert "device: phone against tiny" in full
    assert full in sections.comparisons(rows)
    assert set(rows.columns) - sections.compared_columns() >= {"build_flags", "model_sha256", "energy_calibration"}
