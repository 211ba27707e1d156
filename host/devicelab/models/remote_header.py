"""A hub GGUF's header without its weights: huggingface_hub names the revision's commit and its files' sizes, then
ranged GETs read each part's metadata and tensor table (a few MB of a many-GB file, growing the range until the
header ends). Each part is kept as a sparse file of its real size that holds only the header bytes, so gguf-py
reads it as it reads a downloaded file (tensor shapes and types, the file's size) and nothing reads its data.
Headers are cached by commit; a revision read online is remembered so an offline run can reuse it."""

from __future__ import annotations

import re
import struct
from pathlib import Path

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from .. import paths
from ..errors import DevicelabError
from . import hub

FIRST_RANGE = 2 << 20  # bytes: most headers (a 49k-token vocabulary is ≈ 1.5 MB) end inside it
MAX_HEADER = 512 << 20  # a header past this is not a GGUF header
SCALAR_BYTES: dict[int, int] = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1, GGUFValueType.UINT16: 2,
    GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}  # fmt: skip


def _storage(repo: str) -> Path:
    return paths.sub("hf-headers") / ("models--" + repo.replace("/", "--"))


class _Walk:
    """A cursor over a GGUF header's bytes (little-endian, the layout gguf-py writes); struct.error past the end."""

    U32, U64 = struct.Struct("<I"), struct.Struct("<Q")

    def __init__(self, buf: bytes):
        self.buf, self.at = buf, 0

    def take(self, st: struct.Struct) -> int:
        (v,) = st.unpack_from(self.buf, self.at)
        self.at += st.size
        return v

    def skip(self, n: int) -> bytes:
        self.at += n
        if self.at > len(self.buf):
            raise struct.error("past the end")
        return self.buf[self.at - n : self.at]

    def string(self) -> bytes:
        return self.skip(self.take(self.U64))

    def value(self, t: int) -> bytes:
        """A key's value (its bytes, for a scalar); arrays of scalars skipped whole, of strings one by one."""
        if t == GGUFValueType.STRING:
            return self.string()
        if t != GGUFValueType.ARRAY:
            if t not in SCALAR_BYTES:
                raise ValueError(f"unknown GGUF value type {t}")
            return self.skip(SCALAR_BYTES[t])
        et, n = self.take(self.U32), self.take(self.U64)
        if et in SCALAR_BYTES:
            self.skip(SCALAR_BYTES[et] * n)
        else:
            for _ in range(n):
                self.value(et)
        return b""


def header_end(buf: bytes) -> int | None:
    """Where a GGUF's tensor data starts, walking its header (magic, version, counts, key/values, tensor infos,
    padding to general.alignment); None where buf ends inside the header, ValueError where it is no GGUF. A walk,
    not a parse: gguf-py reads the whole header once it is all here (a 262k-token vocabulary takes it seconds)."""
    w = _Walk(buf)
    try:
        if w.take(w.U32) != GGUF_MAGIC:
            raise ValueError("not a GGUF file")
        w.take(w.U32)  # version
        n_tensors, n_kv = w.take(w.U64), w.take(w.U64)
        align = GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key = w.string()
            v = w.value(w.take(w.U32))
            if key == b"general.alignment":
                align = int.from_bytes(v, "little") or align
        for _ in range(n_tensors):
            w.string()
            w.skip(8 * w.take(w.U32) + 4 + 8)  # its dims, type and offset
    except struct.error:
        return None
    return w.at + (-w.at % align)


def _read_part(url: str, size: int, dst: Path) -> None:
    """dst: a sparse file of `size` bytes holding the header of the file at url, read in growing ranges."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

    tmp = dst.with_name(dst.name + ".part")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    head, want = bytearray(), min(FIRST_RANGE, size)
    while True:
        range_ = {"Range": f"bytes={len(head)}-{want - 1}"}
        with http_stream_backoff("GET", url, headers={**build_hf_headers(), **range_}, max_retries=2) as r:
            if r.status_code != 206:  # a server that ignores Range would send the whole file: not read, said
                if r.status_code >= 400:
                    r.read()  # an error's few bytes, for its message
                    hf_raise_for_status(r)
                raise DevicelabError(f"{url}: the hub answered a ranged read with {r.status_code}, not 206")
            for chunk in r.iter_bytes():
                head += chunk[: want - len(head)]
                if len(head) >= want:
                    break
        try:
            end = header_end(bytes(head))
        except ValueError as e:
            raise DevicelabError(f"{url}: {e} (its first bytes are no GGUF header); is it a .gguf file?") from None
        if end is not None:
            break
        if len(head) >= size or want >= MAX_HEADER:
            raise DevicelabError(f"{url}: no whole GGUF header in its first {len(head) >> 20} MB")
        want = min(2 * want, size, MAX_HEADER)
    with open(tmp, "wb") as f:
        f.truncate(size)
        f.write(head)
    tmp.replace(dst)


def _offline_commit(repo: str, rev: str) -> str:
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        return rev
    ref = _storage(repo) / "refs" / rev
    if not ref.is_file():
        raise DevicelabError(
            f"hf:{repo}@{rev}: its header was never read and HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE "
            "where the hub can be reached"
        )
    return ref.read_text().strip()


def fetch(spec: str) -> tuple[Path, str]:
    """The first part of the GGUF an hf: spec names, as a header-only local file, and the commit it came from."""
    import huggingface_hub as hh

    ref = hub.parse(spec)
    rev = ref.revision or "main"
    storage = _storage(ref.repo)
    if hub.offline():
        commit = _offline_commit(ref.repo, rev)
        folder = storage / commit
        names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.gguf")) if folder.is_dir() else []
        chosen = hub.choose(ref, names)
        return folder / chosen[0], commit
    with hub.answers(ref, rev):
        info = hh.HfApi().model_info(ref.repo, revision=rev, files_metadata=True)
    if not info.sha:
        raise DevicelabError(f"{ref}: the hub named no commit of {ref.repo} at {rev}")
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    chosen = hub.choose(ref, sorted(sizes))
    if not chosen:
        raise DevicelabError(
            f"{ref}: {ref.repo} is a safetensors checkpoint, not a GGUF; predict reads GGUF headers (convert it "
            "first, or describe the model with --params --layers --kv-heads --head-dim --vocab)"
        )
    folder = storage / info.sha
    for name in chosen:
        dst = folder / name
        if dst.exists():
            continue
        size = sizes[name]
        if not size:
            raise DevicelabError(f"{ref}: the hub gave no size for {name}")
        with paths.result_lock(dst):
            if not dst.exists():
                _read_part(hh.hf_hub_url(ref.repo, name, revision=info.sha), int(size), dst)
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / rev).write_text(info.sha)
    return folder / chosen[0], info.sha
