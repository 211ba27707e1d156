"""Where devicelab keeps its caches (sources, builds, models) and lab data (ledger, artifacts)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


def home() -> Path:
    """Cache root: $DEVICELAB_HOME, else ~/.cache/devicelab."""
    p = os.environ.get("DEVICELAB_HOME")
    root = Path(p).expanduser() if p else Path.home() / ".cache" / "devicelab"
    root.mkdir(parents=True, exist_ok=True)
    return root


def sub(name: str) -> Path:
    d = home() / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def device_payloads_dir() -> Path:
    """The device-side scripts shipped beside the package (repo root / device_payloads)."""
    env = os.environ.get("DEVICELAB_PAYLOADS")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "device_payloads"
        if (cand / "sampler.sh").exists():
            return cand
    raise FileNotFoundError("device_payloads/ not found; set DEVICELAB_PAYLOADS to the repo's device_payloads folder")


@contextmanager
def result_lock(out: Path):
    """Held while one process makes the file `out` (a lock file beside it): a second process that wants the same
    result waits, then finds it made. Several results in one folder are made at once."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def temp_for(out: Path) -> Path:
    """A temporary name beside `out` that no other process or thread uses (renamed into place when complete)."""
    import uuid

    return out.parent / f".{out.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{out.suffix}"
