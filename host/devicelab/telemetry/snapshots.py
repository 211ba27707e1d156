"""Once-per-cell snapshots taken through the transport before and after a cell, by the sources that declare them
(sources/*.py: `Snapshot`). Raw text is kept with the cell's artifacts; the parsed values become rows."""

from __future__ import annotations

from pathlib import Path

from ..schema import Row
from ..transports.base import Transport
from . import sources


def available(t: Transport) -> set[str]:
    """The device commands the sources run that this device has."""
    return sources.detect(t)


def take(t: Transport, tools: set[str], when: str, artifacts: Path) -> dict:
    """Run the snapshot commands the device has; their raw text goes to the cell's artifacts
    (NAME.WHEN.txt), where `from_artifacts` reads it back; returns the parsed values by snapshot."""
    parsed = {}
    for snap in sources.snapshots():
        if snap.needs not in tools:
            continue
        r = t.run(list(snap.argv), timeout=30)
        if r.rc != 0:
            continue
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / f"{snap.name}.{when}.txt").write_text(r.stdout)
        parsed[snap.name] = snap.parse(r.stdout)
    return parsed


def from_artifacts(artifacts: Path, when: str) -> tuple[list[Row], dict]:
    """Rows and parsed values of the snapshots a cell stored (pure but for reading its files)."""
    rows, parsed = [], {}
    for snap in sources.snapshots():
        f = artifacts / f"{snap.name}.{when}.txt"
        if not f.is_file():
            continue
        d = snap.parse(f.read_text(errors="replace"))
        parsed[snap.name] = d
        rows += [Row(metric=k, value=v, phase=f"snapshot_{when}", test=snap.name) for k, v in snap.rows(d)]
    return rows, parsed
