"""llama.cpp builds: their targets, sources, caches, and where each is made (this host, a device, an iPhone's Mac)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class AnyBuild(Protocol):
    """What a build of llama.cpp's tools offers wherever it was made — cache.Build (this host), remote.RemoteBuild
    (natively on a device over its transport), ios.IOSBuild (the app on an iPhone), the cluster's HeadBuild (made
    on the head): its manifest (its key, commit, target, flags, tools with their sha256), its key, and a tool by
    name (a path on this host, or on the device for a build made there)."""

    @property
    def manifest(self) -> dict: ...
    @property
    def key(self) -> str: ...
    def tool(self, name: str) -> str | Path: ...
