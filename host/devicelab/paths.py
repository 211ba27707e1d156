"""Where devicelab keeps its caches (sources, builds, models) and lab data (ledger, artifacts)."""

from __future__ import annotations

import os
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
