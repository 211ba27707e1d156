"""Native builds on the device over its transport (a Mac with Metal, a board with a toolchain).

The source tree is packed once per commit, pushed into the device's verified cache, unpacked, and
configured/built there with the target's flags. The build lives on the device in a folder named by the
build key, with a manifest; an unchanged build is a no-op. The plan is a list of argument lists, so it
can be checked without a Mac."""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .. import paths, push
from ..errors import DevicelabError
from ..hashing import sha256_file
from ..transports.base import Transport
from .cache import build_flags
from .source import BUILD_EXCLUDE as EXCLUDE
from .source import SourceTree
from .targets import Target


@dataclass
class RemoteBuild:
    dir: str
    manifest: dict

    def tool(self, name: str) -> str:
        return posixpath.join(self.dir, "bin", name)

    @property
    def key(self) -> str:
        return self.manifest["key"]


def key_for(src: SourceTree, t: Target, compiler: str) -> str:
    ident = {
        "commit": src.commit,
        "dirty": src.dirty,
        "target": t.name,
        "flags": build_flags(src, t),
        "compiler": compiler,
        "tools": sorted(t.tools),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def source_tarball(src: SourceTree) -> Path:
    """The llama.cpp tree without what a build does not need, packed once per commit."""
    out = paths.sub("sources") / f"llama.cpp-{src.commit[:12]}{'-dirty' if src.dirty else ''}.tar.gz"
    if out.exists():
        return out
    tmp = out.with_suffix(".part")
    with tarfile.open(tmp, "w:gz") as tf:
        for p in sorted(src.path.iterdir()):
            if p.name in EXCLUDE or p.name.startswith(".devicelab"):
                continue
            tf.add(p, arcname=f"llama.cpp/{p.name}")
    tmp.rename(out)
    return out


def plan(remote_src: str, remote_build: str, t: Target, jobs: int, flags: dict | None = None) -> list[list[str]]:
    """The commands a native device build runs, in order (the tarball is already in remote_src); `flags`: the
    build's definitions (cache.build_flags), the target's own by default."""
    tree = posixpath.join(remote_src, "llama.cpp")
    flags = t.cmake_flags() if flags is None else flags
    return [
        ["tar", "-xzf", posixpath.join(remote_src, "src.tar.gz"), "-C", remote_src],
        ["cmake", "-S", tree, "-B", remote_build, *[f"-D{k}={v}" for k, v in flags.items()]],
        ["cmake", "--build", remote_build, "-j", str(jobs), "--target", *t.tools],
    ]


def ensure(t: Transport, src: SourceTree, target: Target, jobs: int | None = None) -> RemoteBuild:
    cc = t.sh("cc --version 2>/dev/null | head -n1").stdout.strip() or "cc"
    key = key_for(src, target, cc)
    root = posixpath.join(t.workdir(), "builds", f"{target.name}-{src.short}-{key}")
    man_path = posixpath.join(root, "devicelab-build.json")
    man = t.read_text(man_path)
    if man:
        return RemoteBuild(root, json.loads(man))
    if t.run(["cmake", "--version"]).rc != 0:
        raise DevicelabError(
            f"{t.name} has no cmake: install it there (macOS: xcode-select --install; brew install "
            "cmake) or build on the host (cross_build: true)"
        )
    tarball = source_tarball(src)
    remote_src = posixpath.join(t.workdir(), "src", src.commit[:12])
    cached = push.ensure(t, tarball, sha256_file(tarball), "src.tar.gz")
    t.mkdir(remote_src)
    t.copy(cached, posixpath.join(remote_src, "src.tar.gz"))
    if jobs is None:
        r = t.sh("getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu")
        jobs = int(r.stdout.strip() or 2)
    build_dir = posixpath.join(root, "cmake")
    flags = build_flags(src, target)
    for argv in plan(remote_src, build_dir, target, jobs, flags):
        r = t.run(argv, timeout=3 * 3600)
        if r.rc != 0:
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-30:])
            first = next((l for l in tail.splitlines() if "error" in l.lower()), f"exit {r.rc}")
            raise DevicelabError(
                f"build on {t.name} failed at `{argv[0]} {argv[1]}`: {first.strip()[:200]}", detail=tail
            )
    t.mkdir(posixpath.join(root, "bin"))
    tools = {}
    for tool in target.tools:
        src_bin = posixpath.join(build_dir, "bin", tool)
        dst = posixpath.join(root, "bin", tool)
        if t.copy(src_bin, dst).rc != 0:
            raise DevicelabError(f"build on {t.name} produced no {tool}")
        tools[tool] = t.sha256(dst)
    manifest = {
        "key": key,
        "commit": src.commit,
        "dirty": src.dirty,
        "target": target.name,
        "flags": flags,
        "compiler": cc,
        "tools": tools,
        "where": "device",
        "cmake_plan": plan(remote_src, build_dir, target, jobs, flags),
    }
    tmp = Path(paths.sub("tmp")) / f"manifest-{key}.json"
    tmp.write_text(json.dumps(manifest, indent=1))
    t.put(tmp, man_path + ".part")  # written aside, then renamed: never half a manifest
    t.run(["mv", "-f", man_path + ".part", man_path])
    return RemoteBuild(root, manifest)
