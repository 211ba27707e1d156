"""Models the way users hold them: a tiny Llama checkpoint made here (random weights, BF16 safetensors, a
SentencePiece tokenizer trained on a local text), converted with the pinned source's convert_hf_to_gguf.py,
quantized into a ladder with an importance matrix and two i-quants, and run through bench and KLD in a real
`devicelab run`; a PEFT LoRA adapter on it, converted with convert_lora_to_gguf.py and merged with
llama-export-lora; and a tokenizer the converter refuses, as one line."""

import json

import pytest
from conftest import devicelab

pytest.importorskip("torch", reason="needs the [convert] extra: pip install -e '.[convert]'")
pytest.importorskip("peft", reason="needs the [convert] extra: pip install -e '.[convert]'")
import tinyllama

from devicelab.ledger import ledger_path

pytestmark = pytest.mark.e2e

RECIPE = """
name: tiny-ft
devices: [local]
models:
  - {{name: tiny, source: '{ck}', imatrix: {{text: calib.txt, chunks: 2, ctx: 128}}}}
  - {{name: tiny-ft, source: '{ck}', lora: '{lora}', imatrix: {{text: calib.txt, chunks: 2, ctx: 128}}}}
quants: [bf16, q8_0, iq4_xs, iq3_s]
payloads:
  - {{kind: bench, prompt: [16], gen: [8], threads: [2], repetitions: 1}}
  - {{kind: kld, ctx: 128, chunks: 2, host_check: false, text: calib.txt}}
recommend: {{context: 256, max_kld_mean: 5, max_ppl_ratio: 10, min_decode_tps: 0}}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, source):
    d = tmp_path_factory.mktemp("tiny")
    text = d / "calib.txt"
    text.write_text((source.path / "docs" / "build.md").read_text())
    ck = tinyllama.make_llama(d / "ck", text)
    lora = tinyllama.make_lora(ck, d / "lora")
    return d, text, ck, lora


def test_checkpoint_imatrix_iquants_and_lora_in_a_real_run(tiny, host_build):
    d, text, ck, lora = tiny
    recipe = d / "tiny.yaml"
    recipe.write_text(RECIPE.format(ck=ck, lora=lora))
    p = devicelab("run", recipe, "--lab-dir", d / "lab", timeout=3600)
    assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(d / "lab")).rows_frame()
    assert set(rows.model) == {"tiny", "tiny-ft"} and set(rows.quant) == {"bf16", "q8_0", "iq4_xs", "iq3_s"}
    dec = rows[rows.metric == "decode_tps"]
    assert len(dec) == 8 and (dec.value > 0).all()
    kld = rows[rows.metric == "kld_mean"].set_index(["model", "quant"]).value
    assert kld[("tiny", "bf16")] < 1e-4 and kld[("tiny", "iq3_s")] > kld[("tiny", "q8_0")] > 0
    # the i-quants are what they say (the real tensor types), made with the importance matrix of calib.txt
    types = {q: json.loads(t) for q, t in rows[rows.model == "tiny"].groupby("quant").tensor_types.first().items()}
    assert "IQ3_S" in types["iq3_s"] and "IQ4_XS" in types["iq4_xs"]
    im = rows[(rows.quant == "iq3_s")].imatrix.map(json.loads)
    assert all(x["text"] == "calib.txt" and x["chunks"] == 2 for x in im)
    # the checkpoint's own BF16 is its base, made with none (the merged fine-tune's base is llama-export-lora's
    # F16: its bf16 is a quantization of that, with the matrix)
    assert rows[(rows.model == "tiny") & (rows.quant == "bf16")].imatrix.isna().all()
    # where each model came from: the checkpoint, converted by the pinned source; the fine-tune's adapter
    src = rows.groupby("model").model_source.first().map(json.loads)
    assert src["tiny"]["kind"] == "checkpoint" and "lora" not in src["tiny"]
    assert src["tiny-ft"]["lora"]["spec"] == str(lora)
    # the merged model is another model: its logits differ measurably from the base's (llama-cpp-python calling the
    # host build's own library, as the host eval route does: CI installs it without one of its own)
    from devicelab.build import library

    Llama = library.load(library.ensure(host_build)).Llama

    files = {m: rows[(rows.model == m) & (rows.quant == "bf16")].model_sha256.iloc[0] for m in ("tiny", "tiny-ft")}
    assert files["tiny"] != files["tiny-ft"]
    from devicelab import paths

    logits = {}
    for m in ("tiny", "tiny-ft"):
        (f,) = [
            x
            for x in paths.sub("models").glob(f"{m}/*/{m}-*.gguf")
            if json.loads(x.with_name(x.name + ".devicelab.json").read_text())["sha256"] == files[m]
        ]
        llm = Llama(model_path=str(f), n_ctx=64, logits_all=True, verbose=False)
        toks = llm.tokenize(b"The build uses cmake and a compiler.")
        llm.eval(toks)
        logits[m] = llm.scores[: len(toks)].copy()
    import numpy as np

    diff = np.abs(logits["tiny"] - logits["tiny-ft"]).max()
    assert diff > 0.05, diff


def test_a_tokenizer_the_converter_refuses_is_one_line(tiny, tmp_path):
    d, text, ck, _ = tiny
    bad = tinyllama.make_bytelevel_bpe(tmp_path / "bpe", text, ck)
    p = devicelab("model", "info", bad)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert "cannot take this checkpoint" in lines[0] and "BPE pre-tokenizer was not recognized" in lines[0]


def test_a_checkpoint_and_an_adapter_from_the_hub_cache(tiny, tmp_path, host_build):
    """hf: repos of safetensors (a checkpoint, a LoRA adapter) resolved offline from a cache laid out as
    huggingface_hub lays it out (the hub cannot be reached here), converted; the commit in the provenance."""
    from huggingface_hub.file_download import repo_folder_name
    from test_hub import _put

    from devicelab.models import store

    d, text, ck, lora = tiny
    root = tmp_path / "hub"
    commit = "3" * 40
    for repo, folder in (("devicelab-test/tiny-llama", ck), ("devicelab-test/tiny-lora", lora)):
        storage = root / repo_folder_name(repo_id=repo, repo_type="model")
        for f in folder.iterdir():
            _put(storage, commit, f.name, f)
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / "main").write_text(commit)
    env = {"HF_HUB_CACHE": str(root), "HF_HUB_OFFLINE": "1"}
    p = devicelab("model", "info", "hf:devicelab-test/tiny-llama", "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["arch"] == "llama"
    import huggingface_hub.constants as c

    old = c.HF_HUB_CACHE, c.HF_HUB_OFFLINE
    c.HF_HUB_CACHE, c.HF_HUB_OFFLINE = str(root), True
    try:
        ms = store.resolve_model("hf:devicelab-test/tiny-llama")
        folder, prov = store.resolve_adapter("hf:devicelab-test/tiny-lora")
    finally:
        c.HF_HUB_CACHE, c.HF_HUB_OFFLINE = old
    assert ms.provenance["kind"] == "hf-checkpoint" and ms.provenance["commit"] == commit
    assert ms.checkpoint.name == commit and (folder / "adapter_config.json").exists() and prov["commit"] == commit
    # the same content as the local folder: converted once, the same GGUF
    assert ms.path == store.resolve_model(str(ck)).path
