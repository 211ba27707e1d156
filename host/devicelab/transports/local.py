"""The workstation itself as a device: commands run as subprocesses, files are hard-linked or copied."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from .. import paths
from .base import CommandResult, Platform, Transport


class LocalTransport(Transport):
    measures_on_host = True
    platform = Platform.THIS_HOST

    def __init__(self, name: str = "local", root: str | None = None):
        self.name = name
        self._root = Path(root).expanduser() if root else paths.sub("device-local") / name

    def workdir(self) -> str:
        self._root.mkdir(parents=True, exist_ok=True)
        return str(self._root)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        full_env = None
        if env:
            full_env = dict(os.environ)
            full_env.update(env)
        try:
            p = subprocess.run(
                [str(a) for a in argv],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                cwd=cwd,
                env=full_env,
            )
        except FileNotFoundError as e:
            return CommandResult(list(map(str, argv)), 127, "", f"{e.filename}: not found")
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return CommandResult(list(map(str, argv)), 124, out, f"timed out after {timeout}s")
        return CommandResult(list(map(str, argv)), p.returncode, p.stdout, p.stderr)

    def put(self, local: Path, remote: str) -> None:
        dst = Path(remote)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists():
            dst.unlink()
        try:
            os.link(local, dst)  # same filesystem: no copy, identical bytes
        except OSError:
            shutil.copyfile(local, dst)

    def get_many(self, remote_dir: str, names, local_dir: Path) -> None:
        """This machine's own files: copied directly."""
        for n in names:
            if (Path(remote_dir) / n).is_file():
                self.get(str(Path(remote_dir) / n), local_dir / n)

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(remote, local)
