"""Measurement conditions as context managers that record their own provenance (pyperf's hooks): each
sets up what it promises on entry, puts the device back on exit — on success, failure or Ctrl-C — and
says in `provenance` (row columns) and `env` (for run_payload.sh) what it did. The telemetry sources bring their
own (charging hygiene, what runs beside the payload): telemetry/sources/."""

from __future__ import annotations

import posixpath
from typing import Callable

from ..kinds.base import SkipCell
from ..transports.base import Transport, quote_argv
from ..transports.commands import KitScript


class Condition:
    env: dict[str, str]
    provenance: dict

    def __init__(self):
        self.env, self.provenance = {}, {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Quota(Condition):
    """A CPU quota in cores through a cgroup the lab creates (device_payloads/cgroup.sh) and removes."""

    def __init__(self, t: Transport, kit: str, name: str, cores: float, device: str):
        super().__init__()
        self.t, self.kit, self.name, self.cores, self.device = t, kit, name, cores, device
        self.cgroup = None
        self.provenance = {"cpu_quota": cores}

    def __enter__(self):
        create = ("create", self.name, str(int(self.cores * 100000)), "100000")
        r = self.t.execute(KitScript(self.kit, "cgroup.sh", create))
        out = r.stdout.strip()
        if not out or out.startswith("unsupported"):
            raise SkipCell(f"CPU quota not available on {self.device}: {out or r.stderr.strip()}")
        self.cgroup = out.split(" ", 1)[1]
        self.env["DEVICELAB_CGROUP"] = self.cgroup
        return self

    def __exit__(self, *exc):
        if self.cgroup:
            try:
                self.t.execute(KitScript(self.kit, "cgroup.sh", ("remove", self.cgroup)))
            except Exception:  # the device went away: the cell's own error says so
                if exc[0] is None:
                    raise
        return False


class Contention(Condition):
    """Busy-looping co-runners beside the payload (run_payload.sh starts and stops them)."""

    def __init__(self, n: int):
        super().__init__()
        self.provenance = {"contention": n}
        if n:
            self.env["DEVICELAB_CONTENTION"] = str(n)


class Governor(Condition):
    """Pin every CPU clock policy's governor (directly, or through `su -c` on a rooted phone) for a device's cells and
    put the old governors back afterwards; `governor` in every row says pinned or why not."""

    def __init__(self, t: Transport, kit: str, wanted: str, telemetry_root: str, warn: Callable[[str], None]):
        super().__init__()
        self.t, self.kit, self.wanted, self.root, self.warn = t, kit, wanted, telemetry_root, warn
        self.state = posixpath.join(t.workdir(), "governor.saved")

    def _cmd(self, args: list[str]) -> str:
        cmd = KitScript(self.kit, "governor.sh", tuple(args))
        out = self.t.execute(cmd, timeout=60).stdout.strip()
        if "permission denied" in out:  # a rooted phone: the same script as root, through su's shell
            su = self.t.run(["su", "-c", quote_argv(cmd.argv())], timeout=60)
            if su.rc == 0 and su.stdout.strip():
                out = su.stdout.strip()
        return out

    def __enter__(self):
        out = self._cmd(["set", self.wanted, self.state, self.root])
        if not out.startswith("pinned"):
            self.warn(
                f"governor {self.wanted} not pinned ({out or 'no answer'}); measuring with the device's own governor"
            )
            out = f"not pinned: {out}"
        self.provenance = {"governor": out}
        return self

    def __exit__(self, *exc):
        if self.provenance.get("governor", "").startswith("pinned"):
            try:
                self._cmd(["restore", self.state, self.root])
            except Exception:
                if exc[0] is None:
                    raise
        return False
