"""`devicelab predict`'s model side, without a lab: a described model's KV cache and weights against figures real
llama.cpp users printed, a real GGUF's header, and bad input in one line each. (Predictions against what a lab
measured: test_quality.py, on the two-model lab.)"""

from __future__ import annotations

import pytest
from conftest import devicelab

from devicelab import predict as pr
from devicelab.errors import DevicelabError
from devicelab.models import gguf_info

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
        (["hf:bartowski/Llama-3.2-1B-Instruct-GGUF"], "reading a hub file's header is not supported yet"),
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
