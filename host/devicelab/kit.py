"""The device-side kit: device_payloads/*.sh pushed (verified, content-addressed) to the device."""

from __future__ import annotations

import hashlib
import posixpath

from . import paths, push
from .hashing import sha256_file
from .transports.base import Transport


def ensure(t: Transport, send=None) -> str:
    """Push the kit; return its folder on the device. Its name is the hash of all scripts, so a
    changed script gives a new folder and the old one is never half-updated. `send(path, sha, name)`
    pushes one file (default push.ensure; a session passes its own, which waits its turn on the host)."""
    send = send or (lambda p, sha, name: push.ensure(t, p, sha, name))
    src = paths.device_payloads_dir()
    files = sorted(p for p in src.iterdir() if p.suffix == ".sh")
    digest = hashlib.sha256(b"".join(p.name.encode() + sha256_file(p).encode() for p in files)).hexdigest()
    kit = posixpath.join(t.workdir(), "kit", digest[:16])
    if t.exists(posixpath.join(kit, ".ok")):
        return kit
    t.mkdir(kit)
    for p in files:
        dst = send(p, sha256_file(p), p.name)
        r = t.copy(dst, posixpath.join(kit, p.name))
        if r.rc != 0:
            raise OSError(f"could not install {p.name} on {t.name}: {r.stderr.strip()}")
    t.touch(posixpath.join(kit, ".ok"))
    return kit
