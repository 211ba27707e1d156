"""The recommendation's parts, without a build: a candidate is made by keyword from what was measured and then
judged by a list of checks; the CLI and the report render one set of view rows; the backends and the ledger's
file name are each written once."""

import io
import re
import typing
from html import escape

import pandas as pd
import pytest
from rich.console import Console

from devicelab import console, recipes, tables
from devicelab.build import backends
from devicelab.ledger import LEDGER_FILE, ledger_path
from devicelab.recipes import RecommendSpec
from devicelab.recommend import CHECKS, Candidate, candidates, judge
from devicelab.report import build
from devicelab.schema import ROW_COLUMNS
from devicelab.transports import settings

MIB = 1024**2


def row(**kw):
    r = {c: None for c in ROW_COLUMNS}
    r.update(kw)
    return r


def ladder(device="phone", budget=2 * 1024**3, accs=None):
    """One model's ladder on one device: speed, KLD, peak RSS, energy and (optionally) two tasks' accuracy."""
    out = []
    for i, q in enumerate(("f16", "q8_0", "q4_0", "q2_k")):
        size = (270e6, 145e6, 80e6, 60e6)[i]
        common = dict(
            device=device,
            model="m",
            quant=q,
            model_bytes=int(size),
            bpw=8 * size / 135e6,
            kv_bytes_per_token=1000,
            ram_budget_bytes=budget,
            ram_budget_source="MemAvailable: x",
            battery_wh=17.0,
            battery_source="energy_full 17.00 Wh",
            threads=2,
            cell_id=f"{device}{q}",
            build_key="k",
            build_commit="c",
            target="local",
            build_flags="",
        )
        out.append(row(metric="decode_tps", value=20.0 * (1 + i), phase="decode", n_gen=64, **common))
        out.append(row(metric="kld_mean", value=0.001 * 4**i, phase="", **common))
        out.append(row(metric="peak_rss", value=size + 50e6, phase="cell", n_prompt=512, n_gen=64, **common))
        cal = '{"source": "battery:battery"}'
        out.append(
            row(metric="energy_per_token", value=0.5, phase="prefill", n_prompt=512, energy_calibration=cal, **common)
        )
        out.append(
            row(metric="energy_per_token", value=2.0, phase="decode", n_gen=64, energy_calibration=cal, **common)
        )
        for t, a in zip(("easy", "hard"), (accs or {}).get(q, ()), strict=False):
            out.append(row(metric="accuracy", value=a, phase="eval", test=t, **common))
    return out


ACCS = {"f16": (0.9, 0.8), "q8_0": (0.9, 0.79), "q4_0": (0.89, 0.70), "q2_k": (0.6, 0.4)}


def test_a_candidate_is_made_by_keyword():
    with pytest.raises(TypeError):
        Candidate("d", "m", "q4_0", 1, 4.5, None, None, False, None, None, None, None, None, None, None, None)
    c = Candidate(
        device="d",
        model="m",
        quant="q4_0",
        model_bytes=1,
        bpw=4.5,
        kv_bytes=None,
        overhead_bytes=None,
        overhead_measured=False,
        ram_need=None,
        ram_budget=None,
        decode_tps=None,
        decode_threads=None,
        prefill_tps=None,
        kld_mean=None,
        ppl_ratio=None,
        energy_per_token=None,
    )
    assert c.passes and c.label == "m q4_0"


def test_measuring_then_judging_check_by_check():
    spec = RecommendSpec(
        context=512, max_kld_mean=0.02, min_decode_tps=30, max_energy_per_token=1.0, max_accuracy_drop=2
    )
    cs = {c.quant: c for c in candidates(pd.DataFrame(ladder(budget=200 * MIB, accs=ACCS)), spec)}
    q2 = cs["q2_k"]
    # measured: the figures, the RAM need from weights + KV + the runtime measured from peak RSS
    assert q2.decode_tps == 80.0 and q2.kld_mean == pytest.approx(0.064) and q2.decode_threads == 2
    assert q2.overhead_measured and q2.ram_need == q2.model_bytes + q2.kv_bytes + q2.overhead_bytes
    assert q2.task_accuracy == {"easy": 0.6, "hard": 0.4} and q2.base_accuracy == {"easy": 0.9, "hard": 0.8}
    # judged: each check says why it lost, in the order of CHECKS
    assert q2.failures == [f for check in CHECKS for f in check(q2, spec, ["easy", "hard"])]
    assert [f.split(" ")[0] for f in q2.failures] == ["mean", "easy:", "hard:", "decode"]
    assert cs["f16"].failures[0].startswith("needs ") and "> budget 200 MiB (MemAvailable: x)" in cs["f16"].failures[0]
    assert cs["f16"].failures[1] == "decode 20.0 tok/s < 30.0"
    # a check is a plain function: a list of them judges the same candidate differently
    assert judge(q2, spec, ["easy"], checks=[CHECKS[-1]]) == ["decode energy 2 J/tok > 1.0"]
    assert judge(q2, spec, [], checks=[]) == []


def _cli_text(rows, spec) -> str:
    buf = io.StringIO()
    old = console.console
    console.console = Console(file=buf, width=400, highlight=False, color_system=None)
    try:
        console.print_recs(rows, spec)
    finally:
        console.console = old
    return buf.getvalue()


def test_cli_and_report_render_the_same_view_rows(tmp_path):
    rows = pd.DataFrame(ladder(accs=ACCS) + ladder(device="tiny", budget=100 * MIB))
    spec = RecommendSpec(context=512, max_accuracy_drop=2, prefer="smallest")
    recs, views = tables.recommendation_views(rows, spec)
    assert [v.device for v in views] == [r.device for r in recs] == ["phone", "tiny"]
    phone, tiny = views
    assert phone.pick.label == "m q8_0" and tiny.pick is None
    assert phone.candidates.columns[:3] == ("model", "quant", "backend") and len(phone.candidates.rows) == 4
    assert all(len(r) == len(phone.candidates.columns) for r in phone.candidates.rows)
    assert phone.per_task.rows == (("easy", "m q4_0", "89.0%", "90.0%", "2"), ("hard", "m q8_0", "79.0%", "80.0%", "2"))
    assert {m.phone for m in phone.min_ram} == {"4 GB"}

    out = _cli_text(rows, spec)
    html = build(rows, spec, tmp_path / "r.html").read_text()
    assert "phone: ship m q8_0 (8.59 bits/w, 138 MiB, decode 40.0 tok/s, KLD 0.0040)" in out
    assert "phone: ship m q8_0 (8.59 bits/weight, 138 MiB)</p>" in html
    assert f"tiny: {tables.NO_PICK}" in out and f"tiny: {tables.NO_PICK}</p>" in html
    for v in views:
        for line in (*v.reasons, *v.listing):
            assert f"  {line}\n" in out  # the CLI: the reasons and one line per candidate
        for line in v.reasons:
            assert f"<li>{escape(line)}</li>" in html  # the report: the same reasons
        for r in v.candidates.rows:  # ... and the candidates' cells, row by row
            assert "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" in html
        for m in v.min_ram:
            assert re.search(rf"{m.model} +{m.quant} +{m.need_mib}\*? +{m.phone} +{m.laptop}", out)
            assert f"<td>{m.model}</td><td>{m.quant}</td><td>{m.need_mib}</td>" in html
    # the report: one section each, in order
    ids = re.findall(r"<section id='([a-z-]+)'>", html)
    assert ids == [
        "recommendation",
        "frontier",
        "speed",
        "quality",
        "energy",
        "roofline",
        "sustained",
        "traces",
        "compare",
        "results",
        "findings",
        "provenance",
    ]


def test_cell_texts():
    assert tables.text(None) == tables.text(float("nan"), "{:.1f}") == tables.text(pd.NA) == tables.NONE
    assert tables.text(0.1234, "{:.1%}") == "12.3%" and tables.text(3) == "3"
    t = tables.Table.of([{"a": 1.0, "b": None}, {"a": None, "b": "x"}], {"a": "{:.2f}"})
    assert t.columns == ("a", "b") and t.rows == (("1.00", "—"), ("—", "x"))


def test_backends_are_named_once():
    assert typing.get_args(backends.Backend) == backends.BACKENDS
    assert backends.CPU in backends.BACKENDS and set(backends._FLAGS) == set(backends.BACKENDS)
    for model in (recipes.Recipe, settings.DeviceBase):
        field = model.model_fields["backends"].annotation
        (items, _none) = typing.get_args(field)
        assert typing.get_args(items) == (backends.Backend,)


def test_the_ledger_file():
    assert ledger_path("lab") == ledger_path("lab/") and ledger_path("lab").name == LEDGER_FILE
