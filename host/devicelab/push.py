"""Verified pushes into the device's content-addressed cache: <workdir>/cache/<sha256[:16]>/<name>.

A file is sent to '<path>.part', its sha256 is computed on the device and compared, then it is renamed
and a '.ok' marker is written: an unchanged file is never sent again, and a cut or corrupted transfer
is never taken for a good one."""

from __future__ import annotations

import posixpath
from pathlib import Path

from .errors import RetryableError
from .transports.base import Commit, Transport


def remote_path(t: Transport, sha: str, name: str) -> str:
    return posixpath.join(t.workdir(), "cache", sha[:16], name)


def present(t: Transport, sha: str, name: str) -> str | None:
    """The device's copy when it is already there, verified and marked (one round trip), else None."""
    dst = remote_path(t, sha, name)
    return dst if t.exists(dst + ".ok") else None


def ensure(
    t: Transport, local: Path, sha: str, name: str | None = None, mode: str | None = None, attempts: int = 2
) -> str:
    name = name or Path(local).name
    dst = remote_path(t, sha, name)
    ok = dst + ".ok"
    if t.exists(ok):
        return dst
    part = dst + ".part"
    got = None
    for _ in range(attempts):
        # sent, hashed on the device, and renamed + marked there once the hash matches
        got = t.put_verified(Path(local), part, Commit(dst, ok, sha, mode))
        if got == sha:
            return dst
    t.remove(part)
    raise RetryableError(
        f"push of {name} to {t.name} failed verification (sha256 {got} != {sha[:16]}…); "
        "check the link and the device's free storage, then run again"
    )
