"""The devicelab harness (device_payloads/harness/): one executable carrying llama.cpp's own tools, built here for
Linux (the suite runs it) and, on a Mac, as an iOS app. Linux builds are cached like other builds, keyed by
(commit, target, flags, compiler, the harness's sources); the iOS command lines are pure functions the Mac's
build reuses (its cache lives on the Mac)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import paths
from ..errors import DevicelabError
from . import cache
from .source import SourceTree
from .targets import COMMON_FLAGS, Target, check_toolchain, local_native

BINARY = "devicelab-harness"
APP_EXECUTABLE = BINARY  # the executable inside devicelab-harness.app
# the llama.cpp tools it carries from the pinned tree (`devicelab-harness tools` prints them)
TOOLS = ("llama-bench", "llama-perplexity", "llama-batched-bench", "llama-server")
IOS_MIN_FALLBACK = "16.4"  # where a tree has no build-xcframework.sh


@dataclass(frozen=True)
class HarnessBuild:
    path: Path  # the devicelab-harness binary
    sha256: str
    manifest: dict

    @property
    def key(self) -> str:
        return self.manifest["key"]

    def provenance(self) -> dict:
        m = self.manifest
        return {**cache.build_provenance(m), "harness_version": m["harness_sources"], "harness_sha256": m["sha256"]}


def harness_dir() -> Path:
    """The harness's CMake project (the repo's device_payloads/harness)."""
    return paths.device_payloads_dir() / "harness"


def source_files(root: Path | None = None) -> list[Path]:
    """Every file of the harness project (hidden files and folders left out), sorted by relative path."""
    root = root or harness_dir()
    files = [
        p for p in root.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.relative_to(root).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def sources_hash(root: Path | None = None) -> str:
    """16 hex characters naming the harness's sources; CMakeLists.txt computes the same (the binary's
    harness.version): sha256 over 'RELPATH:SHA256HEX\\n' of each file, in sorted order."""
    root = root or harness_dir()
    acc = "".join(
        f"{p.relative_to(root).as_posix()}:{hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in source_files(root)
    )
    return hashlib.sha256(acc.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the Linux build, here
def linux_target() -> Target:
    """The harness is built for this host with the same flags as the host's own build (ccache shares them)."""
    return local_native()


def build_key(src: SourceTree, t: Target) -> tuple[str, dict]:
    ident = {
        "what": BINARY,
        "commit": src.commit,
        "dirty": src.dirty,
        "target": t.name,
        "flags": cache.build_flags(src, t),
        "compiler": cache.compiler_id(t),
        "harness_sources": sources_hash(),
    }
    if t.flags.get("GGML_NATIVE") == "ON" and t.where == "host":
        ident["host_cpu_features"] = hashlib.sha256(" ".join(cache.cpu_features()).encode()).hexdigest()[:16]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16], ident


def build_dir_for(src: SourceTree, t: Target, key: str) -> Path:
    return paths.sub("builds") / f"harness-{t.name}-{src.short}-{key}"


def llama_binary_dir(d: Path) -> Path:
    """llama.cpp's part of a harness build: beside it, at the depth of a plain build's folders, so the compile
    commands (relative to CCACHE_BASEDIR) are those of the host's own build and ccache hits them."""
    return d.parent / f"{d.name}-llama"


def find_linux(src: SourceTree) -> HarnessBuild | None:
    t = linux_target()
    key, _ = build_key(src, t)
    d = build_dir_for(src, t, key)
    man = d / cache.MANIFEST
    if man.exists() and (d / BINARY).exists():
        m = json.loads(man.read_text())
        return HarnessBuild(d / BINARY, m["sha256"], m)
    return None


def ensure_linux(
    src: SourceTree, jobs: int | None = None, progress: Callable[[float, str], None] | None = None
) -> HarnessBuild:
    """The Linux harness for the pinned tree, cached by (commit, target, flags, compiler, harness sources): a hit
    starts no cmake. Two processes asking at once take turns on a lock file; the second finds the first's build."""
    import fcntl

    hit = find_linux(src)
    if hit:
        return hit
    t = linux_target()
    key, ident = build_key(src, t)
    d = build_dir_for(src, t, key)
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f".{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return find_linux(src) or _build_linux(src, t, key, ident, d, jobs, progress)


def _build_linux(src: SourceTree, t: Target, key: str, ident: dict, d: Path, jobs, progress) -> HarnessBuild:
    check_toolchain(t)
    cache.check_disk("the harness build")
    d.mkdir(parents=True, exist_ok=True)
    env, launcher = cache.compile_env()
    defs = {
        "DEVICELAB_LLAMA_SRC": str(cache.source_link(llama_binary_dir(d), src.path)),
        "DEVICELAB_LLAMA_BINARY_DIR": str(llama_binary_dir(d)),
        **cache.build_flags(src, t),
        **launcher,
    }
    configure = ["cmake", "-S", str(harness_dir()), "-B", str(d)] + [f"-D{k}={v}" for k, v in defs.items()]
    compile_ = ["cmake", "--build", str(d), "-j", str(jobs or os.cpu_count() or 2), "--target", BINARY]
    log = d / "build.log"
    seconds = cache.run_cmake(configure, compile_, log, env, progress, "harness")
    exe = d / BINARY
    if not exe.exists():
        raise DevicelabError(f"the harness build finished but {exe} is missing; see {log}")
    tools = subprocess.run([str(exe), "tools"], capture_output=True, text=True, timeout=60).stdout.split()
    digest = hashlib.sha256(exe.read_bytes()).hexdigest()
    manifest = {
        **cache.manifest_base(key, ident, src, configure, compile_, launcher, seconds),
        "harness_dir": str(harness_dir()),
        "tools": tools,
        "sha256": digest,
    }
    (d / cache.MANIFEST).write_text(json.dumps(manifest, indent=1))
    return HarnessBuild(exe, digest, manifest)


# ---------------------------------------------------------------- the iOS build, on a Mac (pure)
def ios_deployment_target(llama_tree: Path) -> str:
    """The minimum iOS the pinned tree builds for: IOS_MIN_OS_VERSION in its build-xcframework.sh."""
    f = Path(llama_tree) / "build-xcframework.sh"
    m = re.search(r"^IOS_MIN_OS_VERSION=([\d.]+)\s*$", f.read_text(), re.M) if f.is_file() else None
    return m.group(1) if m else IOS_MIN_FALLBACK


def ios_flags(bundle_id: str, team_id: str, metal: bool, deployment_target: str) -> dict[str, str]:
    """Every -D of the iOS configure (also what a Mac-side cache is keyed on): the lab's offline-safe flags and
    build-xcframework.sh's device build (arm64, iphoneos, no OpenMP, not native), Metal on or off."""
    out = dict(COMMON_FLAGS)
    out.update(
        {
            "CMAKE_SYSTEM_NAME": "iOS",
            "CMAKE_OSX_SYSROOT": "iphoneos",
            "CMAKE_OSX_ARCHITECTURES": "arm64",
            "CMAKE_OSX_DEPLOYMENT_TARGET": deployment_target,
            "CMAKE_XCODE_ATTRIBUTE_SUPPORTED_PLATFORMS": "iphoneos",
            "CMAKE_XCODE_ATTRIBUTE_DEVELOPMENT_TEAM": team_id,
            "GGML_NATIVE": "OFF",
            "GGML_OPENMP": "OFF",
            "GGML_METAL": "ON" if metal else "OFF",
            "GGML_METAL_EMBED_LIBRARY": "ON",
            "GGML_METAL_TARGET_OS": "ios",
            "MTMD_VIDEO": "OFF",
            "DEVICELAB_BUNDLE_ID": bundle_id,
            "DEVICELAB_TEAM_ID": team_id,
        }
    )
    return out


def ios_cmake_argv(
    src_dir: str,
    build_dir: str,
    bundle_id: str,
    team_id: str,
    metal: bool,
    deployment_target: str,
    *,
    harness_dir: str,
) -> list[str]:
    """The configure command on the Mac: `src_dir` is the pinned llama.cpp tree there, `harness_dir` its copy of
    device_payloads/harness, `build_dir` the Xcode build folder."""
    flags = ios_flags(bundle_id, team_id, metal, deployment_target)
    return [
        "cmake",
        "-S",
        harness_dir,
        "-B",
        build_dir,
        "-G",
        "Xcode",
        f"-DDEVICELAB_LLAMA_SRC={src_dir}",
        *[f"-D{k}={v}" for k, v in flags.items()],
    ]


def ios_build_argv(build_dir: str) -> list[str]:
    """The build command on the Mac (Xcode signs with the team's automatic provisioning)."""
    return ["cmake", "--build", build_dir, "--config", "Release", "--", "-allowProvisioningUpdates"]


def ios_app_path(build_dir: str) -> str:
    return f"{build_dir}/Release-iphoneos/{BINARY}.app"
