"""Parsers of real tool output (captured from this project's own runs of llama.cpp 0c1e570)."""

import math

import pytest
from conftest import FIXTURES

from devicelab.errors import DevicelabError
from devicelab.kinds import bench
from devicelab.kinds import kld as perplexity
from devicelab.schema import Row
from devicelab.telemetry import sampler_csv


def test_bench_jsonl_rows_keep_every_repetition():
    tests = bench.parse((FIXTURES / "llama-bench-q4_k_m.stdout.tsv").read_text())
    assert [t.name for t in tests] == ["pp64", "tg32"]
    assert all(t.t_end is not None for t in tests)
    rows = bench.rows(tests)
    pre = next(r for r in rows if r.metric == "prefill_tps")
    dec = next(r for r in rows if r.metric == "decode_tps")
    assert pre.n == 3 and len(pre.samples) == 3 and pre.value > 0 and pre.stddev > 0
    assert dec.n_gen == 32 and dec.threads == 1 and dec.unit == "tok/s"
    # the timed window is the sum of the repetitions, ending when the line arrived
    w = tests[1].window()
    assert w[1] == tests[1].t_end and 0 < w[1] - w[0] < 10


def test_bench_without_results_is_an_error():
    from devicelab.errors import DevicelabError

    with pytest.raises(DevicelabError, match="no result line"):
        bench.rows(bench.parse("12.0\tload_backend: loaded CPU\n"))


def test_bench_argv_is_a_list_with_every_axis():
    a = bench.argv(
        "/b/llama-bench",
        "/m x.gguf",
        bench.BenchParams(
            prompt=(64, 128),
            gen=(32,),
            pg=((64, 32),),
            depth=(0, 512),
            threads=2,
            repetitions=5,
            cpu_mask="0x3",
            warmup=False,
        ),
    )
    assert a[:3] == ["/b/llama-bench", "-m", "/m x.gguf"]
    s = " ".join(a)
    for part in ("-p 64,128", "-n 32", "-pg 64,32", "-d 0,512", "-t 2", "-r 5", "-C 0x3", "--no-warmup", "-o jsonl"):
        assert part in s


def test_kld_statistics_parsed():
    rows = {
        r.metric: r
        for r in perplexity.parse_kld(
            (FIXTURES / "perplexity-kld-q4_k_m.txt").read_text(), perplexity.KLDParams(ctx=128, chunks=8)
        )
    }
    assert rows["kld_mean"].value == pytest.approx(0.058373) and rows["kld_mean"].stddev == pytest.approx(0.005258)
    assert rows["ppl_ratio"].value == pytest.approx(1.040073)
    assert rows["same_top_p"].value == pytest.approx(0.87698)
    assert rows["kld_p99"].value == pytest.approx(0.321232)


def test_kld_of_identical_logits_has_nan_spread_not_missing_value():
    text = (FIXTURES / "perplexity-kld-identical.stdout.tsv").read_text()
    rows = {r.metric: r for r in perplexity.parse_kld(text, perplexity.KLDParams())}
    assert rows["ppl_ratio"].value == pytest.approx(1.0) and rows["ppl_ratio"].stddev is None
    assert rows["kld_mean"].value < 1e-5


@pytest.mark.parametrize("sign", ["Â±", "┬▒", "+/-", "_", "?", "\ufffd"])
def test_kld_read_where_the_plus_minus_did_not_survive(sign):
    """A log through another encoding (llama.cpp #12557 published '_' for every '±'): the same figures, not a
    partial row."""
    text = (FIXTURES / "perplexity-kld-q4_k_m.txt").read_text()
    want = {r.metric: (r.value, r.stddev) for r in perplexity.parse_kld(text, perplexity.KLDParams())}
    got = perplexity.parse_kld(text.replace("±", sign).replace("Δp", "_p"), perplexity.KLDParams())
    assert {r.metric: (r.value, r.stddev) for r in got} == want
    assert not any(r.missing_reason for r in got)


@pytest.mark.parametrize("sign", ["", "   "])
def test_kld_with_its_sign_lost_is_refused_in_one_line(sign):
    text = (FIXTURES / "perplexity-kld-q4_k_m.txt").read_text().replace("±", sign)
    with pytest.raises(DevicelabError, match="does not read as figures") as e:
        perplexity.parse_kld(text, perplexity.KLDParams())
    assert "\n" not in str(e.value)


def test_missing_value_needs_a_reason_and_unknown_metric_refused():
    with pytest.raises(ValueError, match="missing_reason"):
        Row(metric="energy", value=float("nan"))
    with pytest.raises(ValueError, match="unknown metric"):
        Row(metric="speed", value=1.0)
    r = Row(metric="energy", value=None, missing_reason="no RAPL")
    assert math.isnan(r.value) and r.unit == "J"


def test_sampler_csv_from_a_real_run():
    tr = sampler_csv.parse((FIXTURES / "telemetry-local.csv").read_text())
    hwm = tr.columns(r"proc/\d+/VmHWM_kB")
    assert hwm and tr.frame[hwm[0]].max() > 50_000  # llama-bench on SmolLM2: > 50 MB
    assert tr.frame["t_s"].is_monotonic_increasing
