"""GPU backends as build variants: each target's flags per backend, and the one-line reason where a target cannot
have one. Pure plans: the Vulkan build itself runs in test_vulkan.py; no NDK, Mac or CUDA toolkit is here, so
those plans are checked as plans (nvcc and nvidia-smi are stand-ins on PATH, and say so)."""

import stat
from pathlib import Path

import pytest

from devicelab.build import backends, targets
from devicelab.ledger import ledger_path


def _exe(d: Path, name: str, text: str) -> None:
    p = d / name
    p.write_text("#!/bin/sh\n" + text)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def _empty_path(tmp_path: Path) -> tuple[Path, dict]:
    """A PATH holding only what the test puts in it."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    return bin_, {"PATH": str(bin_)}


def test_defaults_and_cpu():
    local = targets.local_native()
    assert backends.default_backend(local) == "cpu" and backends.variant(local, "cpu") is local
    mac = targets.macos_metal()
    assert backends.default_backend(mac) == "metal" and backends.variant(mac, "metal") is mac
    cpu_mac = backends.variant(mac, "cpu")
    assert cpu_mac.flags["GGML_METAL"] == "OFF" and "GGML_METAL_EMBED_LIBRARY" not in cpu_mac.flags
    assert cpu_mac.name == "arm64-darwin-metal-cpu"
    with pytest.raises(backends.NoBackend, match="metal is macOS's"):
        backends.variant(local, "metal")
    with pytest.raises(backends.NoBackend, match="no Vulkan build for macOS"):
        backends.variant(mac, "vulkan")


def test_vulkan_plans(tmp_path):
    bin_, env = _empty_path(tmp_path)
    with pytest.raises(backends.NoBackend, match="glslc, which this host lacks"):
        backends.variant(targets.local_native(), "vulkan", env)
    _exe(bin_, "glslc", "exit 0\n")
    v = backends.variant(targets.local_native(), "vulkan", {**env, "DEVICELAB_VULKAN_INCLUDE_DIR": "/opt/vk/include"})
    assert v.flags["GGML_VULKAN"] == "ON" and v.flags["Vulkan_INCLUDE_DIR"] == "/opt/vk/include"
    assert "GGML_VULKAN_SHADERS_GEN_TOOLCHAIN" not in v.flags  # native: the generator runs here as built
    a = backends.variant(targets.android_ndk(Path("/ndk"), {"asimddp"}), "vulkan", env)
    tc = Path(a.flags["GGML_VULKAN_SHADERS_GEN_TOOLCHAIN"])
    assert a.flags["GGML_VULKAN"] == "ON" and a.name == "arm64-v8a-android-vulkan"
    assert tc.exists() and "CMAKE_CXX_COMPILER" in tc.read_text()  # the host's own compilers
    b = backends.variant(targets.aarch64_cross_static(set()), "vulkan", env)
    assert "GGML_VULKAN_SHADERS_GEN_TOOLCHAIN" in b.flags


def test_opencl_plans():
    a = backends.variant(targets.android_ndk(Path("/ndk"), set()), "opencl", {})
    assert {k: a.flags[k] for k in ("GGML_OPENCL", "GGML_OPENCL_EMBED_KERNELS", "GGML_OPENCL_USE_ADRENO_KERNELS")} == {
        "GGML_OPENCL": "ON",
        "GGML_OPENCL_EMBED_KERNELS": "ON",
        "GGML_OPENCL_USE_ADRENO_KERNELS": "ON",
    }
    x = backends.variant(targets.local_native(), "opencl", {})
    assert x.flags["GGML_OPENCL"] == "ON" and "GGML_OPENCL_USE_ADRENO_KERNELS" not in x.flags


def test_cuda_plans(tmp_path):
    bin_, env = _empty_path(tmp_path)
    with pytest.raises(backends.NoBackend, match="no CUDA toolkit"):
        backends.variant(targets.local_native(), "cuda", env)
    with pytest.raises(backends.NoBackend, match="native Linux builds"):
        backends.variant(targets.android_ndk(Path("/ndk"), set()), "cuda", env)
    # stand-ins: no NVIDIA GPU or CUDA toolkit here. nvidia-smi answers as it does for an H200 and an L40S
    _exe(bin_, "nvcc", "exit 0\n")
    _exe(bin_, "nvidia-smi", 'echo "9.0"\necho "8.9"\n')
    c = backends.variant(targets.local_native(), "cuda", env)
    assert c.flags["GGML_CUDA"] == "ON" and c.flags["CMAKE_CUDA_ARCHITECTURES"] == "89;90"


@pytest.mark.e2e
@pytest.mark.builds("opencl")
@pytest.mark.skipif(
    not Path("/usr/include/CL/cl.h").exists(),
    reason="needs the OpenCL headers and ICD loader (Debian: opencl-headers ocl-icd-opencl-dev)",
)
def test_the_opencl_variant_compiles_here_and_is_skipped_for_want_of_a_device(tmp_path, host_build, smol_path):
    """ggml's OpenCL backend runs only on Adreno and Intel GPUs: this machine has neither, so the variant is
    compiled (x86, Debian's headers and ICD loader) and its cells are skipped, saying so."""
    import sqlite3

    from conftest import devicelab

    recipe = tmp_path / "ocl.yaml"
    recipe.write_text(
        "name: ocl\ndevices: [local]\nbackends: [opencl]\nmodels: [{name: smollm2-135m}]\n"
        "quants: [q8_0]\npayloads:\n  - {kind: bench, prompt: [8], gen: [4], threads: [2], "
        "repetitions: 1, n_gpu_layers: [99]}\n"
    )
    p = devicelab("run", recipe, "--lab-dir", tmp_path / "lab", timeout=3600)
    assert p.returncode == 0, p.stdout + p.stderr
    ((st, err),) = sqlite3.connect(ledger_path(tmp_path / "lab")).execute("SELECT status, error FROM cells")
    assert st == "skipped" and "sees no opencl device" in err and "only on Adreno and Intel GPUs" in err
    import dataclasses

    from devicelab.build import cache, source, targets

    t = dataclasses.replace(
        backends.variant(targets.local_native(), "opencl"), tools=("llama-bench", "llama-perplexity")
    )
    b = cache.find(source.resolve(None), t)
    assert b is not None and b.manifest["flags"]["GGML_OPENCL"] == "ON"
