"""adb transport (adbutils, through the adb host server) for Android phones over USB or Wi-Fi.

Device states are handled as a lab needs them: `unauthorized` is one line telling the user to accept the
prompt on the phone; `offline` gets a bounded automatic reconnect, then a retryable failure of that
device only; a device that vanishes mid-cell fails the cell as retryable. Commands use shell v2 (exit
code and separate stderr) when the device offers it, and are always quoted argument lists."""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import stat
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import adbutils
from adbutils import AdbClient, AdbError, AdbTimeout

from ..errors import DevicelabError, RetryableError
from .base import CommandResult, Platform, Transport, shell_command

CLI_MIN_BYTES = 8 << 20  # larger pushes go through the `adb` client binary when it matches the server
WORKDIR = "/data/local/tmp/devicelab"  # not shared storage: mmap from /sdcard is slow (FUSE)
_EXIT = "DEVICELAB_EXIT:"


class ADBTransport(Transport):
    platform = Platform.ANDROID

    def __init__(
        self,
        name: str,
        serial: str | None,
        adb_host: str = "127.0.0.1",
        adb_port: int = 5037,
        workdir: str | None = None,
        reconnect_tries: int = 3,
        reconnect_wait: float = 1.0,
        connect_timeout: float = 10.0,
    ):
        self.name = name
        self.serial = serial
        self.client = AdbClient(host=adb_host, port=adb_port, socket_timeout=30)
        self._workdir = workdir or WORKDIR
        self.tries, self.wait, self.connect_timeout = reconnect_tries, reconnect_wait, connect_timeout
        self._gave_up = False  # the last connect() used up its tries: the next makes one check, no back-off
        self.dev: adbutils.AdbDevice | None = None
        self.v2 = False
        self._cli: str | None = None

    @classmethod
    def from_device(cls, d) -> "ADBTransport":
        return cls(d.name, d.serial, d.adb_host, d.adb_port, d.workdir)

    # ---------------------------------------------------------------- states
    def _state(self) -> str | None:
        try:
            for info in self.client.list():
                if info.serial == self.serial:
                    return info.state
        except (AdbError, OSError) as e:
            raise DevicelabError(
                f"cannot talk to the adb server at {self.client.host}:{self.client.port} ({e}); "
                "start it with `adb start-server`"
            ) from e
        return None

    def connect(self) -> None:
        if self.serial is None:
            devs = [i for i in self.client.list() if i.state == "device"]
            if len(devs) != 1:
                raise DevicelabError(
                    f"device {self.name!r} has no serial and {len(devs)} phones are attached; "
                    "set serial: in the lab file (see `adb devices`)"
                )
            self.serial = devs[0].serial
        tries = 0 if self._gave_up else self.tries
        for attempt in range(tries + 1):
            st = self._state()
            if st is None and ":" in self.serial:  # Wi-Fi adb: host:port
                try:
                    self.client.connect(self.serial, timeout=self.connect_timeout)
                except (AdbError, AdbTimeout, OSError):
                    pass
                st = self._state()
            if st == "device":
                self._gave_up = False
                self.dev = self.client.device(self.serial)
                try:
                    self.v2 = "shell_v2" in self.dev.get_features().split(",")
                except (AdbError, OSError):
                    self.v2 = False
                return
            if st == "unauthorized":
                raise DevicelabError(
                    f"phone {self.serial} ({self.name}) is unauthorized: unlock it and accept the "
                    "'Allow USB debugging?' prompt (tick 'Always allow'), then run again"
                )
            if attempt < tries:
                if st == "offline" and ":" in self.serial:
                    try:
                        self.client.disconnect(self.serial)
                    except (AdbError, OSError):
                        pass
                self._back_off(self.wait * (attempt + 1))
        self._gave_up = True  # a session's later steps (putting the phone back, the lane's check) do not wait again
        what = "offline" if st == "offline" else "not connected"
        raise RetryableError(
            f"phone {self.serial} ({self.name}) is {what} after {self.tries} reconnect tries; "
            "check the cable / Wi-Fi and `adb devices`, then run again"
        )

    def _back_off(self, seconds: float) -> None:
        """Wait `seconds` before the next try, or less: a phone plugged back in meanwhile is taken at once."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(0.2, left))
            if self._state() == "device":
                return

    def close(self) -> None:
        self.dev = None

    def _d(self) -> adbutils.AdbDevice:
        if self.dev is None:
            self.connect()
        return self.dev

    def _lost(self, e: Exception, what: str) -> RetryableError:
        self.dev = None
        return RetryableError(f"lost phone {self.serial} ({self.name}) while {what}: {e}")

    # ---------------------------------------------------------------- commands
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        cmd = shell_command(argv, cwd=cwd, env=env)
        d = self._d()
        try:
            if self.v2:
                r = d.shell2(cmd, timeout=timeout, v2=True, rstrip=False)
                return CommandResult(list(argv), r.returncode, r.stdout, r.stderr)
            # shell v1 has no exit code and merges stderr: mark the exit code, keep stderr apart in a file
            out = d.shell(f"{cmd}; echo {_EXIT}$?", timeout=timeout, rstrip=False)
        except AdbTimeout:
            return CommandResult(list(argv), 124, "", f"timed out after {timeout}s")
        except (AdbError, OSError, EOFError) as e:
            raise self._lost(e, f"running {argv[0]}") from e
        i = out.rfind(_EXIT)
        if i < 0:
            raise self._lost(RuntimeError("no exit status"), f"running {argv[0]}")
        return CommandResult(list(argv), int(out[i + len(_EXIT) :].strip() or 255), out[:i], "")

    # ---------------------------------------------------------------- files
    def adb_cli(self) -> str | None:
        """The `adb` client on PATH, when its protocol version is the running server's: a client of another
        version would kill and restart the user's server. Its push is ~3× adbutils' sync push (measured:
        bench/adb_push.py); None means adbutils' own sync push is used."""
        if self._cli is None:
            self._cli = ""
            exe = shutil.which("adb")
            if exe:
                try:
                    out = subprocess.run([exe, "version"], capture_output=True, text=True, timeout=10).stdout
                    m = re.search(r"version \d+\.\d+\.(\d+)", out)
                    if m and int(m.group(1)) == self.client.server_version():
                        self._cli = exe
                except (OSError, subprocess.TimeoutExpired, AdbError, ValueError):
                    pass
        return self._cli or None

    def put(self, local: Path, remote: str) -> None:
        cli = self.adb_cli() if os.path.getsize(local) >= CLI_MIN_BYTES else None
        if cli:  # `adb push` makes the parent folders itself
            assert self.serial is not None, "connect() picks the phone"
            argv = [
                cli,
                "-H",
                str(self.client.host),
                "-P",
                str(self.client.port),
                "-s",
                self.serial,
                "push",
                str(local),
                remote,
            ]
            try:
                r = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    errors="replace",
                    timeout=120 + os.path.getsize(local) / (1 << 20),
                )
            except subprocess.TimeoutExpired as e:
                raise self._lost(e, f"pushing {Path(local).name}") from e
            if r.returncode != 0:
                raise self._lost(RuntimeError((r.stderr or r.stdout).strip()[-200:]), f"pushing {Path(local).name}")
            return
        self.mkdir(posixpath.dirname(remote))
        try:
            self._d().sync.push(str(local), remote, mode=0o644)
        except (AdbError, OSError, EOFError) as e:
            raise self._lost(e, f"pushing {Path(local).name}") from e

    def get(self, remote: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(local) + ".part")
        try:
            # (sync.pull of a path that does not exist pulls it as an empty folder: stat it first)
            if not stat.S_ISREG(self._d().sync.stat(remote).mode):
                raise OSError(f"{remote} is not a file")
            self._d().sync.pull_file(remote, str(tmp))
        except (AdbError, OSError, EOFError) as e:
            tmp.unlink(missing_ok=True)
            raise OSError(f"pull of {remote} from {self.name} failed: {e}") from e
        tmp.replace(local)

    def workdir(self) -> str:
        return self._workdir

    @contextmanager
    def forward(self, remote_port: int) -> Iterator[int]:
        """A free local port forwarded by the adb server to tcp:remote_port on the phone (llama-server
        evals); the forward is removed when the context closes."""
        try:
            local = self._d().forward_port(remote_port)
        except (AdbError, OSError) as e:
            raise self._lost(e, "forwarding a port") from e
        try:
            yield local
        finally:
            try:
                self._d().forward_remove(f"tcp:{local}", raise_non_found=False)
            except (AdbError, OSError):
                pass
