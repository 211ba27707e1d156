"""Verified pushes into the device's content-addressed cache: <workdir>/cache/<sha256[:16]>/<name>.

A file is sent to '<path>.part', its sha256 is computed on the device and compared, then it is renamed
and a '.ok' marker is written: an unchanged file is never sent again, and a cut or corrupted transfer
is never taken for a good one."""

from __future__ import annotations

import posixpath
from pathlib import Path

from .errors import RetryableError
from .transports.base import Transport


def remote_path(t: Transport, sha: str, name: str) -> str:
    return posixpath.join(t.workdir(), "cache", sha[:16], name)


def ensure(t: Transport, local: Path, sha: str, name: str | None = None, mode: str | None = None,
           attempts: int = 2) -> str:
    name = name or Path(local).name
    dst = remote_path(t, sha, name)
    ok = dst + ".ok"
    if t.exists(ok):
        return dst
    t.mkdir(posixpath.dirname(dst))
    part = dst + ".part"
    got = None
    for _ in range(attempts):
        if hasattr(t, "put_verified"):
            got = t.put_verified(Path(local), part) or t.sha256(part)   # hashed on the device while written
        else:
            t.put(Path(local), part)
            got = t.sha256(part)
        if got == sha:
            break
    else:
        t.run(["rm", "-f", part])
        raise RetryableError(f"push of {name} to {t.name} failed verification (sha256 {got} != {sha[:16]}…); "
                             "check the link and the device's free storage, then run again")
    # mode, rename and marker in one round trip (each costs tens of ms over a slow link)
    r = t.sh('{ [ -z "$4" ] || chmod "$4" "$1"; } && mv -f "$1" "$2" && printf "%s\\n" "$5" > "$3"',
             part, dst, ok, mode or "", sha)
    if r.rc != 0:
        raise RetryableError(f"could not finish push of {name} on {t.name}: {r.stderr.strip()}")
    return dst
