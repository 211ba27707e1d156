"""The devicelab app for an iPhone or iPad: the harness (device_payloads/harness/, llama.cpp's tools under one
executable) built and signed on the phone's Mac over SSH, then installed with devicectl.

The pinned llama.cpp tree (packed once per commit, as for a Mac's native build: build/remote.py) and the harness's
CMake project are pushed into the Mac's verified cache and unpacked there; the harness's CMake configures an Xcode
project for iOS (`-G Xcode -DCMAKE_SYSTEM_NAME=iOS`, the minimum iOS of the pinned build-xcframework.sh, the
user's team and bundle id, Metal on or off) and `cmake --build … -allowProvisioningUpdates` signs it. The build is
kept on the Mac in a folder named by its key — (commit, target, flags, team, bundle id, the harness's sources) — with
a manifest, so an unchanged build is never made twice; it is installed on each phone once (a marker in the app's
container says which build is there: deleting the app deletes the marker with it). The manifest names the harness's
tools (asked of the installed app) and the app's hash, and is recorded in every row like any build's."""

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
from ..transports import Transport, devicectl
from ..transports.ios import IOSTransport
from . import cache, harness, remote
from .source import SourceTree
from .targets import DEVICE_TOOLS, Target

TARGET = "arm64-ios"


def target() -> Target:
    """The app's build: Metal on (its CPU variant is backends.variant(…, "cpu"): Metal off)."""
    return Target(
        name=f"{TARGET}-metal",
        os="iOS",
        arch="arm64",
        where="transport",
        flags={"CMAKE_SYSTEM_NAME": "iOS", "GGML_METAL": "ON", "GGML_METAL_EMBED_LIBRARY": "ON"},
        toolchain="Xcode on the Mac (cmake -G Xcode, xcodebuild)",
        tools=DEVICE_TOOLS,
    )


@dataclass(frozen=True)
class IOSBuild:
    """The app on the phone: its tools are the harness's subcommands (a kind's command line names the tool, the
    transport launches the app with it)."""

    manifest: dict

    def tool(self, name: str) -> str:
        return name

    @property
    def key(self) -> str:
        return self.manifest["key"]

    def provenance(self) -> dict:
        return cache.build_provenance(self.manifest)


def ident(src: SourceTree, t: Target, team_id: str, bundle_id: str, min_os: str) -> tuple[str, dict]:
    """The build's key and what it hashes: commit, target, flags, team, bundle id, the harness's sources."""
    metal = t.flags.get("GGML_METAL") == "ON"
    flags = {**t.cmake_flags(), **harness.ios_flags(bundle_id, team_id, metal, min_os)}
    parts = {
        "commit": src.commit,
        "dirty": src.dirty,
        "target": t.name,
        "flags": flags,
        "team_id": team_id,
        "bundle_id": bundle_id,
        "harness": harness.sources_hash(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16], parts


def harness_tarball() -> Path:
    """The harness's CMake project, packed once per version of its sources."""
    out = paths.sub("sources") / f"devicelab-harness-{harness.sources_hash()}.tar.gz"
    if out.exists():
        return out
    tmp = out.with_suffix(".part")
    base = harness.harness_dir()
    with tarfile.open(tmp, "w:gz") as tf:
        for p in harness.source_files():
            tf.add(p, arcname=f"harness/{p.relative_to(base)}")
    tmp.rename(out)
    return out


def _unpack(mac, tarball: Path, folder: str) -> None:
    """A tarball into a Mac folder (once: a marker says it is complete)."""
    if mac.exists(posixpath.join(folder, ".ok")):
        return
    cached = push.ensure(mac, tarball, sha256_file(tarball), tarball.name)
    mac.mkdir(folder)
    r = mac.run(["tar", "-xzf", cached, "-C", folder], timeout=1800)
    if r.rc != 0:
        raise DevicelabError(f"unpacking {tarball.name} on {mac.name} failed: {r.stderr.strip()[:200]}")
    mac.touch(posixpath.join(folder, ".ok"))


def ensure(t: Transport, src: SourceTree, tgt: Target, jobs: int | None = None) -> IOSBuild:
    """The app for the phone `t` (transports/ios.IOSTransport): built on its Mac unless that build is there,
    installed unless the phone has it."""
    if not isinstance(t, IOSTransport):  # a `where: transport` build is the app's, made through an iPhone's Mac
        raise DevicelabError(f"{t.name} cannot make its own builds (target {tgt.name})")
    mac = t.mac
    min_os = t.min_os or harness.ios_deployment_target(src.path)
    key, parts = ident(src, tgt, t.team_id, t.bundle_id, min_os)
    root = posixpath.join(mac.workdir(), "ios-builds", f"{tgt.name}-{src.short}-{key}")
    man_path = posixpath.join(root, "devicelab-build.json")
    text = mac.read_text(man_path)
    manifest = json.loads(text) if text else _build(t, src, tgt, key, parts, root, min_os)
    if not text or not t.exists(_marker(t, key)):
        manifest = _install(t, manifest)
        tmp = paths.sub("tmp") / f"ios-manifest-{key}.json"
        tmp.write_text(json.dumps(manifest, indent=1))
        mac.put(tmp, man_path + ".part")  # written aside, then renamed: never half a manifest
        mac.run(["mv", "-f", man_path + ".part", man_path])
    return IOSBuild(manifest)


def _marker(t, key: str) -> str:
    """In the app's container: deleting the app deletes it too."""
    return posixpath.join(t.workdir(), "builds", f"{key}.installed")


def _env(t) -> dict | None:
    return {"DEVELOPER_DIR": t.xcode} if t.xcode else None


def _build(t, src: SourceTree, tgt: Target, key: str, parts: dict, root: str, min_os: str) -> dict:
    mac = t.mac
    if mac.run(["cmake", "--version"], env=_env(t)).rc != 0:
        raise DevicelabError(f"{mac.name} has no cmake: install it there (brew install cmake) and run again")
    xc = mac.run(["xcodebuild", "-version"], env=_env(t), timeout=120)
    compiler = " ".join(xc.stdout.split()[:2]) if xc.rc == 0 else ""
    if not compiler:
        raise DevicelabError(
            f"{mac.name} has no Xcode (xcodebuild -version failed): install Xcode 15 or later and run "
            "`sudo xcode-select -s /Applications/Xcode.app/Contents/Developer`"
        )
    src_dir = posixpath.join(mac.workdir(), "src", src.commit[:12] + ("-dirty" if src.dirty else ""))
    _unpack(mac, remote.source_tarball(src), src_dir)
    _unpack(mac, harness_tarball(), root)
    build_dir = posixpath.join(root, "xcode")
    metal = tgt.flags.get("GGML_METAL") == "ON"
    plan = [
        harness.ios_cmake_argv(
            posixpath.join(src_dir, "llama.cpp"),
            build_dir,
            t.bundle_id,
            t.team_id,
            metal,
            min_os,
            harness_dir=posixpath.join(root, "harness"),
        ),
        harness.ios_build_argv(build_dir),
    ]
    for argv in plan:
        r = mac.run(argv, timeout=3 * 3600, env=_env(t))
        if r.rc != 0:
            text = r.stdout + r.stderr
            tail = "\n".join(text.strip().splitlines()[-30:])
            line = devicectl.explain(text, t.name, f"the Mac {mac.name}", t.team_id, t.bundle_id)
            if line:
                raise DevicelabError(f"{t.name}: {line}", detail=tail)
            raise DevicelabError(
                f"building the devicelab app on {mac.name} failed at `{' '.join(argv[:2])}`: "
                f"{devicectl.first_error(text)}",
                detail=tail,
            )
    app = harness.ios_app_path(build_dir)
    app_sha = mac.sha256(posixpath.join(app, harness.APP_EXECUTABLE))
    if not app_sha:
        raise DevicelabError(f"building the devicelab app on {mac.name} produced no {app}")
    return {
        "key": key,
        "commit": src.commit,
        "dirty": src.dirty,
        "target": tgt.name,
        "flags": parts["flags"],
        "compiler": compiler,
        "tools": {},
        "where": "device",
        "app": app,
        "harness": {
            "sha256": app_sha,
            "sources": parts["harness"],
            "team_id": t.team_id,
            "bundle_id": t.bundle_id,
            "min_os": min_os,
        },
        "cmake_plan": plan,
    }


def _install(t, manifest: dict) -> dict:
    """Install the app on the phone, mark the container with the build, and ask the app which tools it carries."""
    t.install(manifest["app"])
    marker = _marker(t, manifest["key"])
    t.mkdir(posixpath.dirname(marker))
    t.launch(["fs", "touch", marker], timeout=120)
    r = t.launch(["tools"], timeout=120)
    tools = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("llama-")]
    if not tools:
        raise DevicelabError(
            f"{t.name}: the devicelab app started but named no tools ({devicectl.first_error(r.stdout + r.stderr)})"
        )
    sha = manifest["harness"]["sha256"]
    return {**manifest, "tools": {name: sha for name in tools}}
