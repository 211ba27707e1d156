"""llama.cpp's library as llama-cpp-python loads it, linked from this host's own build.

The host log-likelihood route scores with llama-cpp-python, whose Python bindings call a `libllama.so`. Its sdist
compiles its vendored llama.cpp into one (≈ 5 minutes on two cores); the lab's default source *is* that vendored
tree, and the host build compiles it already, position-independent (targets.local_native), so the library is the
host build's static archives linked whole into one shared object: a second of linking, not a second compile.
llama-cpp-python installed with `CMAKE_ARGS=-DLLAMA_BUILD=OFF` compiles nothing and needs this library; installed
with its own, it is still given this one wherever the lab's source is its vendored tree (LLAMA_CPP_LIB_PATH), so a
host score names the build it was computed with, as a device's does."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import DevicelabError
from ..proc import tail
from . import source as sourcemod
from .cache import Build
from .source import SourceTree

NAME = "libllama.so"
BINDINGS = "llama-cpp-python"


@dataclass(frozen=True)
class Library:
    path: Path  # the libllama.so
    sha256: str
    build_key: str | None  # None: llama-cpp-python's own library
    build_commit: str | None

    def provenance(self) -> dict:
        return {
            "eval_library": str(self.path),
            "eval_library_sha256": self.sha256,
            "eval_library_build_key": self.build_key,
            "eval_library_build_commit": self.build_commit,
        }


def bindings_version() -> str | None:
    try:
        return importlib.metadata.version(BINDINGS)
    except importlib.metadata.PackageNotFoundError:
        return None


def mismatch(src: SourceTree) -> str | None:
    """Why llama-cpp-python's bindings cannot call a library built from `src` (None: they can — `src` is the
    installed release's own vendored llama.cpp, whose functions and structs the bindings declare)."""
    v = bindings_version()
    if v is None:
        return f"{BINDINGS} is not installed"
    if platform.system() != "Linux":
        return f"a build's objects are linked into {NAME} on Linux only (this is {platform.system()})"
    if src.dirty:
        return f"this lab's llama.cpp ({src.origin}) has edited files"
    try:
        vendored = sourcemod.resolve(f"pypi:{BINDINGS}=={v}")
    except DevicelabError as e:
        return f"the llama.cpp that {BINDINGS} {v} vendors cannot be looked up ({e})"
    if vendored.commit != src.commit or vendored.dirty:
        return f"this lab's llama.cpp ({src.origin}, {src.short}) is not the one {BINDINGS} {v} vendors " + (
            f"({vendored.short})"
        )
    return None


def own() -> Library | None:
    """llama-cpp-python's own library, where it was installed with one (found without importing it)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    p = Path(spec.origin).parent / "lib" / NAME
    if not p.exists():
        return None
    return Library(p, hashlib.sha256(p.read_bytes()).hexdigest(), None, None)


def ensure(b: Build) -> Library:
    """`lib/libllama.so` beside the build's tools, linked once from its static archives (under the build's lock:
    two runs asking at once link it once)."""
    if platform.system() != "Linux":
        raise DevicelabError(f"linking {NAME} from a build is done on Linux only (this is {platform.system()})")
    out = b.dir / "lib" / NAME
    stamp = out.with_name(NAME + ".json")
    out.parent.mkdir(exist_ok=True)
    with open(out.parent / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out.exists() and stamp.exists()):
            argv = link_argv(b.dir, out, list(b.manifest.get("tools", {})))
            p = subprocess.run(argv, capture_output=True, text=True)
            if p.returncode != 0:
                raise DevicelabError(
                    f"linking {NAME} from the build in {b.dir} failed: {tail(p.stderr, 3)}; "
                    "was it built position-independent (CMAKE_POSITION_INDEPENDENT_CODE)?"
                )
            sha = hashlib.sha256(out.read_bytes()).hexdigest()
            tmp = stamp.with_suffix(".tmp")
            tmp.write_text(json.dumps({"sha256": sha, "argv": argv, "build_key": b.key}, indent=1))
            tmp.replace(stamp)
        made = json.loads(stamp.read_text())
    return Library(out, made["sha256"], b.key, b.manifest["commit"])


def link_argv(d: Path, out: Path, tools: list[str]) -> list[str]:
    """The C++ compiler of the build (its CMakeCache), every static archive of llama and ggml whole, and the system
    libraries one of the build's tools links with (its link.txt: OpenMP's, -ldl, -lm)."""
    cxx = "c++"
    for line in (d / "CMakeCache.txt").read_text(errors="replace").splitlines():
        if line.startswith("CMAKE_CXX_COMPILER:"):
            cxx = line.split("=", 1)[1]
    archives = [d / "src" / "libllama.a", *sorted((d / "ggml" / "src").rglob("libggml*.a"))]
    missing = [str(a) for a in archives if not a.exists()]
    if missing or len(archives) < 2:
        raise DevicelabError(f"the build in {d} has no llama/ggml archives ({', '.join(missing) or 'ggml'})")
    system: list[str] = []
    links = [x for t in tools for x in sorted((d / "tools").glob(f"*/CMakeFiles/{t}.dir/link.txt"))]
    if not links:
        raise DevicelabError(f"the build in {d} has no tool's link line to take its system libraries from")
    for tok in shlex.split(links[0].read_text()):
        if (tok.startswith("-l") or tok.endswith(".so") or tok in ("-pthread", "-fopenmp")) and tok not in system:
            system.append(tok)
    return [
        cxx,
        "-shared",
        "-o",
        str(out),
        f"-Wl,-soname,{NAME}",
        "-Wl,--no-undefined",
        "-Wl,--whole-archive",
        *map(str, archives),
        "-Wl,--no-whole-archive",
        *system,
        "-pthread",
    ]


def load(lib: Library | None):
    """The llama_cpp module, bound to `lib` (None: llama-cpp-python's own library). ctypes binds it once per
    process, at its first import: a process that has bound another library says so rather than score with it."""
    if "llama_cpp" not in sys.modules:
        if lib is not None:
            os.environ["LLAMA_CPP_LIB_PATH"] = str(lib.path.parent)
        else:  # its own: not one a parent process (or the shell) pointed it at
            os.environ.pop("LLAMA_CPP_LIB_PATH", None)
        if lib is None and own() is None:
            raise DevicelabError(
                f"{BINDINGS} has no llama library of its own (installed with -DLLAMA_BUILD=OFF): reinstall it with "
                f"one (pip install --force-reinstall --no-cache-dir {BINDINGS}=={bindings_version()})"
            )
    try:
        import llama_cpp
    except (OSError, RuntimeError, FileNotFoundError) as e:
        raise DevicelabError(f"{BINDINGS} cannot load its llama library: {e}") from None
    bound = Path(llama_cpp.llama_cpp._lib._name).resolve()
    want = lib.path.resolve() if lib is not None else (own() or Library(bound, "", None, None)).path.resolve()
    if bound != want:
        raise DevicelabError(
            f"this process's {BINDINGS} is bound to {bound}, not {want}: run the host evals in a new process"
        )
    return llama_cpp
