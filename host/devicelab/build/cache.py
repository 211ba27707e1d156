"""Builds of llama.cpp cached by (source commit, target, flags, compiler), each folder holding the tools asked of
it. An unchanged build is a no-op that does not even start cmake; every build leaves a manifest recording how it
was made."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import paths
from ..errors import DevicelabError
from ..proc import tail
from . import source as sourcemod
from .source import SourceTree
from .targets import Target, check_toolchain, host_cpu_flags

MANIFEST = "devicelab-build.json"
MIN_FREE_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class Build:
    dir: Path
    manifest: dict

    def tool(self, name: str) -> Path:
        return self.dir / "bin" / name

    @property
    def key(self) -> str:
        return self.manifest["key"]

    def provenance(self) -> dict:
        return build_provenance(self.manifest)


def build_provenance(m: dict) -> dict:
    """What every row says of the build it was measured with, from a build's manifest (any kind of build)."""
    return {
        "build_key": m["key"],
        "build_commit": m["commit"],
        "build_target": m["target"],
        "build_flags": m["flags"],
        "build_compiler": m["compiler"],
    }


def compiler_id(t: Target) -> str:
    cc = t.flags.get("CMAKE_C_COMPILER") or os.environ.get("CC", "cc")
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0].strip() if out else cc
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return cc


def cpu_features() -> list[str]:
    return sorted(host_cpu_flags())


def tree_flags(src: SourceTree) -> dict[str, str]:
    """What a llama.cpp tree needs beyond its target's flags: trees before late 2025 default LLAMA_CURL to ON and
    then need libcurl's headers, for downloading models by URL, which the lab never asks llama.cpp to do (newer
    trees deprecate the option, and get nothing here: their build keys are unchanged)."""
    return dict(_tree_flags(str(src.path), src.commit))


@functools.lru_cache(maxsize=64)
def _tree_flags(tree: str, commit: str) -> tuple[tuple[str, str], ...]:
    try:
        text = (Path(tree) / "CMakeLists.txt").read_text(errors="replace")
    except OSError:
        return ()
    return (("LLAMA_CURL", "OFF"),) if re.search(r"^\s*option\(\s*LLAMA_CURL\b", text, re.M) else ()


def build_flags(src: SourceTree, t: Target) -> dict[str, str]:
    """The CMake definitions of a build of this tree for this target."""
    return {**t.cmake_flags(), **tree_flags(src)}


@functools.lru_cache(maxsize=64)
def _defined_targets(tree: str, commit: str) -> frozenset[str]:
    found: set[str] = set()
    for sub in ("tools", "examples"):
        for cm in (Path(tree) / sub).rglob("CMakeLists.txt"):
            found.update(re.findall(r"set\(\s*TARGET\s+([A-Za-z0-9_.-]+)\s*\)", cm.read_text(errors="replace")))
    return frozenset(found)


def buildable(src: SourceTree, tools) -> tuple[str, ...]:
    """The tools of `tools` this tree defines: an older tree lacks newer ones (llama-completion came after
    llama-cpp-python 0.3.16's tree), and a build of it makes the rest; a cell whose kind needs a missing one
    fails naming it. A tree whose targets cannot be read keeps the list."""
    defined = _defined_targets(str(src.path), src.commit)
    return tuple(x for x in tools if x in defined) if defined else tuple(tools)


def build_key(src: SourceTree, t: Target) -> tuple[str, dict]:
    """What makes a build's binaries what they are: the tree, the target, its flags, the compiler (and this CPU for a
    -march=native build). Not which tools it holds: one folder per key collects every tool asked of it, so a lab
    run that needs two tools and one that needs nine share one build (and one llama-bench binary)."""
    ident = {
        "commit": src.commit,
        "dirty": src.dirty,
        "target": t.name,
        "flags": build_flags(src, t),
        "compiler": compiler_id(t),
    }
    if t.flags.get("GGML_NATIVE") == "ON" and t.where == "host":
        # -march=native: the binary depends on this CPU's features
        ident["host_cpu_features"] = hashlib.sha256(" ".join(cpu_features()).encode()).hexdigest()[:16]
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return key, ident


def build_dir_for(t: Target, src: SourceTree, key: str) -> Path:
    return paths.sub("builds") / f"{t.name}-{src.short}-{key}"


def find(src: SourceTree, t: Target, tools=None) -> Build | None:
    """The cached build holding `tools` (the target's own list when None), or None."""
    tools = tools or t.tools
    key, _ = build_key(src, t)
    d = build_dir_for(t, src, key)
    man = d / MANIFEST
    if man.exists() and all((d / "bin" / x).exists() for x in buildable(src, tools)):
        m = json.loads(man.read_text())
        if all(x in m["tools"] for x in buildable(src, tools)):
            return Build(d, m)
    return None


def ensure(
    src: SourceTree,
    t: Target,
    tools=None,
    jobs: int | None = None,
    progress: Callable[[float, str], None] | None = None,
) -> Build:
    """Return the cached build holding `tools`, or configure + build what it lacks now (a build folder asked for
    more tools builds only those: its libraries are made already). Two processes asking for the same build (two
    `devicelab run`s, a test and a run) take turns on a lock file: the second finds the first's build."""
    import fcntl

    tools = tools or t.tools
    hit = find(src, t, tools)
    if hit:
        return hit
    key, _ = build_key(src, t)
    d = build_dir_for(t, src, key)
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f".{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return find(src, t, tools) or _build(src, t, tools, jobs, progress)


def _build(src: SourceTree, t: Target, tools, jobs, progress) -> Build:
    check_toolchain(t)
    key, ident = build_key(src, t)
    d = build_dir_for(t, src, key)
    man = d / MANIFEST
    before = json.loads(man.read_text()) if man.exists() else {}
    had = [x for x in before.get("tools", {}) if (d / "bin" / x).exists()]
    tools = [x for x in buildable(src, tools) if x not in had]
    check_disk("a llama.cpp build")
    d.mkdir(parents=True, exist_ok=True)
    env, launcher = compile_env()
    configure = ["cmake", "-S", str(source_link(d, src.path)), "-B", str(d)]
    configure += [f"-D{k}={v}" for k, v in {**build_flags(src, t), **launcher}.items()]
    compile_ = ["cmake", "--build", str(d), "-j", str(jobs or os.cpu_count() or 2), "--target", *tools]
    log = d / "build.log"
    with sourcemod.checked_out(src):  # a clone's revision: its worktree at this commit while it compiles
        seconds = run_cmake(configure, compile_, log, env, progress)
    missing = [x for x in tools if not (d / "bin" / x).exists()]
    if missing:
        raise DevicelabError(
            f"build finished but {', '.join(missing)} missing in {d / 'bin'}; see {log}",
            detail=tail(log.read_text(errors="replace")),
        )
    made = sorted({*had, *tools})
    manifest = {
        **manifest_base(key, ident, src, configure, compile_, launcher, seconds),
        "cpu_features": cpu_features() if t.where == "host" and not t.runner else [],
        "runner": list(t.runner),
        "tools": {x: hashlib.sha256((d / "bin" / x).read_bytes()).hexdigest() for x in made},
        "build_seconds_total": round(before.get("build_seconds_total", before.get("build_seconds", 0)) + seconds, 1),
    }
    tmp = d / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(d / MANIFEST)  # whole: a run reading it while a second run adds a tool sees one or the other
    return Build(d, manifest)


def check_disk(what: str) -> None:
    free = shutil.disk_usage(paths.home()).free
    if free < MIN_FREE_BYTES:
        raise DevicelabError(
            f"not enough disk for {what}: {free / 1e9:.1f} GB free in {paths.home()}, "
            f"need {MIN_FREE_BYTES / 1e9:.0f} GB; free space or set DEVICELAB_HOME elsewhere"
        )


SOURCE_LINK = "_src"


def source_link(binary_dir: Path, tree: Path) -> Path:
    """The tree as a build compiles it: a symlink inside its binary folder. Every build then names its sources
    `../_src/…` relative to where it compiles (ccache's base_dir makes the paths relative), so a build of another
    folder — bisect's worktree, an older release's tree, a copy — hits ccache for every file that did not change.
    CMake keeps the symlinked path as given; a folder configured from another path starts its cache anew."""
    binary_dir.mkdir(parents=True, exist_ok=True)
    link = binary_dir / SOURCE_LINK
    if link.is_symlink() and Path(os.readlink(link)) != Path(tree):
        link.unlink()
    if not link.is_symlink():
        link.symlink_to(Path(tree), target_is_directory=True)
    cached = binary_dir / "CMakeCache.txt"
    if cached.exists() and f"CMAKE_HOME_DIRECTORY:INTERNAL={link}\n" not in cached.read_text(errors="replace"):
        cached.unlink()  # configured from another path (an earlier layout): CMake refuses to reuse it
    return link


def compile_env() -> tuple[dict, dict]:
    """(the environment, the CMake launcher definitions) of a build: through ccache where it is installed."""
    env = dict(os.environ)
    launcher = {}
    if shutil.which("ccache"):
        launcher = {"CMAKE_C_COMPILER_LAUNCHER": "ccache", "CMAKE_CXX_COMPILER_LAUNCHER": "ccache"}
        env.setdefault("CCACHE_BASEDIR", str(paths.home()))  # stable relative paths → hits across build dirs
        env.setdefault("CCACHE_DIR", str(paths.home() / "ccache"))
        env.setdefault("CCACHE_NOHASHDIR", "1")
    return env, launcher


def run_cmake(configure: list[str], compile_: list[str], log: Path, env: dict, progress, what: str = "") -> float:
    """Configure and build into `log` (its progress to `progress`); the seconds it took."""
    log.write_text("")
    t0 = time.time()
    for step, argv in (("configure", configure), ("build", compile_)):
        _stream(argv, log, env, f"{what} {step}".strip(), progress)
    return round(time.time() - t0, 1)


def manifest_base(key: str, ident: dict, src: SourceTree, configure, compile_, launcher: dict, seconds: float) -> dict:
    """What every build's manifest records of how it was made (any kind of build)."""
    return {
        "key": key,
        **ident,
        "source_path": str(src.path),
        "source_origin": src.origin,
        "cmake_configure": configure,
        "cmake_build": compile_,
        "ccache": bool(launcher),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": seconds,
        "host": platform.node(),
    }


_PCT = re.compile(r"^\[\s*(\d+)%\]")


def _stream(argv: list[str], log: Path, env: dict, step: str, progress) -> None:
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(argv) + "\n")
        fh.flush()
        try:
            p = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, errors="replace"
            )
        except FileNotFoundError as e:
            raise DevicelabError(f"{argv[0]} not found; install cmake and a C/C++ compiler") from e
        assert p.stdout is not None, "stdout=PIPE"
        for line in p.stdout:
            fh.write(line)
            m = _PCT.match(line)
            if progress and m:
                progress(float(m.group(1)), line.strip()[:80])
        rc = p.wait()
    if rc != 0:
        text = log.read_text(errors="replace")
        reason = cmake_reason(text)
        if reason:
            fix = cmake_fix(reason)
            raise DevicelabError(
                f"llama.cpp {step} failed: {reason}" + (f"; {fix}" if fix else "") + f" (log: {log})",
                detail=tail(text, 30),
            )
        errs = [l.strip() for l in text.splitlines() if re.search(r"\berror\b|CMake Error", l, re.I)]
        first = errs[0][:200] if errs else f"exit status {rc}"
        raise DevicelabError(f"llama.cpp {step} failed: {first} (log: {log})", detail=tail(text, 30))


def cmake_reason(text: str) -> str:
    """The message of CMake's first error, not its header: the indented lines under "CMake Error at FILE:LINE
    (message):" up to the call stack or a blank line ("Could NOT find Vulkan (missing: Vulkan_LIBRARY …)")."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("CMake Error"):
            continue
        m = re.match(r"CMake Error:\s*(.+)$", line)  # "CMake Error: MESSAGE" (no location)
        msg = [m.group(1).strip()] if m else []
        for more in lines[i + 1 :]:
            if not more.strip() or more.startswith("Call Stack") or not more.startswith(" "):
                if msg:
                    break
                continue
            msg.append(more.strip())
        return " ".join(msg)[:400]
    return ""


# what CMake said → what to do about it (the first that matches)
CMAKE_FIXES = (
    (
        r"Could NOT find Vulkan|Vulkan_INCLUDE_DIR|Vulkan_LIBRARY",
        "install Vulkan's development files (Debian: libvulkan-dev, glslc and spirv-headers), or point "
        "DEVICELAB_VULKAN_INCLUDE_DIR at Vulkan headers ≥ 1.3.261 (`.ci/vulkan-headers.sh DIR` unpacks Debian 13's)",
    ),
    (r"glslc", "install the GLSL compiler glslc (Debian: glslc)"),
    (
        r"Could NOT find OpenCL",
        "put the OpenCL headers and ICD loader in the NDK sysroot (llama.cpp's docs/backend/OPENCL.md)",
    ),
    (r"CUDA|nvcc", "install the CUDA toolkit (nvcc on PATH, or CUDACXX naming it)"),
    (
        r"No CMAKE_(C|CXX)_COMPILER|compiler identification is unknown",
        "install a C/C++ compiler (Debian: build-essential; a cross target: its gcc, e.g. gcc-aarch64-linux-gnu)",
    ),
    (r"CMake [\d.]+ or higher is required", "install a newer CMake (`pip install cmake`)"),
    (r"Could NOT find (\w+)", "install {0}'s development package"),
)


def cmake_fix(reason: str) -> str:
    for pattern, fix in CMAKE_FIXES:
        m = re.search(pattern, reason)
        if m:
            return fix.format(*m.groups()) if m.groups() and "{0}" in fix else fix
    return ""
