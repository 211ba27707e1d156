"""A node's cache of the head's files (builds' tools, quants, logits, texts), by content: a file arrives once
per node, streamed in chunks from the head and verified by sha256 before it is used, and stays for later runs.
Lanes on one node share it (a file lock per file); a cut transfer leaves only a `.part`."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from pathlib import Path
from typing import Callable

from .. import paths
from ..errors import RetryableError
from . import NODE_CACHE_ENV

CHUNK = 4 * 1024 * 1024
OK = ".verified"


def root() -> Path:
    """The node's cache (0700: the files in it are run on the lab's devices)."""
    env = os.environ.get(NODE_CACHE_ENV)
    d = Path(env) if env else paths.sub("node-cache")
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d


_HEX = re.compile(r"[0-9a-f]{8,64}")


def check_hex(v: str, what: str) -> str:
    """An id or digest from a peer: hex only (nothing that could name another folder)."""
    if not isinstance(v, str) or not _HEX.fullmatch(v):
        raise RetryableError(f"{what} {v!r} from a peer is not a hex id")
    return v


def check_name(v: str, what: str) -> str:
    """A file or folder name from a peer: one safe path component."""
    if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]+", v) or v in (".", ".."):
        raise RetryableError(f"{what} {v!r} from a peer is not one safe path component")
    return v


def _write_new(path: Path, chunks, mode: int = 0o600) -> hashlib._Hash:
    """Write a new file that no link or earlier file stands in for (O_EXCL | O_NOFOLLOW); its sha256."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        for b in chunks:
            f.write(b)
            h.update(b)
    return h


def _record(out: Path) -> str:
    st = out.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def fetch(sha: str, name: str, size: int, read: Callable[[int, int], bytes], mode: int | None = None) -> Path:
    """The file with this content in the node cache (as `name`), fetched through `read(offset, n)` if absent. A
    cached file is used only while its size and mtime are what was recorded when its content was verified."""
    check_hex(sha, "a file's sha256")
    check_name(name, "a file's name")
    d = root() / "blobs" / sha[:2] / sha
    d.mkdir(parents=True, exist_ok=True)
    out = d / name
    ok = d / (name + OK)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (
            out.is_file()
            and not out.is_symlink()
            and ok.is_file()
            and ok.read_text().split("\n")[-1:] == [_record(out)]
        ):
            return out
        out.unlink(missing_ok=True)
        ok.unlink(missing_ok=True)
        part = d / (name + ".part")
        part.unlink(missing_ok=True)  # a cut transfer's, or something planted there
        got = [0]

        def chunks():
            while got[0] < size:
                b = read(got[0], min(CHUNK, size - got[0]))
                if not b:
                    return
                got[0] += len(b)
                yield b

        h = _write_new(part, chunks())
        if h.hexdigest() != sha:
            part.unlink(missing_ok=True)
            raise RetryableError(
                f"{name} from the head arrived with sha256 {h.hexdigest()[:12]}, expected {sha[:12]} "
                f"({got[0]} of {size} bytes): run again"
            )
        if mode is not None:
            os.chmod(part, mode)
        part.rename(out)
        ok.write_text(f"{sha}\n{_record(out)}")
    return out


def clean_leftovers(r: Path | None = None) -> list[Path]:
    """What a crash leaves in the node cache — cut transfers (`.part`) and killed lanes' staging folders — removed
    when a node starts (no lane of this node is running then)."""
    import shutil

    gone = []
    r = r or root()
    for p in list(r.glob("blobs/*/*/*.part")) + list(r.glob("trees/*/*/**/*.part")):
        p.unlink(missing_ok=True)
        gone.append(p)
    staging = r / "staging"
    if staging.is_dir():
        for run in staging.iterdir():
            shutil.rmtree(run, ignore_errors=True)
            gone.append(run)
    return gone


def read_tree(d: Path) -> dict[str, bytes]:
    """A small folder (a cell's artifacts, task files) as {relpath: bytes}, to send through Ray."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def write_tree(d: Path, files: dict[str, bytes], what: str, within: Path | None = None) -> None:
    """{relpath: bytes} written under d, each file whole (a new .part renamed); a path leading out of d — or d
    itself out of `within`, the folder it must be in — is refused before anything is written."""
    d = d.resolve()
    if within is not None and within.resolve() not in d.parents:
        raise RetryableError(f"{what}: its folder {d} is outside {within}")
    targets = []
    for rel, data in files.items():
        p = (d / rel).resolve()
        if d not in p.parents:
            raise RetryableError(f"{what}: a file outside its folder: {rel}")
        targets.append((p, data))
    for p, data in targets:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".part")
        tmp.unlink(missing_ok=True)
        _write_new(tmp, [data])
        tmp.rename(p)


def tree(digest: str, name: str, files: Callable[[], dict[str, bytes]]) -> Path:
    """A small folder (task files) in the node cache under its digest and name, written once from
    {relpath: bytes}."""
    check_hex(digest, "a folder's digest")
    check_name(name, "a folder's name")
    d = root() / "trees" / digest / name
    if (d / OK).exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    with open(d.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / OK).exists():
            write_tree(d, files(), "task files from the head", within=root() / "trees")
            (d / OK).write_text(digest)
    return d
