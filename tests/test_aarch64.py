"""The aarch64 cross-build (Debian's gcc-aarch64-linux-gnu, static, OpenMP off) is built and really run
on SmolLM2 under qemu-aarch64-static — standalone and as a lab device whose binaries run through qemu
(an emulated board: the binaries and the model are the real ones, the CPU is QEMU's)."""

import json
import shutil
import struct
import subprocess

import pytest
from conftest import devicelab

from devicelab.build import cache, targets
from devicelab.ledger import ledger_path
from devicelab.models.ladder import Ladder

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64-static")),
        reason="needs gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu and qemu-user-static",
    ),
]
FEATURES = "fp asimd asimddp"


@pytest.fixture(scope="module")
def arm_build(source):
    return cache.ensure(source, targets.aarch64_cross_static(set(FEATURES.split())))


def elf_info(path):
    b = path.read_bytes()
    assert b[:4] == b"\x7fELF"
    machine = struct.unpack_from("<H", b, 18)[0]
    (phoff,) = struct.unpack_from("<Q", b, 32)
    phentsize, phnum = struct.unpack_from("<HH", b, 54)
    types = [struct.unpack_from("<I", b, phoff + i * phentsize)[0] for i in range(phnum)]
    return machine, 3 in types  # 183 = EM_AARCH64; PT_INTERP (3) only in dynamic executables


def test_static_aarch64_binaries(arm_build):
    for tool in ("llama-bench", "llama-perplexity"):
        machine, dynamic = elf_info(arm_build.tool(tool))
        assert machine == 183 and not dynamic
    assert arm_build.manifest["flags"]["GGML_CPU_ARM_ARCH"] == "armv8.2-a+dotprod"


def test_bench_runs_under_qemu(arm_build, host_build, smol_path):
    model = Ladder("smollm2-135m", smol_path, host_build.tool("llama-quantize")).quant("q4_0").path
    p = subprocess.run(
        [
            "qemu-aarch64-static",
            str(arm_build.tool("llama-bench")),
            "-m",
            str(model),
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-t",
            "2",
            "-o",
            "jsonl",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    recs = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert {r["n_gen"] for r in recs} == {0, 4} and all(r["avg_ts"] > 0 for r in recs)
    assert recs[0]["build_commit"].startswith("0c1e57")


def test_lab_run_on_an_emulated_aarch64_board(tmp_path, arm_build, host_build, smol_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "devices:\n  - name: qemu-board\n    transport: local\n    target: aarch64\n"
        f"    cpu_features: '{FEATURES}'\n    exec_prefix: [qemu-aarch64-static]\n"
    )
    recipe = tmp_path / "r.yaml"
    # one quant, the shortest KLD llama-perplexity reports on: under qemu each run costs ~1 min per 128 tokens
    recipe.write_text(
        "name: arm\ndevices: [qemu-board]\nmodels: [{name: smollm2-135m}]\nquants: [q4_0]\n"
        "payloads:\n  - {kind: bench, prompt: [8], gen: [4], threads: [2], repetitions: 1}\n"
        "  - {kind: kld, ctx: 128, chunks: 2}\n"
        "recommend: {context: 512, max_kld_mean: 0.5, max_ppl_ratio: 2}\n"
    )
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame()
    assert rows.target.str.startswith("aarch64-linux-static").all()
    assert (rows[rows.metric == "decode_tps"].value > 0).all()
    assert rows[rows.metric == "kld_mean"].value.notna().all()
    # the aarch64 build's logits for the same file against the host's x86 build's: close, measured
    assert rows[rows.metric == "devhost_kld_mean"].value.between(0, 0.01).all()
    assert "qemu-board: ship smollm2-135m" in p.stdout


def test_bandwidth_payload_builds_and_runs_for_aarch64(arm_build):
    from devicelab.build import payloads

    exe = payloads.ensure_c_payload("membw", arm_build)
    machine, dynamic = elf_info(exe)
    assert machine == 183 and not dynamic
    p = subprocess.run(
        ["qemu-aarch64-static", str(exe), "-m", "64", "-r", "2", "-t", "2"], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["read_bytes_per_s"] > 1e7 and r["fma_flops_per_s"] > 1e6 and r["threads"] == 2
