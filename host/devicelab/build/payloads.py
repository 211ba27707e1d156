"""Tiny C payloads (device_payloads/*.c) built per target alongside llama.cpp, cached by
(source sha256, compiler, flags)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from .. import paths
from ..errors import DevicelabError


def _compiler_for(manifest: dict) -> tuple[str, list[str]]:
    flags = manifest["flags"]
    cc = flags.get("CMAKE_C_COMPILER")
    if flags.get("CMAKE_TOOLCHAIN_FILE", "").endswith("android.toolchain.cmake"):
        ndk = Path(flags["CMAKE_TOOLCHAIN_FILE"]).parents[2]
        level = flags.get("ANDROID_PLATFORM", "android-28").split("-")[1]
        clang = next(ndk.glob(f"toolchains/llvm/prebuilt/*/bin/aarch64-linux-android{level}-clang"), None)
        if clang is None:
            raise DevicelabError(f"no aarch64-linux-android{level}-clang in {ndk}")
        return str(clang), ["-O3", f"-march={flags.get('GGML_CPU_ARM_ARCH', 'armv8-a')}"]
    if cc:  # cross
        return cc, ["-O3", f"-march={flags.get('GGML_CPU_ARM_ARCH', 'armv8-a')}", "-static"]
    return "cc", ["-O3", "-march=native"] if flags.get("GGML_NATIVE") == "ON" else ["-O3"]


def ensure_c_payload(name: str, build, what: str = "") -> Path:
    """device_payloads/NAME.c built for a build's target as the executable NAME, cached by (source, compiler,
    flags); `build` is a Build or its manifest. The kind that runs it passes its name (the build knows no kind)."""
    manifest = getattr(build, "manifest", build)
    if manifest.get("where") == "device":
        raise DevicelabError(f"{name} for device-side builds is not supported yet; use a cross or host build")
    src = paths.device_payloads_dir() / f"{name}.c"
    cc, flags = _compiler_for(manifest)
    if shutil.which(cc) is None:
        raise DevicelabError(f"{cc} not found: it builds the {what or name} payload for {manifest['target']}")
    argv = [cc, *flags, "-pthread", "-o"]
    key = hashlib.sha256((src.read_text() + json.dumps(argv)).encode()).hexdigest()[:16]
    out = paths.sub("builds") / f"{name}-{manifest['target']}-{key}" / name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(argv + [str(out), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        raise DevicelabError(f"building {name} for {manifest['target']} failed: {r.stderr.strip()[:300]}")
    return out
