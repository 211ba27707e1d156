"""Build targets and plans that cannot run here (no NDK, no Mac): their flags and command lines."""

import shlex

import pytest

from devicelab.build import remote, targets
from devicelab.build.source import SourceTree
from devicelab.errors import DevicelabError
from devicelab.lab import device_from
from devicelab.runner.session import target_for
from devicelab.transports.base import quote_argv

PI5 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
ORION = PI5 + " sha3 sm3 sm4 asimdfhm i8mm bf16 sve"


def test_arm_arch_from_cpuinfo_features():
    assert targets.arm_arch_flag(set()) == "armv8-a"
    assert targets.arm_arch_flag(set(PI5.split())) == "armv8.2-a+dotprod+fp16"
    assert targets.arm_arch_flag(set(ORION.split())) == "armv8.2-a+dotprod+i8mm+sve+fp16"


def test_aarch64_static_flags():
    t = targets.aarch64_cross_static(set(PI5.split()))
    f = t.cmake_flags()
    assert f["GGML_OPENMP"] == "OFF" and f["CMAKE_EXE_LINKER_FLAGS"] == "-static"
    assert f["CMAKE_C_COMPILER"] == "aarch64-linux-gnu-gcc" and f["GGML_NATIVE"] == "OFF"
    assert f["GGML_CPU_ARM_ARCH"] == "armv8.2-a+dotprod+fp16"
    assert f["LLAMA_USE_PREBUILT_UI"] == "OFF" and f["LLAMA_OPENSSL"] == "OFF"
    assert t.runner == ("qemu-aarch64-static",)


def test_android_ndk_plan(tmp_path):
    t = targets.android_ndk(tmp_path / "ndk", set(ORION.split()))
    f = t.cmake_flags()
    assert f["CMAKE_TOOLCHAIN_FILE"] == str(tmp_path / "ndk/build/cmake/android.toolchain.cmake")
    assert (f["ANDROID_ABI"], f["ANDROID_PLATFORM"]) == ("arm64-v8a", "android-28")
    assert f["GGML_OPENMP"] == "OFF" and f["GGML_LLAMAFILE"] == "OFF"
    assert f["GGML_CPU_ARM_ARCH"] == "armv8.2-a+dotprod+i8mm+sve+fp16"


def test_android_target_without_ndk_is_one_line(monkeypatch):
    for v in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT", "ANDROID_NDK"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(DevicelabError, match="no Android NDK found: set ANDROID_NDK_HOME"):
        targets.by_name("android")


def test_macos_metal_remote_build_plan():
    t = targets.macos_metal()
    p = remote.plan("/Users/me/.cache/devicelab-device/src/0c1e57098bba", "/Users/me/b d/cmake", t, 10)
    assert p[0][:2] == ["tar", "-xzf"]
    configure = p[1]
    assert configure[:3] == ["cmake", "-S", "/Users/me/.cache/devicelab-device/src/0c1e57098bba/llama.cpp"]
    assert "-DGGML_METAL=ON" in configure and "-DGGML_METAL_EMBED_LIBRARY=ON" in configure
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in configure
    assert p[2] == [
        "cmake",
        "--build",
        "/Users/me/b d/cmake",
        "-j",
        "10",
        "--target",
        "llama-bench",
        "llama-perplexity",
        "llama-server",
        "llama-batched-bench",
    ]
    # what reaches the Mac's shell: the path with a space stays one argument
    assert shlex.split(quote_argv(p[2]))[2] == "/Users/me/b d/cmake"


@pytest.mark.parametrize(
    "facts,device,expect",
    [
        (
            {"uname": "Darwin 24.1.0 arm64", "arch": "arm64"},
            device_from({"name": "mac", "transport": "ssh", "host": "m"}),
            "arm64-darwin-metal",
        ),
        (
            {"uname": "Linux 6.6 aarch64", "arch": "aarch64", "cpu.features": PI5},
            device_from({"name": "pi", "transport": "ssh", "host": "p"}),
            "aarch64-linux-static-armv8.2-a_dotprod_fp16",
        ),
        (
            {"uname": "Linux 6.6 aarch64", "arch": "aarch64", "cpu.features": PI5},
            device_from({"name": "pi", "transport": "ssh", "host": "p", "cross_build": False}),
            "aarch64-linux-native-device",
        ),
        (
            {"uname": "Linux 5.10 aarch64", "arch": "aarch64", "cpu.features": ORION},
            device_from({"name": "ph", "transport": "adb"}),
            "aarch64-linux-static-armv8.2-a_dotprod_i8mm_sve_fp16",
        ),
    ],
)
def test_target_chosen_from_device_facts(monkeypatch, facts, device, expect):
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("ANDROID_NDK_ROOT", raising=False)
    from devicelab.transports import open_transport

    assert target_for(open_transport(device), device, facts)[0].name == expect


def test_remote_build_key_changes_with_flags():
    src = SourceTree(path=__import__("pathlib").Path("/x"), commit="0c1e57098bba" + "0" * 28, origin="t")
    a = remote.key_for(src, targets.macos_metal(), "Apple clang 16")
    b = remote.key_for(src, targets.native_on_device("arm64", "darwin"), "Apple clang 16")
    assert a != b and a == remote.key_for(src, targets.macos_metal(), "Apple clang 16")


def test_an_older_tree_builds_without_libcurl(tmp_path):
    """llama-cpp-python ≤ 0.3.16 vendor trees whose LLAMA_CURL defaults ON (their configure then needs libcurl's
    headers: seen with bench/releases.py); the lab builds them with it OFF. A newer tree, where the option is
    deprecated, gets the target's flags alone, so the build keys of the trees the lab built before are kept."""
    from devicelab.build import cache

    old, new = tmp_path / "old", tmp_path / "new"
    lines = {old: 'option(LLAMA_CURL       "llama: use libcurl" ON)', new: "llama_option_depr(WARNING LLAMA_CURL)"}
    for d, line in lines.items():
        d.mkdir()
        (d / "CMakeLists.txt").write_text(f"project(llama)\n{line}\n")
    commit = "0c1e57098bba" + "0" * 28
    t = targets.macos_metal()
    old_src, new_src = SourceTree(old, commit, "t"), SourceTree(new, commit, "t")
    assert cache.build_flags(old_src, t) == {**t.cmake_flags(), "LLAMA_CURL": "OFF"}
    assert cache.build_flags(new_src, t) == t.cmake_flags()
    assert remote.key_for(old_src, t, "cc") != remote.key_for(new_src, t, "cc")
    plan = remote.plan("/s", "/b", t, 4, cache.build_flags(old_src, t))
    assert "-DLLAMA_CURL=OFF" in plan[1] and "-DLLAMA_CURL=OFF" not in remote.plan("/s", "/b", t, 4)[1]


def test_an_older_tree_builds_the_tools_it_defines(tmp_path):
    """A tree from before llama-completion (llama-cpp-python ≤ 0.3.16: `No rule to make target
    'llama-completion'`, seen with bench/releases.py) builds the lab's other tools; a tree whose targets cannot be
    read keeps the list."""
    from devicelab.build import cache

    old = tmp_path / "old"
    for tool in ("llama-bench", "llama-cli", "llama-quantize"):
        d = old / "tools" / tool.removeprefix("llama-")
        d.mkdir(parents=True)
        (d / "CMakeLists.txt").write_text(f"set(TARGET {tool})\nadd_executable(${{TARGET}} main.cpp)\n")
    src = SourceTree(old, "1" * 40, "t")
    assert cache.buildable(src, targets.TOOLS) == ("llama-bench", "llama-quantize")
    assert cache.buildable(SourceTree(tmp_path / "nothing", "2" * 40, "t"), targets.TOOLS) == targets.TOOLS


def test_the_host_build_leaves_out_ggml_amx_kernels_where_the_cpu_has_amx(monkeypatch):
    """ggml's AMX kernels crash on quantized models at the pinned commit (targets.NO_AMX says where it was seen)."""
    monkeypatch.setattr(targets, "host_cpu_flags", lambda: {"avx512f", "avx512_vnni", "amx_tile", "amx_int8"})
    f = targets.local_native().flags
    assert f["GGML_NATIVE"] == "ON" and f["CMAKE_C_FLAGS"] == f["CMAKE_CXX_FLAGS"] == targets.NO_AMX
    monkeypatch.setattr(targets, "host_cpu_flags", lambda: {"avx2", "fma"})
    assert "CMAKE_C_FLAGS" not in targets.local_native().flags  # other hosts: flags (and build keys) unchanged


def test_a_phones_lab_entry_cpu_features_pick_its_build(monkeypatch):
    """A phone's default target (no `target:` in its lab entry) takes the lab file's cpu_features as a board's does,
    so a phone and a board with the same features share one build (before, the phone's came from facts alone)."""
    from types import SimpleNamespace

    from devicelab.runner.session import target_for
    from devicelab.transports.adb import ADBTransport

    monkeypatch.setattr(targets, "find_ndk", lambda: None)
    phone = SimpleNamespace(platform=ADBTransport.platform, name="phone")
    x86_facts = {"cpu.features": "fpu sse2 avx2"}  # a phone peer on this host reads the host's own cpuinfo
    got, _ = target_for(phone, SimpleNamespace(target=None, cpu_features="fp asimd asimddp"), x86_facts)
    board, _ = target_for(phone, SimpleNamespace(target="aarch64", cpu_features="fp asimd asimddp"), x86_facts)
    assert got.name == board.name == "aarch64-linux-static-armv8.2-a_dotprod" and got.flags == board.flags
    bare, _ = target_for(phone, SimpleNamespace(target=None, cpu_features=None), x86_facts)
    assert bare.flags["GGML_CPU_ARM_ARCH"] == "armv8-a"  # no override: what its facts say
