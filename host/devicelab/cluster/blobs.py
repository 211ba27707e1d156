"""A node's cache of the head's files (builds' tools, quants, logits, texts), by content: a file arrives once
per node, streamed in chunks from the head and verified by sha256 before it is used, and stays for later runs.
Lanes on one node share it (a file lock per file); a cut transfer leaves only a `.part`."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import Callable

from .. import paths
from ..errors import RetryableError
from . import NODE_CACHE_ENV

CHUNK = 4 * 1024 * 1024
OK = ".verified"


def root() -> Path:
    env = os.environ.get(NODE_CACHE_ENV)
    d = Path(env) if env else paths.sub("node-cache")
    d.mkdir(parents=True, exist_ok=True)
    return d


def fetch(sha: str, name: str, size: int, read: Callable[[int, int], bytes], mode: int | None = None) -> Path:
    """The file with this content in the node cache (as `name`), fetched through `read(offset, n)` if absent."""
    d = root() / "blobs" / sha[:2] / sha
    d.mkdir(parents=True, exist_ok=True)
    out = d / name
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists() and (d / (name + OK)).exists():
            return out
        part = d / (name + ".part")
        h = hashlib.sha256()
        with open(part, "wb") as f:
            off = 0
            while off < size:
                b = read(off, min(CHUNK, size - off))
                if not b:
                    break
                f.write(b)
                h.update(b)
                off += len(b)
        if h.hexdigest() != sha:
            part.unlink(missing_ok=True)
            raise RetryableError(
                f"{name} from the head arrived with sha256 {h.hexdigest()[:12]}, expected {sha[:12]} "
                f"({off} of {size} bytes): run again"
            )
        if mode is not None:
            os.chmod(part, mode)
        part.rename(out)
        (d / (name + OK)).write_text(sha)
    return out


def read_tree(d: Path) -> dict[str, bytes]:
    """A small folder (a cell's artifacts, task files) as {relpath: bytes}, to send through Ray."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def write_tree(d: Path, files: dict[str, bytes], what: str) -> None:
    """{relpath: bytes} written under d, each file whole (a .part renamed); a path leading out of d is refused."""
    d = d.resolve()
    for rel, data in files.items():
        p = (d / rel).resolve()
        if d not in p.parents:
            raise RetryableError(f"{what}: a file outside its folder: {rel}")
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".part")
        tmp.write_bytes(data)
        tmp.rename(p)


def tree(digest: str, name: str, files: Callable[[], dict[str, bytes]]) -> Path:
    """A small folder (task files) in the node cache under its digest and name, written once from
    {relpath: bytes}."""
    d = root() / "trees" / digest / name
    if (d / OK).exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    with open(d.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / OK).exists():
            write_tree(d, files(), "task files from the head")
            (d / OK).write_text(digest)
    return d
