"""Host-side subprocess helpers: argument lists only (never shell strings), with log tails on failure."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Sequence

from .errors import DevicelabError


def tail(text: str, n: int = 25) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-n:])


def run_logged(
    argv: Sequence[str | Path],
    log: Path,
    *,
    cwd: Path | None = None,
    env: dict | None = None,
    what: str = "command",
    hint: str = "",
) -> None:
    """Run argv with stdout+stderr appended to `log`; raise a one-line DevicelabError carrying the
    log tail if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        fh.write(("\n$ " + " ".join(map(str, argv)) + "\n").encode())
        fh.flush()
        try:
            rc = subprocess.call(list(map(str, argv)), stdout=fh, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        except FileNotFoundError as e:
            raise DevicelabError(f"{what} failed: {e.filename} not found{'; ' + hint if hint else ''}") from e
    if rc != 0:
        text = log.read_text(errors="replace")
        err_lines = [l for l in text.splitlines() if "error" in l.lower()]
        first = err_lines[0].strip() if err_lines else f"exit status {rc}"
        raise DevicelabError(
            f"{what} failed ({first[:200]}); full log: {log}{'; ' + hint if hint else ''}", detail=tail(text)
        )
