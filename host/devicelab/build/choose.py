"""Which llama.cpp build a device gets when its lab entry names none: chosen from what its transport reaches
(transports/base.Platform) and the facts the device told. Transports say what a device is, build says what runs
there: build depends on transports, never the other way."""

from __future__ import annotations

import platform

from ..errors import DevicelabError
from ..transports.base import Platform
from . import ios, targets
from .targets import Target

NO_NDK = (
    "no Android NDK (set ANDROID_NDK_HOME): the phone gets a static aarch64 Linux build, which runs on "
    "Android's kernel but misses NDK-only paths (bionic, Android's libc++ and its CPU feature detection)"
)


def default_target(
    reached: Platform | None, facts: dict, name: str, cross_build: bool = True
) -> tuple[Target, list[str]]:
    """The build target of a device from what its transport reaches and the facts it told, and warnings for the user.
    This workstation: its own build. An Android phone: the NDK build (arm64-v8a) where an NDK is set, else the static
    aarch64 Linux build, with a warning. An iPhone or iPad: the app. A board or a Mac over SSH: a static aarch64
    cross-build here (or a native build on the board, `cross_build: false`); an x86 host with every CPU feature of
    this one reuses this host's build; Macs build Metal natively."""
    feats = set((facts.get("cpu.features") or "").split())
    if reached is Platform.THIS_HOST:
        return targets.local_native(), []
    if reached is Platform.IOS:
        return ios.target(), []
    if reached is Platform.ANDROID:
        ndk = targets.find_ndk()
        return (targets.android_ndk(ndk, feats), []) if ndk else (targets.aarch64_cross_static(feats), [NO_NDK])
    if reached is not Platform.UNIX:
        raise DevicelabError(f"no build target for {name} ({facts.get('uname')})")
    arch, uname = facts.get("arch", ""), facts.get("uname", "")
    darwin = "Darwin" in uname
    if not cross_build:
        return targets.native_on_device(arch or "aarch64", "darwin" if darwin else "linux"), []
    if arch == platform.machine() and "Linux" in uname and targets.host_cpu_flags() <= feats:
        return targets.local_native(), []  # same arch and every CPU feature of this host: its build runs there
    if darwin:
        return targets.macos_metal(), []
    if arch in ("aarch64", "arm64"):
        return targets.aarch64_cross_static(feats), []
    raise DevicelabError(
        f"no build target for {name} ({uname}); supported: x86-64 like this host, aarch64 Linux, macOS"
    )
