"""One description per build target: toolchain, CMake flags, CPU architecture.

Only data and pure functions live here, so every target's build plan can be unit-tested on a machine
that lacks its toolchain (NDK, Xcode)."""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DevicelabError

# the tools the lab runs; llama-completion is the non-interactive generator (llama-cli became a chat UI)
TOOLS = (
    "llama-bench",
    "llama-perplexity",
    "llama-quantize",
    "llama-server",
    "llama-completion",
    "llama-batched-bench",
    "llama-imatrix",
    "llama-export-lora",
    "llama-gguf-split",
)

# what a device needs (quantizing and KLD base logits happen on the host): every tool a payload kind runs
# there, so one build per target serves every recipe
DEVICE_TOOLS = ("llama-bench", "llama-perplexity", "llama-server", "llama-batched-bench")

# flags every target gets: offline-safe (no web UI download, no HTTPS), no tests/examples, static libs
COMMON_FLAGS = {
    "CMAKE_BUILD_TYPE": "Release",
    "LLAMA_USE_PREBUILT_UI": "OFF",
    "LLAMA_BUILD_UI": "OFF",
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_APP": "OFF",
    "BUILD_SHARED_LIBS": "OFF",
}


@dataclass(frozen=True)
class Target:
    name: str  # e.g. "x86_64-linux-native"
    os: str  # linux | android | darwin
    arch: str  # x86_64 | aarch64 | arm64
    # "host" (built here) | "device" (built on the device over its transport) | "transport" (made through the
    # device's transport: the iPhone's app, built and signed on its Mac and installed over devicectl, build/ios.py)
    where: str
    flags: dict = field(default_factory=dict)
    toolchain: str = "system"  # human description recorded in the manifest
    tools: tuple = TOOLS
    runner: tuple = ()  # how to run its binaries here (e.g. qemu-aarch64-static), for tests

    def cmake_flags(self) -> dict:
        out = dict(COMMON_FLAGS)
        out.update(self.flags)
        return out


# ggml's AMX kernels (compiled in by -march=native wherever the CPU has AMX) crash on quantized models at the
# pinned commit: SIGSEGV in ggml_backend_amx_mul_mat on SmolLM2 q4_0 and q8_0 on a Xeon with amx_int8 (seen here,
# while AMX itself ran a tile multiply correctly), as in llama.cpp issue #20824 (open, unfixed) and dspy PR #10079
# (which removed ggml's AMX variant from its CI for the same crash). Explicit -mno-* flags win over -march=native.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def host_cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def local_native() -> Target:
    """This host's own build (-march=native), without ggml's AMX kernels where the CPU has AMX (see NO_AMX)."""
    arch = platform.machine().lower()
    system = platform.system().lower()
    # position-independent objects: besides its static tools, the same objects link into the libllama.so that
    # llama-cpp-python loads for the host log-likelihood route (build/library.py), so llama.cpp compiles once here
    flags = {"GGML_NATIVE": "ON", "CMAKE_POSITION_INDEPENDENT_CODE": "ON"}
    if system == "darwin":
        flags["GGML_METAL"] = "ON"
    if "amx_int8" in host_cpu_flags():
        flags.update(CMAKE_C_FLAGS=NO_AMX, CMAKE_CXX_FLAGS=NO_AMX)
    return Target(
        name=f"{arch}-{system}-native",
        os=system,
        arch=arch,
        where="host",
        flags=flags,
        toolchain=os.environ.get("CC", "cc"),
    )


def arm_arch_flag(cpu_features: set[str]) -> str:
    """GGML_CPU_ARM_ARCH for a board/phone from its /proc/cpuinfo 'Features' (asimddp=dotprod, i8mm, sve).

    The features ggml's CPU backend compiles for (ggml-cpu/CMakeLists.txt, its GGML_CPU_ALL_VARIANTS table): DOTPROD
    (+dotprod), FP16_VECTOR_ARITHMETIC (+fp16), SVE (+sve), MATMUL_INT8 (+i8mm), each only where the kernel's
    hwcaps list it; armv8.2-a is the first architecture that has any of them. What the kernel does not list is left
    out even where the core has it: a Snapdragon 845's 4.9 kernel predates the asimddp hwcap (safe to leave out);
    a Snapdragon 8+ Gen 1 whose kernel leaves SVE off raises SIGILL on SVE code (llama.cpp#402)."""
    arch = "armv8.2-a" if {"asimddp", "i8mm", "sve", "asimdhp"} & cpu_features else "armv8-a"
    ext = []
    if "asimddp" in cpu_features:
        ext.append("dotprod")
    if "i8mm" in cpu_features:
        ext.append("i8mm")
    if "sve" in cpu_features:
        ext.append("sve")
    if "asimdhp" in cpu_features and arch != "armv8-a":
        ext.append("fp16")
    return "+".join([arch, *ext])


def aarch64_cross_static(cpu_features: set[str] | None = None) -> Target:
    """Static aarch64 Linux build with Debian's gcc-aarch64-linux-gnu; runs on boards and on Android's kernel.
    OpenMP off: libgomp cannot be linked statically."""
    flags = {
        "CMAKE_SYSTEM_NAME": "Linux",
        "CMAKE_SYSTEM_PROCESSOR": "aarch64",
        "CMAKE_C_COMPILER": "aarch64-linux-gnu-gcc",
        "CMAKE_CXX_COMPILER": "aarch64-linux-gnu-g++",
        "CMAKE_EXE_LINKER_FLAGS": "-static",
        "GGML_NATIVE": "OFF",
        "GGML_OPENMP": "OFF",
        "LLAMA_SUBPROCESS": "OFF",
        "GGML_CPU_ARM_ARCH": arm_arch_flag(cpu_features or set()),
    }
    return Target(
        name=f"aarch64-linux-static-{flags['GGML_CPU_ARM_ARCH'].replace('+', '_')}",
        os="linux",
        arch="aarch64",
        where="host",
        flags=flags,
        toolchain="aarch64-linux-gnu-gcc",
        tools=DEVICE_TOOLS,
        runner=("qemu-aarch64-static",),
    )


def android_ndk(ndk: Path, cpu_features: set[str] | None = None, platform_level: int = 28) -> Target:
    """arm64-v8a build with the NDK's CMake toolchain, as llama.cpp's docs/android.md describes."""
    flags = {
        "CMAKE_TOOLCHAIN_FILE": str(Path(ndk) / "build" / "cmake" / "android.toolchain.cmake"),
        "ANDROID_ABI": "arm64-v8a",
        "ANDROID_PLATFORM": f"android-{platform_level}",
        "GGML_NATIVE": "OFF",
        "GGML_OPENMP": "OFF",
        "GGML_LLAMAFILE": "OFF",
        "GGML_CPU_ARM_ARCH": arm_arch_flag(cpu_features or set()),
    }
    return Target(
        name="arm64-v8a-android",
        os="android",
        arch="aarch64",
        where="host",
        flags=flags,
        toolchain=f"ndk:{ndk}",
        tools=DEVICE_TOOLS,
    )


def find_ndk() -> Path | None:
    for var in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT", "ANDROID_NDK"):
        v = os.environ.get(var)
        if v and (Path(v) / "build" / "cmake" / "android.toolchain.cmake").exists():
            return Path(v)
    return None


def macos_metal() -> Target:
    """Native build on a Mac over SSH, Metal backend with the shaders embedded in the binary."""
    return Target(
        name="arm64-darwin-metal",
        os="darwin",
        arch="arm64",
        where="device",
        flags={"GGML_NATIVE": "ON", "GGML_METAL": "ON", "GGML_METAL_EMBED_LIBRARY": "ON"},
        toolchain="xcode clang (on the Mac)",
        tools=DEVICE_TOOLS,
    )


def native_on_device(arch: str, system: str = "linux") -> Target:
    """Built on the board itself over SSH (cross_build: false): -march=native of the board's own CPU."""
    return Target(
        name=f"{arch}-{system}-native-device",
        os=system,
        arch=arch,
        where="device",
        flags={"GGML_NATIVE": "ON"},
        toolchain="the device's cc",
        tools=DEVICE_TOOLS,
    )


def by_name(name: str, cpu_features: set[str] | None = None) -> Target:
    """Targets a user can name on the command line."""
    if name in ("local", "native"):
        return local_native()
    if name.startswith("aarch64"):
        return aarch64_cross_static(cpu_features)
    if name.startswith("android"):
        ndk = find_ndk()
        if ndk is None:
            raise DevicelabError("no Android NDK found: set ANDROID_NDK_HOME to an NDK (r26 or newer)")
        return android_ndk(ndk, cpu_features)
    raise DevicelabError(f"unknown target {name!r}; use local, aarch64 or android")


def check_toolchain(t: Target) -> None:
    if t.where != "host":
        return
    need = ["cmake"]
    if "CMAKE_C_COMPILER" in t.flags:
        need.append(t.flags["CMAKE_C_COMPILER"])
    else:
        need.append(os.environ.get("CC", "cc"))
    for exe in need:
        if shutil.which(exe) is None:
            pkg = {"cmake": "cmake", "aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"}.get(
                exe, "build-essential"
            )
            raise DevicelabError(f"{exe} not found on PATH; install it (Debian: apt-get install {pkg})")
