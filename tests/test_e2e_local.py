"""End to end on the local target, for real: the pinned llama.cpp built here, SmolLM2-135M from PyPI,
its quant ladder made with llama-quantize, llama-bench and llama-perplexity run under the sampler."""

import json
import sqlite3

import pandas as pd
import pytest
from conftest import FIXTURES, REPO, devicelab

from devicelab.ledger import ledger_path

pytestmark = pytest.mark.e2e
RECIPE = REPO / "tests" / "recipes" / "e2e-small.yaml"


@pytest.fixture(scope="module")
def lab(tmp_path_factory, host_build, smol_path):
    d = tmp_path_factory.mktemp("lab")
    p = devicelab("run", RECIPE, "--lab-dir", d)
    assert p.returncode == 0, p.stdout + p.stderr
    return d, p


def frame(lab_dir):
    from devicelab.ledger import Ledger

    return Ledger(ledger_path(lab_dir)).rows_frame(recipe="e2e-small")


def test_bench_rows_real_and_repetitions_stored(lab):
    rows = frame(lab[0])
    dec = rows[rows.metric == "decode_tps"]
    pre = rows[rows.metric == "prefill_tps"]
    assert len(dec) == 4 * 2 and len(pre) == 4 * 2  # 4 quants × 2 thread counts
    assert (dec.value > 0).all() and (pre.value > 0).all()
    assert set(dec.threads) == {1, 2} and (dec.n == 2).all()
    assert all(len(json.loads(s)) == 2 for s in dec.samples)
    # provenance on every row
    assert (rows.build_commit.str.startswith("0c1e57")).all()
    assert rows.build_flags.str.contains("LLAMA_USE_PREBUILT_UI").all()
    assert rows.device_facts.str.contains("mem_total_bytes").all()


def test_the_device_runs_the_host_builds_binaries(lab, host_build):
    """A build is one folder per (commit, target, flags, compiler) holding every tool asked of it: the local device's
    build (llama-bench and llama-perplexity) is the host's (which quantized the ladder), not a second build."""
    rows = frame(lab[0])
    assert set(rows.build_key) == {host_build.key}
    from devicelab.build import cache, source, targets

    part = cache.find(source.resolve(None), targets.local_native(), tools=("llama-bench",))
    assert part is not None and part.dir == host_build.dir
    assert set(part.manifest["tools"]) >= {"llama-bench", "llama-perplexity", "llama-quantize", "llama-server"}


def test_kld_orders_the_ladder(lab):
    rows = frame(lab[0])
    kld = rows[rows.metric == "kld_mean"].set_index("quant")["value"]
    assert kld["f16"] < 1e-4, "f16 is the base itself"
    assert kld["q8_0"] < kld["q4_k_m"] < kld["q2_k"]
    ppl = rows[rows.metric == "ppl_ratio"].set_index("quant")["value"]
    assert ppl["q2_k"] > ppl["q8_0"]


def test_real_tensor_types_recorded(lab):
    rows = frame(lab[0])
    tt = json.loads(rows[rows.quant == "q4_k_m"].tensor_types.iloc[0])
    # SmolLM2 rows are 576 wide: most q4_K tensors fall back to another type; the file says which
    assert "Q4_K" in tt or "Q5_0" in tt
    assert set(tt) - {"Q4_K"}, "fallback types are recorded, not just the quant's name"
    bpw = rows.groupby("quant")["bpw"].first()
    assert bpw["f16"] > bpw["q8_0"] > bpw["q4_k_m"] > bpw["q2_k"]


def test_peak_rss_plausible(lab):
    rows = frame(lab[0])
    rss = rows[(rows.metric == "peak_rss") & (rows.payload == "bench")]
    assert rss.value.notna().all()
    for _, r in rss.iterrows():
        assert r.model_bytes < r.value < r.model_bytes + 2 * 1024**3  # weights are mapped and touched


def test_rerun_executes_no_finished_cell(lab):
    d, first = lab
    before = {r[0]: r[1] for r in sqlite3.connect(ledger_path(d)).execute("SELECT cell_id, attempts FROM cells")}
    n_rows = sqlite3.connect(ledger_path(d)).execute("SELECT count(*) FROM rows").fetchone()[0]
    p = devicelab("run", RECIPE, "--lab-dir", d, check=True)
    assert "12 cells, 12 already done, 0 ran" in p.stdout
    after = {r[0]: r[1] for r in sqlite3.connect(ledger_path(d)).execute("SELECT cell_id, attempts FROM cells")}
    assert before == after
    assert n_rows == sqlite3.connect(ledger_path(d)).execute("SELECT count(*) FROM rows").fetchone()[0]


def test_recommendation_printed_and_reproducible_from_export(lab, tmp_path):
    d, first = lab
    assert "local: ship smollm2-135m" in first.stdout
    assert "q2_k" in first.stdout and "mean KLD" in first.stdout  # the reason q2_k lost
    out = tmp_path / "results.parquet"
    devicelab("results", "--lab-dir", d, "--export", out, check=True)
    csv = tmp_path / "results.csv"
    devicelab("results", "--lab-dir", d, "--export", csv, check=True)
    assert len(pd.read_parquet(out)) == len(pd.read_csv(csv)) > 0
    a = devicelab("recommend", "--lab-dir", d, "--recipe", RECIPE, "--json", check=True)
    b = devicelab("recommend", "--from", out, "--recipe", RECIPE, "--json", check=True)
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja[0]["pick"]["quant"] == jb[0]["pick"]["quant"]
    assert [c["verdict"] for c in ja[0]["candidates"]] == [c["verdict"] for c in jb[0]["candidates"]]
    q2 = next(c for c in ja[0]["candidates"] if c["quant"] == "q2_k")
    assert q2["failures"] and ja[0]["pick"]["quant"] != "q2_k"


def test_import_llama_bench_jsonl(tmp_path):
    src = tmp_path / "bench.jsonl"
    src.write_text(
        "\n".join(l.split("\t", 1)[1] for l in (FIXTURES / "llama-bench-q4_k_m.stdout.tsv").read_text().splitlines())
        + "\n"
    )
    p = devicelab("import-bench", src, "--device", "laptop", "--lab-dir", tmp_path, check=True)
    assert "imported 4 rows" in p.stdout
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path)).rows_frame(recipe="imported")
    assert set(rows.metric) == {"prefill_tps", "decode_tps", "test_seconds"}
    assert (rows.device == "laptop").all() and rows.bpw.iloc[0] == pytest.approx(103668480 * 8 / 134515008)
