"""The real llama.cpp Vulkan backend on this machine, on Mesa's lavapipe (a software Vulkan device, which ggml
hides unless GGML_VK_VISIBLE_DEVICES=0: set here as a user would for any hidden device): a local Vulkan build,
bench and KLD at 0 and all layers beside the CPU build, rows naming the device, and CPU-vs-Vulkan in the
recommendation. Needs glslc, Mesa's Vulkan drivers and Vulkan headers ≥ 1.3.261 (Debian 12's are older:
.ci/vulkan-headers.sh fetches Debian 13's, and DEVICELAB_VULKAN_INCLUDE_DIR points the build at them)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import devicelab

from devicelab.ledger import ledger_path


def _lavapipe() -> bool:
    if not shutil.which("vulkaninfo"):
        return False
    r = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True, timeout=60)
    return "llvmpipe" in r.stdout


HEADERS = os.environ.get("DEVICELAB_VULKAN_INCLUDE_DIR", "/usr/include")
NEW_ENOUGH = (
    os.path.exists(os.path.join(HEADERS, "vulkan", "vulkan.hpp"))
    and "LayerSettingEXT" in Path(HEADERS, "vulkan", "vulkan_structs.hpp").read_text(errors="replace")
    if os.path.exists(os.path.join(HEADERS, "vulkan", "vulkan_structs.hpp"))
    else False
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.builds("vulkan"),
    pytest.mark.skipif(
        not (shutil.which("glslc") and _lavapipe() and NEW_ENOUGH),
        reason="needs glslc, Mesa's lavapipe (mesa-vulkan-drivers, vulkan-tools) and Vulkan headers ≥ 1.3.261 "
        "(DEVICELAB_VULKAN_INCLUDE_DIR; .ci/vulkan-headers.sh)",
    ),
]

RECIPE = """
name: gpu
devices: [local]
backends: [cpu, vulkan]
models: [{name: smollm2-135m}]
quants: [q8_0]
payloads:
  - {kind: bench, prompt: [8], gen: [4], threads: [2], repetitions: 1, n_gpu_layers: [0, 99]}
  - {kind: kld, ctx: 128, chunks: 2, n_gpu_layers: [99], host_check: true}
recommend: {context: 512, max_kld_mean: 1, min_decode_tps: 0}
"""


def test_cpu_and_vulkan_on_lavapipe(tmp_path, host_build, smol_path):
    recipe = tmp_path / "gpu.yaml"
    recipe.write_text(RECIPE)
    p = devicelab("run", recipe, "--lab-dir", tmp_path / "lab", env={"GGML_VK_VISIBLE_DEVICES": "0"}, timeout=3600)
    assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame()
    dec = rows[rows.metric == "decode_tps"]
    assert set(dec.backend) == {"cpu", "vulkan"} and (dec.value > 0).all()
    vk, cpu = dec[dec.backend == "vulkan"], dec[dec.backend == "cpu"]
    # the device that did the work, by name, at 0 and at all layers; none on the CPU build
    assert vk.gpu_device.str.contains("llvmpipe").all() and cpu.gpu_device.isna().all()
    assert sorted(vk.n_gpu_layers.astype(int)) == [0, 99] and len(cpu) == 2
    assert vk.target.str.endswith("-vulkan").all() and json.loads(vk.build_flags.iloc[0])["GGML_VULKAN"] == "ON"
    # KLD per backend, and the Vulkan path's logits against the host's CPU logits of the same file
    kld = rows[rows.metric == "kld_mean"]
    assert set(kld.backend) == {"cpu", "vulkan"}
    dh = rows[(rows.metric == "devhost_kld_mean") & (rows.backend == "vulkan")]
    assert len(dh) == 1 and dh.value.iloc[0] < 0.05 and "llvmpipe" in dh.gpu_device.iloc[0]
    # layers offloaded as llama-perplexity logged them (SmolLM2: 30 blocks + output), or as asked where its log
    # lines were lost at exit (upstream issue 22142)
    assert kld[kld.backend == "vulkan"].n_gpu_layers.astype(int).tolist() in ([31], [99])
    assert kld[kld.backend == "vulkan"].gpu_device.str.contains("llvmpipe").all()
    rec = json.loads(
        devicelab("recommend", "--lab-dir", tmp_path / "lab", "--recipe", recipe, "--json", check=True).stdout
    )[0]
    lines = rec["backends"]
    assert lines and lines[0].startswith("smollm2-135m q8_0: ") and "wins" in lines[0]
    loser = "vulkan" if lines[0].endswith("cpu wins") else "cpu"
    assert any(x.strip().startswith(f"{loser}: q8_0 decode ") and "×" in x for x in lines[1:])
    assert {c["backend"] for c in rec["candidates"]} == {"cpu", "vulkan"}
    out = tmp_path / "r.html"
    devicelab("report", "--lab-dir", tmp_path / "lab", "--recipe", recipe, "-o", out, check=True)
    html = out.read_text()
    assert "backends: smollm2-135m q8_0: " in html and "<td>vulkan</td>" in html


def test_a_hidden_device_skips_the_backend_with_the_reason(tmp_path, host_build, smol_path):
    """Without GGML_VK_VISIBLE_DEVICES ggml hides lavapipe: the Vulkan cells are skipped, saying so."""
    recipe = tmp_path / "gpu.yaml"
    recipe.write_text(
        RECIPE.replace("backends: [cpu, vulkan]", "backends: [vulkan]").split("  - {kind: kld")[0]
        + "recommend: {context: 512, max_kld_mean: 1, min_decode_tps: 0}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    p = subprocess.run(
        [sys.executable, "-m", "devicelab.cli", "run", recipe, "--lab-dir", tmp_path / "lab"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    import sqlite3

    got = sqlite3.connect(ledger_path(tmp_path / "lab")).execute("SELECT status, error FROM cells").fetchall()
    assert len(got) == 2 and all(st == "skipped" and "sees no vulkan device" in err for st, err in got), got
