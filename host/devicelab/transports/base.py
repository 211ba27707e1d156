"""The one transport interface. Everything above this package talks to a device only through it and
never learns whether it is the local machine, an SSH host or an adb phone.

Modelled on pyinfra's connectors: connect/close, run a command given as an argument list, put/get
files; plus the few things a measurement lab needs (background processes, sha256, facts)."""

from __future__ import annotations

import enum
import functools
import posixpath
import shlex
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from .. import paths
from ..errors import DevicelabError, RetryableError
from .commands import Command


@dataclass
class CommandResult:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


# sha256 of stdin on the device, first token of the output: OpenSSL where the device has it (SHA
# extensions: 4× coreutils' sha256sum on this VM, 0.34 s vs 1.35 s for 256 MiB), else sha256sum
# (coreutils, toybox, busybox), else shasum (macOS without openssl)
SHA256_STDIN = (
    "if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r; "
    "elif command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi"
)


@functools.cache
def put_script() -> str:
    """device_payloads/put.sh (write, verify, commit a pushed file) without its comment lines: it travels
    inline with every put, since it runs before any kit is on the device."""
    text = (paths.device_payloads_dir() / "put.sh").read_text()
    return "\n".join(ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")) + "\n"


@dataclass
class Commit:
    """What to do with a put file once the device's sha256 of it equals `sha`: chmod `mode`, rename it
    to `dst`, write `marker`."""

    dst: str
    marker: str
    sha: str
    mode: str | None = None


def quote_argv(argv: Sequence[str]) -> str:
    """The only way a command line is ever made for a remote shell: every argument shlex-quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def shell_command(argv: Sequence[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    """One remote shell command line from an argument list, optional environment and working folder."""
    cmd = quote_argv(argv)
    if env:
        cmd = quote_argv(["env", *[f"{k}={v}" for k, v in env.items()]]) + " " + cmd
    if cwd:
        cmd = f"cd {quote_argv([cwd])} && {cmd}"
    return cmd


class Platform(enum.Enum):
    """What a transport reaches, as far as choosing its llama.cpp build goes: build/choose.py picks the build from
    it. Transports say what a device is and build says what runs there, so build depends on transports and never
    the other way (the lab file's device settings name build's Backend literal, nothing more)."""

    THIS_HOST = enum.auto()  # this workstation itself
    ANDROID = enum.auto()  # an Android phone
    IOS = enum.auto()  # an iPhone or iPad: it runs only the devicelab app, built and signed on its Mac
    UNIX = enum.auto()  # a Linux board or a Mac: which, and its CPU, its facts say


class Transport(ABC):
    """A device the lab can run commands on and move files to and from."""

    name: str = "device"
    # what it reaches, for the choice of its build (None: no build target is known for it)
    platform: Platform | None = None
    # True where the device's payloads run on this host's own CPUs (the lab then measures alone on them)
    measures_on_host: bool = False
    # True where the device's facts come from its build (an app on a phone): a session makes the build first
    builds_before_facts: bool = False
    # False where the device has no POSIX shell for the kit's scripts: its transport does their work its own way
    # (an iPhone's app); `devicelab doctor` then checks no userland there
    shell: bool = True

    def host_key(self):
        """(key, what to show the user) for a device reached over SSH; others have no host key."""
        raise DevicelabError(f"{self.name} is not reached over SSH: it has no host key to trust")

    def trust_host_key(self, key) -> str:
        """Add `key` to the known_hosts file this device is checked against; returns that file."""
        raise DevicelabError(f"{self.name} is not reached over SSH: it has no host key to trust")

    def __enter__(self):
        self.connect()
        return self

    def __exit__(self, *exc):
        self.close()

    # optional hooks, empty for a transport with no connection to open or close (hence not abstract: B027)
    def connect(self) -> None:  # noqa: B027  # pragma: no cover - trivial default
        pass

    def close(self) -> None:  # noqa: B027  # pragma: no cover - trivial default
        pass

    @abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        """Run argv on the device, wait, return exit code and separate stdout/stderr."""

    @abstractmethod
    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to `remote` (parent directories are created)."""

    @abstractmethod
    def get(self, remote: str, local: Path) -> None:
        """Copy a device file back to `local`."""

    @abstractmethod
    def workdir(self) -> str:
        """The device folder devicelab owns (cache of binaries and models, per-cell outputs)."""

    @contextmanager
    def forward(self, remote_port: int) -> Iterator[int]:
        """A local TCP port on 127.0.0.1 that reaches 127.0.0.1:remote_port on the device while the
        context is open (llama-server evals). The default: the device is this machine."""
        yield remote_port

    # ---- what the lab asks of every device, built on run(); a device without a shell does each its own way ----
    def execute(
        self, cmd: Command, *, timeout: float | None = None, env: dict[str, str] | None = None
    ) -> CommandResult:
        """Run a structured command (transports/commands.py): a device with a POSIX shell runs its shell form."""
        return self.run(cmd.argv(), timeout=timeout, env=env)

    def alive(self, timeout: float = 30) -> bool:
        """Whether the device answers a command now."""
        return self.run(["true"], timeout=timeout).rc == 0

    def kill(self, pid: str, *, force: bool = False, timeout: float | None = None) -> bool:
        """Signal a device process to end (SIGTERM; SIGKILL with `force`); whether it was still there."""
        return self.run(["kill", *(["-9"] if force else []), str(pid)], timeout=timeout).rc == 0

    def remove(self, *remote: str, timeout: float | None = None) -> None:
        """Delete device files; one that is not there is no error."""
        self.run(["rm", "-f", *remote], timeout=timeout)

    def copy(self, src: str, dst: str) -> CommandResult:
        """Copy a device file to another device path."""
        return self.run(["cp", "-f", src, dst])

    def touch(self, remote: str, timeout: float | None = None) -> CommandResult:
        """Create (or empty) a device file: a marker."""
        return self.sh(': > "$1"', remote, timeout=timeout)

    def commands_present(self, names: Sequence[str], timeout: float | None = None) -> set[str]:
        """Which of the device commands `names` this device has: one round trip."""
        r = self.sh('for c in "$@"; do command -v "$c" >/dev/null 2>&1 && echo "$c"; done', *names, timeout=timeout)
        return set(r.stdout.split())

    # ---- generic helpers built on run(); transports may override with faster paths ----
    def sh(self, script: str, *args: str, timeout: float | None = None) -> CommandResult:
        """Run a fixed POSIX sh script with positional arguments ($1, $2 …) passed as separate argv
        entries: data never becomes code."""
        return self.run(["sh", "-c", script, "devicelab", *args], timeout=timeout)

    # the text files of one folder in one round trip, each between lines carrying a random token
    _GET_MANY = (
        'd=$1; tok=$2; shift 2; for f in "$@"; do [ -f "$d/$f" ] || continue; '
        'printf "@@%s %s\\n" "$tok" "$f"; cat "$d/$f"; printf "\\n@@%s\\n" "$tok"; done'
    )

    def get_many(self, remote_dir: str, names: Sequence[str], local_dir: Path) -> None:
        """Copy the text files `names` that exist in `remote_dir` to `local_dir`, in one round trip (a cell's
        outputs: a remote device pays one command, not one transfer per file); file by file if that fails."""
        import re
        import secrets

        tok = secrets.token_hex(8)
        r = self.run(["sh", "-c", self._GET_MANY, "devicelab", remote_dir, tok, *names], timeout=600)
        local_dir.mkdir(parents=True, exist_ok=True)
        if r.rc == 0:
            for m in re.finditer(rf"@@{tok} (\S+)\n(.*?)\n@@{tok}\n", r.stdout, re.S):
                if m.group(1) in names:
                    (local_dir / m.group(1)).write_text(m.group(2), encoding="utf-8", newline="")
            return
        for n in names:
            try:
                self.get(posixpath.join(remote_dir, n), local_dir / n)
            except OSError:
                pass

    def exists(self, remote: str) -> bool:
        return self.run(["test", "-e", remote]).rc == 0

    def mkdir(self, remote: str) -> None:
        r = self.run(["mkdir", "-p", remote])
        if r.rc != 0:
            raise OSError(f"mkdir -p {remote} failed on {self.name}: {r.stderr.strip()}")

    def sha256(self, remote: str) -> str | None:
        r = self.sh("{ " + SHA256_STDIN + '; } < "$1"', remote, timeout=600)
        if r.rc != 0 or not r.stdout.strip():
            return None
        return r.stdout.split()[0].lower()

    def put_verified(self, local: Path, remote: str, commit: Commit | None = None) -> str | None:
        """Send `local` to `remote` and return the sha256 the device computed of the file it wrote. With
        `commit`, a file whose sha256 equals commit.sha is also made final on the device (mode, rename,
        marker). Transports override this to do it all in one round trip."""
        self.put(local, remote)
        got = self.sha256(remote)
        if commit is not None and got == commit.sha:
            self.commit(remote, commit)
        return got

    def commit(self, remote: str, c: Commit) -> None:
        r = self.sh(put_script(), "commit", remote, "-", c.sha, c.dst, c.marker, c.mode or "")
        if r.rc != 0:
            raise RetryableError(f"could not finish {posixpath.basename(c.dst)} on {self.name}: {r.stderr.strip()}")

    def read_text(self, remote: str) -> str | None:
        r = self.run(["cat", remote])
        return r.stdout if r.rc == 0 else None
