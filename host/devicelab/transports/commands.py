"""What the lab asks a device to run, as data: a script of the lab's kit, a payload under the kit's sampler, one
sample of the sampler. The cell, the kit and the telemetry sources build these; a transport runs them —
`Transport.execute` renders the shell form for a device with a POSIX shell (`argv()`), the iOS transport hands the
same fields to its app's harness. Nothing reads a command back out of its text."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass


@dataclass(frozen=True)
class KitScript:
    """One of the kit's scripts (device_payloads/*.sh, pushed to the device folder `kit`) with its arguments."""

    kit: str
    script: str  # its file name: facts.sh, thermal.sh, cgroup.sh, governor.sh
    args: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return ["sh", posixpath.join(self.kit, self.script), *map(str, self.args)]


@dataclass(frozen=True)
class PayloadRun:
    """A llama.cpp tool run under the kit's sampler (run_payload.sh): its outputs, the sampler's telemetry.csv, its
    pids, exit code and peak RSS in the device folder `out`, sampled every `interval_ms` from `telemetry_root`."""

    kit: str
    out: str
    interval_ms: int
    telemetry_root: str
    tool: str  # the tool's path on the device
    args: tuple[str, ...] = ()
    prefix: tuple[str, ...] = ()  # what the device runs the tool through (a lab file's exec_prefix: qemu, taskset)

    @property
    def tool_name(self) -> str:
        return posixpath.basename(self.tool)

    def argv(self) -> list[str]:
        runner = ["sh", posixpath.join(self.kit, "run_payload.sh"), self.out, str(self.interval_ms)]
        return [*runner, self.telemetry_root, "--", *self.prefix, self.tool, *map(str, self.args)]


@dataclass(frozen=True)
class SampleOnce:
    """The sampler on its own for `n` ticks of `interval_ms` (sampler.sh -o): what a device's telemetry reads now,
    into the device file `out`."""

    kit: str
    out: str
    n: int
    interval_ms: int
    telemetry_root: str

    def argv(self) -> list[str]:
        opts = ["-o", self.out, "-n", str(self.n), "-i", str(self.interval_ms), "-R", self.telemetry_root]
        return ["sh", posixpath.join(self.kit, "sampler.sh"), *opts]


Command = KitScript | PayloadRun | SampleOnce
