"""sha256 of local files, memoized by (size, mtime) so an unchanged 1 GB ladder is not re-read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

_SIDE = ".sha256.json"


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    path = Path(path)
    st = path.stat()
    side = path.with_name(path.name + _SIDE)
    if side.exists():
        try:
            memo = json.loads(side.read_text())
            if memo.get("size") == st.st_size and memo.get("mtime_ns") == st.st_mtime_ns:
                return memo["sha256"]
        except (ValueError, KeyError):
            pass
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(chunk)
            if not b:
                break
            h.update(b)
    digest = h.hexdigest()
    try:
        side.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}))
    except OSError:
        pass
    return digest
