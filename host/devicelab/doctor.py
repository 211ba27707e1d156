"""`devicelab doctor`: first contact with a user's device. Every assumption the lab makes about a device, checked
and said as a checklist — ✓, or ✗ with its fix beside it (! where the lab works, but with less) — and the bundle of
everything the lab read there, which becomes entries of the corpus of real captures (tests/fixtures/real/) with one
command (`--bundle-to-fixture`).

The checks run the lab's own parts, in the order a run needs them: the transport (reachable), the commands the
device scripts call (device_payloads/*.sh), the work folder, a verified push (push.py), the kit and the device's
facts (facts.sh), the build target it chose and why (runner/session.target_for), each telemetry source's probe line
with what it reads now (telemetry/sources: no source is named here), the sampler at a recipe's rate, the clock
offset, and a short bench cell through the lab's own runner. Nothing here knows a transport or a source by name."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import captures, push
from . import facts as factsmod
from . import kit as kitmod
from .budget import MEMINFO
from .errors import DevicelabError
from .runner.lane import Events
from .schema import METRICS
from .telemetry import sampler_csv, sources
from .telemetry.normalize import NO_POWER
from .transports import open_transport
from .transports.commands import KitScript, SampleOnce

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
MARK = {OK: "✓", WARN: "!", FAIL: "✗", SKIP: "-"}

# the commands device_payloads/*.sh and the transports run on a device with a shell, and what needs each
REQUIRED = {
    "sh": "every device script",
    "cat": "reading a file back",
    "mkdir": "the work folder",
    "rm": "clearing a cell's folder",
    "cp": "installing the kit",
    "mv": "committing a verified push (put.sh)",
    "chmod": "making a pushed tool executable (put.sh)",
    "wc": "the size check of a push (put.sh)",
    "test": "the transports' file checks",
    "mkfifo": "the payload's output timed line by line (run_payload.sh)",
    "date": "a cell's clock (run_payload.sh)",
    "dirname": "finding the kit (run_payload.sh)",
    "kill": "stopping a payload",
    "sleep": "the sampler's pacing where the shell has no `read -t`",
    "uname": "the device facts (facts.sh)",
    "grep": "the device facts (facts.sh)",
    "cut": "the device facts (facts.sh)",
    "sort": "the cores by part (facts.sh)",
    "uniq": "the cores by part (facts.sh)",
    "head": "the device's cgroup (facts.sh)",
    "df": "the work folder's free space (facts.sh)",
}
ANY_OF = {
    ("openssl", "sha256sum", "shasum"): "the sha256 of a pushed file (verified pushes)",
    ("getconf", "sysctl"): "the CPU count and the page size (facts.sh, sampler.sh)",
}
OPTIONAL = {
    "awk": "the sampler reads a tick with one long-lived awk; without it the shell reads files a byte at a time",
    "dd": "a large push is hashed while it is written; without dd, after",
}
USERLAND_FIX = (
    "install them on the device (one busybox or toybox binary has them all) or put them on the PATH its shell gets"
)
NATIVE_BUILD_TOOLS = ("cmake", "cc", "c++")  # a target built on the device itself
MIN_FREE, LOW_FREE = 512 << 20, 2 << 30
PUSH_BYTES = 1 << 20
SAMPLER_SECONDS = 2.0
CLOCK_WARN_S = 2.0
DOCTOR_RECIPE = "doctor"
# the lab's bench cell at first contact: SmolLM2 q8_0, one short prefill and decode (seconds on a phone)
BENCH_RECIPE = """name: doctor
devices: [{device}]
models: [{{name: smollm2-135m}}]
quants: [q8_0]
payloads:
  - {{kind: bench, prompt: [32], gen: [16], repetitions: 2}}
recommend: {{context: 512}}
"""
VERSIONS = r"""echo "uname: $(uname -a 2>/dev/null)"
echo "user: $(id -un 2>/dev/null)"
s=$(command -v sh); echo "sh: $s $(ls -l "$s" 2>/dev/null | sed 's/.* -> /-> /;/->/!d')"
for c in busybox toybox mksh bash awk openssl cmake cc; do
  command -v "$c" >/dev/null 2>&1 || continue
  case $c in
    busybox) v=$(busybox 2>&1 | head -n1) ;;
    mksh) v=$(mksh -c 'echo "$KSH_VERSION"' 2>&1) ;;
    awk) v=$(awk -W version 2>/dev/null < /dev/null | head -n1)
         [ -n "$v" ] || v=$(awk --version 2>&1 < /dev/null | head -n1) ;;
    openssl) v=$(openssl version 2>&1) ;;
    *) v=$("$c" --version 2>&1 < /dev/null | head -n1) ;;
  esac
  echo "$c: $v"
done"""
# `grep . FILES` of each folder the sampler described and of each file it read (paths relative to ROOT)
GREP_FILES = r"""cd "$1" 2>/dev/null || exit 1; shift
for p in "$@"; do
  if [ -d "$p" ]; then grep . "$p"/* /dev/null; elif [ -r "$p" ]; then grep . "$p" /dev/null; fi
done 2>/dev/null; exit 0"""
# the raw texts facts.sh reads on some devices, kept whole in the bundle: (its format, the command)
FACT_CAPTURES = (
    ("cpuinfo", ("cat", "/proc/cpuinfo")),
    ("getprop", ("getprop",)),
    (MEMINFO.replace(" ", "-"), tuple(MEMINFO.split())),
    ("vm-stat", ("vm_stat",)),
    ("memory-pressure", ("memory_pressure", "-Q")),
    ("sysctl", ("sysctl", "hw.memsize", "hw.ncpu", "machdep.cpu.brand_string", "machdep.cpu.features")),
)


# ==================================================================== what a visit finds
@dataclass
class Check:
    title: str
    state: str  # OK | WARN | FAIL | SKIP
    detail: str
    fix: str = ""


@dataclass
class Capture:
    """One raw text the lab read from the device, as the bundle keeps it."""

    name: str  # its file name in the bundle
    text: str
    what: str  # how it was read (the command), said in the manifest and the fixture's note
    format: str | None = None  # the capture format whose reader takes it (captures.formats())
    expect: dict | None = None  # what that reader took from it, live
    unsupported: str | None = None  # or why the reader refused it


@dataclass
class DeviceReport:
    name: str
    transport: str
    model: str = ""
    checks: list[Check] = field(default_factory=list)
    captures: list[Capture] = field(default_factory=list)
    bench_rows: list[dict] = field(default_factory=list)
    secrets: dict[str, set[str]] = field(default_factory=dict)  # kind → values the bundle must not carry

    @property
    def failed(self) -> bool:
        return any(c.state == FAIL for c in self.checks)


class _Stop(Exception):
    """A check failed that every later one needs."""


@dataclass
class _Visit:
    dev: Any
    rep: DeviceReport
    say: Callable[[Check], None]
    lab_path: Path | None
    lab_dir: Path
    t: Any = None
    kit: str = ""
    facts: dict = field(default_factory=dict)
    tools: set = field(default_factory=set)
    trace: sampler_csv.SamplerTrace | None = None
    asked_ms: int = 100
    stage: Callable[[str], None] = lambda text: None

    def add(self, title: str, state: str, detail: str, fix: str = "") -> Check:
        c = Check(title, state, " ".join(detail.split()), " ".join(fix.split()))
        self.rep.checks.append(c)
        self.say(c)
        return c

    def keep(self, name: str, text: str, what: str, fmt: str | None = None) -> Capture:
        c = Capture(name, text, what, fmt if fmt in captures.formats() else _format_of(name))
        if c.format:
            c.expect, c.unsupported = read_live(c.format, text, name)
        self.rep.captures.append(c)
        return c

    def secret(self, kind: str, value: Any) -> None:
        if isinstance(value, str) and value.strip():
            self.rep.secrets.setdefault(kind, set()).add(value.strip())

    @property
    def shell(self) -> bool:
        return bool(getattr(self.t, "shell", True))


def _format_of(name: str) -> str | None:
    stem = name.split(".", 1)[0]
    return stem if stem in captures.formats() else None


def read_live(fmt: str, text: str, name: str) -> tuple[dict | None, str | None]:
    """What the lab's reader of `fmt` takes from a text the device printed now (or why it refuses it)."""
    with tempfile.TemporaryDirectory(prefix="devicelab-doctor-") as d:
        p = Path(d) / name
        p.write_text(text, encoding="utf-8", newline="")
        try:
            return captures.read(fmt, p), None
        except captures.Unsupported as e:
            return None, " ".join(str(e).split())
        except Exception as e:  # a reader that breaks on a real device is a finding, said in the bundle
            return None, f"the reader failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}"


# ==================================================================== the checks
def examine(
    dev,
    lab_path: Path | None = None,
    lab_dir: Path = Path("labdata"),
    bench: bool = True,
    say: Callable[[Check], None] = lambda c: None,
    stage: Callable[[str], None] = lambda text: None,
) -> DeviceReport:
    """Every check on one device of the lab file, in the order a run needs them; a failure that every later check
    needs ends the visit there (said)."""
    v = _Visit(dev, DeviceReport(dev.name, dev.transport), say, lab_path, Path(lab_dir), stage=stage)
    for kind, attr in (("serial", "serial"), ("serial", "udid"), ("host", "host"), ("user", "user")):
        v.secret(kind, getattr(dev, attr, None))
    v.secret("token", getattr(dev, "team_id", None))
    mac = getattr(dev, "mac_ssh", None)
    for kind, attr in (("host", "host"), ("user", "user")):
        v.secret(kind, getattr(mac, attr, None))
    steps = (_reachable, _app, _userland, _workdir, _push, _facts, _target, _telemetry, _sampler, _clock)
    try:
        for step in steps:
            _guarded(v, step)
        if bench:
            _guarded(v, _bench)
        else:
            v.add("bench cell", SKIP, "skipped (--no-bench)")
    except _Stop:
        v.add("the other checks", SKIP, "skipped: each needs what failed above")
    finally:
        if v.t is not None:
            try:
                v.t.close()
            except Exception:  # closing a link that broke
                pass
    return v.rep


def _guarded(v: _Visit, step) -> None:
    """A step; an error it did not expect is its check failing, with the error (doctor goes on)."""
    try:
        step(v)
    except _Stop:
        raise
    except Exception as e:  # doctor says what broke and goes on to the next check
        title = (step.__doc__ or step.__name__).strip().splitlines()[0].rstrip(".")
        v.add(
            title,
            FAIL,
            f"{type(e).__name__}: {e}" if not isinstance(e, DevicelabError) else str(e),
            "fix what the message says and run doctor again; if it looks like devicelab's fault, attach "
            "`devicelab doctor --bundle FILE` to a bug report",
        )
        if step in (_reachable, _app, _facts):
            raise _Stop from None


def _entry(dev) -> str:
    d = dev.model_dump(exclude_defaults=True, exclude={"name", "mac_ssh"})
    return ", ".join(f"{k}: {v}" for k, v in d.items()) or "defaults"


def _reachable(v: _Visit) -> None:
    """reachable"""
    t0 = time.time()
    try:
        v.t = open_transport(v.dev)
        v.t.connect()
        err = "" if v.t.alive(timeout=60) else "connected, but the device did not answer a command"
    except Exception as e:  # whatever stops the link is this check's answer
        err = " ".join(str(e).split()) or type(e).__name__
    if err:
        v.add(
            "reachable",
            FAIL,
            err,
            f"check that {v.dev.name} is on and reachable as its lab entry says ({_entry(v.dev)}); "
            f"then run `devicelab doctor {v.dev.name}` again",
        )
        raise _Stop
    v.add("reachable", OK, f"{v.dev.transport} link up, a command ran in {time.time() - t0:.1f} s")


def _app(v: _Visit) -> None:
    """device app"""
    if not v.t.builds_before_facts:
        return
    # its facts and its file operations are its build's (an app on a phone): built and installed first, as a run does
    from .build import ios
    from .build import source as sourcemod
    from .runner.session import target_for

    t0 = time.time()
    tgt, _ = target_for(v.t, v.dev, {})
    ios.ensure(v.t, sourcemod.resolve(None), tgt)
    v.add("device app", OK, f"{tgt.name}: built and installed in {time.time() - t0:.0f} s (its facts are the app's)")


def _userland(v: _Visit) -> None:
    """shell and userland"""
    if not v.shell:
        v.add("shell and userland", OK, "none needed: its transport does the device scripts' work itself")
        return
    names = [*REQUIRED, *[c for group in ANY_OF for c in group], *OPTIONAL]
    found = v.t.commands_present(names, timeout=60)
    v.tools = sources.detect(v.t)
    missing = [f"{c} ({why})" for c, why in REQUIRED.items() if c not in found]
    missing += [f"one of {', '.join(g)} ({why})" for g, why in ANY_OF.items() if not set(g) & found]
    versions = v.t.sh(VERSIONS, timeout=60).stdout
    v.keep("versions.txt", versions, "the device's shell, userland and tools, with their versions")
    user = re.search(r"^user: (\S+)", versions, re.M)
    v.secret("user", user.group(1) if user else None)
    sh = re.search(r"^sh: (.*)$", versions, re.M)
    if missing:
        v.add("shell and userland", FAIL, f"missing: {'; '.join(missing)}", USERLAND_FIX)
        return
    opt = [f"{c} ({why})" for c, why in OPTIONAL.items() if c not in found]
    n = len(REQUIRED) + len(ANY_OF)
    shell = sh.group(1).strip() if sh else "sh"
    if opt:
        v.add(
            "shell and userland",
            WARN,
            f"{shell}; the {n} commands the scripts need are there; without {'; '.join(opt)}",
            f"for the best: {USERLAND_FIX}",
        )
    else:
        v.add("shell and userland", OK, f"{shell}; all {n + len(OPTIONAL)} commands the device scripts call are there")


def _workdir(v: _Visit) -> None:
    """work folder"""
    wd = v.t.workdir()
    probe = posixpath.join(wd, "doctor", f"w-{os.getpid()}")
    try:
        v.t.mkdir(posixpath.dirname(probe))
        v.t.touch(probe, timeout=60)
        ok = v.t.exists(probe)
    except (DevicelabError, OSError) as e:
        ok, why = False, str(e)
    else:
        why = "a file written there is not there"
    if not ok:
        v.add(
            "work folder",
            FAIL,
            f"{wd} is not writable: {why}",
            "give the device entry a `workdir:` the transport's user may write (and with a few GB free)",
        )
        raise _Stop
    v.t.remove(probe, timeout=60)
    v.add("work folder", OK, f"{wd} is writable (its free space: with the facts below)")


def _push(v: _Visit) -> None:
    """verified push"""
    data = hashlib.shake_256(b"devicelab doctor").digest(PUSH_BYTES)  # the same bytes every time: one cache entry
    sha, name = hashlib.sha256(data).hexdigest(), "doctor-push.bin"
    dst = push.remote_path(v.t, sha, name)
    v.t.remove(dst + ".ok", dst, timeout=60)  # sent again, whatever an earlier doctor left
    with tempfile.TemporaryDirectory(prefix="devicelab-doctor-") as d:
        src = Path(d) / name
        src.write_bytes(data)
        t0 = time.time()
        got = push.ensure(v.t, src, sha, name)
        dt = time.time() - t0
    again = push.present(v.t, sha, name)
    there = v.t.sha256(got)
    v.t.remove(got + ".ok", got, timeout=60)
    if there != sha or again != got:
        v.add(
            "verified push",
            FAIL,
            f"the device's copy hashes to {there} (sent {sha[:16]}…)",
            "check the link and the device's free storage, then run doctor again",
        )
        return
    rate = PUSH_BYTES / max(dt, 1e-3) / 1e6
    v.add(
        "verified push",
        OK,
        f"{PUSH_BYTES >> 20} MiB sent, its sha256 checked on the device and committed in {dt:.2f} s "
        f"({rate:.1f} MB/s); an unchanged file is never sent again",
    )


def _facts(v: _Visit) -> None:
    """device facts"""
    v.kit = kitmod.ensure(v.t)
    r = v.t.execute(KitScript(v.kit, "facts.sh", (v.t.workdir(), v.dev.telemetry_root)), timeout=120)
    v.keep("facts.txt", r.stdout, "facts.sh: the device facts every row carries")
    v.facts = f = factsmod.parse(r.stdout, type(v.t).__name__)
    v.secret("host", f.get("hostname"))
    v.rep.model = device_model(f)
    if v.shell:
        for fmt, argv in FACT_CAPTURES:
            if not (v.t.exists(argv[1]) if argv[0] == "cat" else argv[0] in _found(v, argv[0])):
                continue
            out = v.t.run(list(argv), timeout=120)
            if out.rc == 0 and out.stdout.strip():
                v.keep(f"{fmt}.txt", out.stdout, " ".join(argv), fmt)
    if not f.get("uname") and not f.get("os"):
        v.add(
            "device facts",
            FAIL,
            f"facts.sh printed nothing the lab can use (exit {r.rc}: {r.stderr.strip()[:200]})",
            "run the kit's facts.sh on the device by hand and attach its output to a bug report",
        )
        raise _Stop
    mem = f.get("mem_total_bytes")
    v.add(
        "device facts",
        OK,
        f"{v.rep.model}; {f.get('cpu_count') or '?'} CPUs" + (f", {mem / 2**30:.1f} GiB RAM" if mem else ""),
    )
    _free_space(v)


def _found(v: _Visit, cmd: str) -> set[str]:
    return v.t.commands_present([cmd], timeout=60)


def _free_space(v: _Visit) -> None:
    free = v.facts.get("storage_free_bytes")
    if free is None:
        v.add(
            "free space",
            WARN,
            "the device did not say (df printed nothing the lab reads)",
            "make sure `df -Pk WORKDIR` works on the device",
        )
    elif free < MIN_FREE:
        v.add(
            "free space",
            FAIL,
            f"{free / 2**20:.0f} MiB free in the work folder: a model and a build need more",
            "free space on the device, or give its entry a `workdir:` on a bigger disk",
        )
    else:
        state = WARN if free < LOW_FREE else OK
        v.add(
            "free space",
            state,
            f"{free / 2**30:.1f} GiB free in the work folder",
            "larger models and a few builds need several GB" if state == WARN else "",
        )


def device_model(f: dict) -> str:
    """The device as a person names it, from its facts: 'Pixel 8 (Tensor G3), Android 14 (SDK 34)'."""
    name = f.get("ios.marketing_name") or f.get("android.model") or f.get("ios.model") or f.get("cpu.model") or ""
    chip = f.get("android.soc") or f.get("ios.chip") or ""
    os_ = f.get("os") or f.get("uname") or ""
    head = f"{name} ({chip.strip()})" if chip.strip() and name else name or f.get("arch") or "unknown device"
    return f"{head}, {os_}" if os_ else head


# ---------------------------------------------------------------- the build target
ARM_FLAG_FEATURES = ("asimddp", "i8mm", "sve", "asimdhp")  # what GGML_CPU_ARM_ARCH is made from (build/targets)


def _target(v: _Visit) -> None:
    """build target"""
    from . import probe
    from .build import targets
    from .runner.session import target_for

    tgt, warnings = target_for(v.t, v.dev, v.facts)
    why = f"the lab file's `target: {v.dev.target}`" if v.dev.target else "this device's default (from its facts)"
    fl = tgt.cmake_flags()
    if "GGML_CPU_ARM_ARCH" in fl:
        given = "the lab file's cpu_features" if v.dev.cpu_features else "its /proc/cpuinfo Features"
        feats = set((v.dev.cpu_features or v.facts.get("cpu.features") or "").split())
        have = [x for x in ARM_FLAG_FEATURES if x in feats] or ["none of " + ", ".join(ARM_FLAG_FEATURES)]
        cpu = f"GGML_CPU_ARM_ARCH={fl['GGML_CPU_ARM_ARCH']} from {given} ({', '.join(have)})"
    elif fl.get("GGML_NATIVE") == "ON":
        cpu = "GGML_NATIVE=ON: every CPU feature of " + ("the device" if tgt.where != "host" else "this host")
    else:
        cpu = "no CPU-specific flags"
    built = {"host": "built on this host", "device": "built on the device", "transport": "built by its transport"}
    v.add("build target", OK, f"{tgt.name}, {built.get(tgt.where, tgt.where)}, {cpu}; chosen as {why}")
    for w in warnings:
        v.add("build target", WARN, w)
    if tgt.where == "host":
        try:
            targets.check_toolchain(tgt)
        except DevicelabError as e:
            v.add("toolchain", FAIL, str(e), "install it, then run doctor again")
    elif tgt.where == "device" and v.shell:
        lack = [c for c in NATIVE_BUILD_TOOLS if c not in _found(v, c)]
        if lack:
            v.add(
                "toolchain",
                FAIL,
                f"the device builds its own llama.cpp but has no {', '.join(lack)}",
                "install cmake and a C/C++ compiler on the device, or have this host cross-build for it",
            )
    v.add("GPU backends", OK, probe.gpu_backends(v.t, v.dev, v.facts))


# ---------------------------------------------------------------- telemetry
def _prior_calibration(v: _Visit) -> dict | None:
    """The device's battery calibration the lab keeps from an earlier cell (the lab folder's ledger), if any."""
    from .ledger import Ledger, ledger_path
    from .runner.cell import CALIBRATION

    p = ledger_path(v.lab_dir)
    if not p.exists():
        return None
    led = Ledger(p)
    try:
        return led.device_fact(v.dev.name, CALIBRATION)
    finally:
        led.close()


def _telemetry(v: _Visit) -> None:
    """telemetry sources"""
    from .recipes import TelemetrySpec

    v.asked_ms = TelemetrySpec().interval_ms
    n = int(SAMPLER_SECONDS * 1000 / v.asked_ms) + 1
    out = posixpath.join(v.t.workdir(), "doctor", "sampler.csv")
    v.t.mkdir(posixpath.dirname(out))
    t0 = time.time()
    v.t.execute(SampleOnce(v.kit, out, n, v.asked_ms, v.dev.telemetry_root), timeout=60 + 3 * SAMPLER_SECONDS)
    wall = time.time() - t0
    text = v.t.read_text(out) or ""
    v.keep("sampler.csv", text, f"sampler.sh -n {n} -i {v.asked_ms}: {wall:.1f} s of the device's telemetry")
    v.trace = tr = sampler_csv.parse(text)
    v.add("telemetry sources", OK, f"each source's own probe, and what it reads now ({len(tr.frame)} sampler ticks)")
    view = sources.ProbeView(v.t, tr, v.tools)
    prior = _prior_calibration(v)
    readable = []
    for s in sources.SOURCES:
        ok, detail = s.probe(view)
        readable += [s] if ok else []
        figures = _figures(v, s, tr, prior) if ok else []
        v.add(f"  {s.title}", OK if ok else SKIP, "; ".join([detail, *figures]))
    _sysfs_captures(v, tr)
    _calibration_line(v, prior)
    if not any(_gives_energy(s) for s in readable):
        v.add(
            "  energy",
            WARN,
            f"none: a cell's energy rows will be missing ({NO_POWER})",
            "a battery, power rail or energy counter the lab can read gives energy (see the lines above)",
        )


def _gives_energy(s) -> bool:
    """A source that can give a cell's energy: a sampler reader of it, or the whole cell's from beside the payload."""
    base = sources.Source
    return "energy" in s.said or type(s).energy is not base.energy or type(s).cell_energy is not base.cell_energy


def _figures(v: _Visit, s, tr, prior) -> list[str]:
    """What one source reads now, with units: its temperature, CPU clock, GPU figures, power and calibration (from
    the sampler's trace), and its snapshots' values (their raw text kept for the bundle)."""
    out = []
    temp = s.temperature(tr)
    if temp is not None and len(temp.dropna()):
        out.append(f"hottest {temp.dropna().max():.1f} °C")
    clock = s.cpu_clock(tr, None)
    if clock is not None and len(clock.dropna()):
        out.append(f"CPU clock {clock.dropna().mean() / 1e6:.0f} MHz (mean)")
    for metric, (value, _) in s.gpu(tr, None).items():
        out.append(f"{metric} {human(value, METRICS.get(metric, ''))}")
    for _, read in s.energy():
        e = read(tr, prior) if len(tr.frame) >= 2 else None
        if e is not None:
            out.append(_power_text(e, prior))
            break
    for snap in s.snapshots:
        if snap.needs not in v.tools:
            continue
        r = v.t.run(list(snap.argv), timeout=120)
        v.keep(f"{snap.name}.txt", r.stdout, " ".join(snap.argv), _snapshot_format(snap.name))
        try:
            vals = snap.rows(snap.parse(r.stdout))
        except Exception as e:  # a snapshot the lab cannot parse on a real device is the finding
            v.add(
                f"  {snap.name}",
                FAIL,
                f"the lab cannot read it: {type(e).__name__}: {e}",
                "attach `devicelab doctor --bundle FILE` to a bug report: the bundle has its text",
            )
            continue
        out.append(f"{snap.name}: " + (", ".join(f"{m} {human(x, METRICS.get(m, ''))}" for m, x in vals) or "read"))
    return out


def _power_text(e, prior) -> str:
    import numpy as np

    if e.kind == "energy":
        dt = float(e.t[-1] - e.t[0])
        w = float(e.values[-1] - e.values[0]) / dt if dt > 0 else float("nan")
    else:
        w = float(np.nanmean(e.values))
    if e.info.get("missing"):  # the source says why it cannot give a figure: never a 'nan W'
        return f"power missing ({e.info.get('source', '?')}): {e.info['missing']}"
    method = e.info.get("method")
    cal = f"; calibration: {method}" if method else ""
    if method and not sources.keeps_calibration(e.info) and not prior:
        cal += " (no calibration kept for this device yet: a cell whose battery counter moves makes one)"
    return f"power {human(w, 'W')} now ({e.info.get('source', '?')}){cal}"


def _calibration_line(v: _Visit, prior: dict | None) -> None:
    if prior:
        unit, sign = prior.get("current_unit"), prior.get("current_sign")
        v.add(
            "  energy calibration",
            OK,
            f"kept from an earlier cell: {prior.get('method')} in cell {prior.get('cell', '?')} (current in {unit}, "
            f"sign {sign})",
        )


def _snapshot_format(name: str) -> str | None:
    """The capture format of a snapshot: its own name, else the longest format its name begins with."""
    fmts = captures.formats()
    if name in fmts:
        return name
    cands = [f for f in fmts if name.startswith(f + "-")]
    return max(cands, key=len) if cands else None


def _sysfs_captures(v: _Visit, tr: sampler_csv.SamplerTrace) -> None:
    """The files the sampler read, as `grep . FILES` text (one capture per kind of folder it described): what a
    capture of /sys looks like in a bug report, and what the corpus's sysfs readers take."""
    cols = [c for c in tr.frame.columns if c not in ("tick", "t_s") and not c.startswith("proc/")]
    folders = sorted({*[k for k in tr.meta if "/" in k], *{posixpath.dirname(c) for c in cols}})
    if not folders or not v.shell:
        return
    r = v.t.sh(GREP_FILES, v.dev.telemetry_root, *folders, timeout=120)
    groups: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        path = line.split(":", 1)[0]
        kind, meta = _kind_of(tr, path)
        if kind:
            groups.setdefault(_sysfs_format(kind, meta) or kind, []).append("/" + line)
    for name, lines in sorted(groups.items()):
        fmt = name if name in captures.formats() else None
        v.keep(f"sysfs-{name}.txt", "\n".join(lines) + "\n", f"grep . FILES: the {name} files the sampler read", fmt)
    for line in r.stdout.splitlines():
        p, _, val = line.partition(":")
        if re.search(r"serial", posixpath.basename(p), re.I):
            v.secret("serial", val)


def _kind_of(tr, path: str) -> tuple[str, dict]:
    """The kind of folder the sampler said a file is in (the longest folder of its meta lines holding it)."""
    best = max((k for k in tr.meta if path.startswith(k + "/") or path == k), key=len, default=None)
    if best is None:
        return "", {}
    m = tr.meta[best]
    if m.get("kind", "").endswith("_label"):  # a label line of one file: its folder's kind
        return _kind_of(tr, posixpath.dirname(best)) if posixpath.dirname(best) != best else ("", {})
    return m.get("kind", ""), m


def _sysfs_format(kind: str, meta: dict) -> str | None:
    """The capture format of a kind of sampler folder: its name ('_' as '-', or plural), or its type's."""
    fmts = captures.formats()
    base = kind.replace("_", "-")
    for cand in (meta.get("type", "").lower(), base, base + "s"):
        if cand and cand in fmts:
            return cand
    return None


def human(value: float, unit: str) -> str:
    """A value in its schema unit, as a person reads it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "missing"
    if unit == "W":
        return f"{value * 1e3:.0f} mW" if abs(value) < 1 else f"{value:.2f} W"
    if unit == "Hz":
        return f"{value / 1e6:.0f} MHz"
    if unit == "B":
        return f"{value / 2**20:.0f} MiB"
    if unit == "degC":
        return f"{value:.1f} °C"
    if unit == "1":
        return f"{value * 100:.0f} %"
    return f"{value:.4g} {unit}".strip()


# ---------------------------------------------------------------- sampler, clock
def _sampler(v: _Visit) -> None:
    """sampler rate"""
    from . import probe

    tr = v.trace
    if tr is None:
        v.add("sampler rate", SKIP, "no sampler trace (see the telemetry lines above)")
        return
    t: np.ndarray | list[float] = tr.frame["t_s"].dropna().to_numpy(dtype=float) if len(tr.frame) else []
    asked = tr.interval_s * 1000
    own = round(asked) != v.asked_ms  # its transport ran the sampler its own way (a short run of the app's)
    if len(t) < (2 if own else 3):
        v.add(
            "sampler rate",
            FAIL,
            f"the sampler took {len(t)} ticks in {SAMPLER_SECONDS:g} s",
            "run the kit's sampler.sh on the device by hand (sh KIT/sampler.sh -o OUT -n 20) and attach its "
            "output to a bug report",
        )
        return
    got = (t[-1] - t[0]) / (len(t) - 1) * 1000
    said = f" (its transport's own run, not the {v.asked_ms} ms asked)" if own else ""
    # the sampler's own lines (its clock, its pacing) are about the kit's sh sampler: not where the transport samples
    lines = probe.device_lines(v.t, v.dev, tr, v.facts, gpu=False) if v.shell else {}
    how = "; ".join(f"{k}: {d}" for k, (_, d) in lines.items())
    detail = f"{got:.0f} ms a tick over {len(t)} ticks, asked {asked:g} ms{said}" + (f"; {how}" if how else "")
    more = "; install busybox (a shell with `read -t`)" if tr.pace == "sleep" else ""
    if got > 1.5 * asked:
        fix = f"the device cannot sample this fast: raise telemetry.interval_ms{more}"
        v.add("sampler rate", WARN if own else FAIL, detail, fix)
    else:
        v.add("sampler rate", OK if all(ok for ok, _ in lines.values()) else WARN, detail, more.lstrip("; "))


def _clock(v: _Visit) -> None:
    """clock offset"""
    if not v.shell:
        v.add("clock offset", SKIP, "no shell to ask the time: rows' times are the host's")
        return
    best: tuple[float, float] | None = None  # (offset, its error)
    for _ in range(3):
        t0 = time.time()
        r = v.t.run(["date", "+%s.%N"], timeout=30)
        t1 = time.time()
        out = r.stdout.strip()
        if not re.fullmatch(r"\d+(\.\d+)?", out):  # a date without %N (macOS) prints it literally
            out = v.t.run(["date", "+%s"], timeout=30).stdout.strip()
            t1 = time.time()
        if not re.fullmatch(r"\d+(\.\d+)?", out):
            v.add("clock offset", WARN, f"`date +%s` printed {out[:40]!r}", "`date +%s` should print epoch seconds")
            return
        res = 1.0 if "." not in out else 0.0
        off, err = float(out) - (t0 + t1) / 2, (t1 - t0) / 2 + res
        if best is None or err < best[1]:
            best = (off, err)
    assert best is not None, "each try sets it or returns"
    off, err = best
    detail = f"device {'ahead of' if off > 0 else 'behind'} this host by {abs(off):.3f} s (± {err:.3f} s)"
    if abs(off) - err > CLOCK_WARN_S:
        v.add("clock offset", WARN, detail, "set the device's clock from the network (NTP, or automatic date & time)")
    else:
        v.add("clock offset", OK, detail)


# ---------------------------------------------------------------- the bench cell
def _bench(v: _Visit) -> None:
    """bench cell"""
    from .ledger import DONE
    from .runner.orchestrator import Orchestrator
    from .runner.placement import LocalPlacement

    d = v.lab_dir / "doctor" / v.dev.name
    shutil.rmtree(d, ignore_errors=True)  # a new cell every time (a done one would be skipped)
    d.mkdir(parents=True)
    recipe = d / "doctor.yaml"
    recipe.write_text(BENCH_RECIPE.format(device=v.dev.name))
    t0 = time.time()
    orch = Orchestrator(recipe, v.lab_path, d, events=_Stages(v.stage))
    try:
        rep = orch.run(LocalPlacement())
        cells = orch.ledger.cells(DOCTOR_RECIPE)
        frame = orch.ledger.rows_frame(recipe=DOCTOR_RECIPE)
    finally:
        orch.ledger.close()
    cell = cells[0] if cells else {}
    if rep.failed or cell.get("status") != DONE:
        v.add(
            "bench cell",
            FAIL,
            f"{cell.get('status', 'not run')}: {cell.get('error') or 'no cell ran'}{_signal(cell.get('error'))}",
            f"see {d} (the cell's artifacts) and `devicelab cells --lab-dir {d}`",
        )
        return
    v.rep.bench_rows = [r for r in frame.to_dict("records")]
    _bench_captures(v, Path(cell["artifacts"]))
    v.add("bench cell", OK, f"SmolLM2 q8_0 in {time.time() - t0:.0f} s: {bench_text(v.rep.bench_rows)}")


class _Stages(Events):
    """The run's stage lines (a wait for the host's CPUs, a build, a model step), told as they happen."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say

    def stage(self, text: str) -> None:
        self.say(text)


def _signal(error: str | None) -> str:
    """'exited 139' is a signal's death (128 + 11, SIGSEGV): said by name."""
    import signal

    m = re.search(r"exited (\d+)", error or "")
    if not m or not 128 < int(m.group(1)) < 160:
        return ""
    try:
        name = signal.Signals(int(m.group(1)) - 128).name
    except ValueError:
        return ""
    return f" (killed by {name}: the tool crashed on this device)"


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def bench_text(rows: list[dict]) -> str:
    """The row a bench cell produced, the figures a person looks at first: each test's speed, the peak RSS, the
    decode's energy per token and power, the hottest temperature (a missing one with its reason, once)."""
    out: list[str] = []
    why: dict[str, list[str]] = {}  # reason -> the figures missing for it
    for r in rows:
        m, val = r["metric"], r["value"]
        if m in ("prefill_tps", "decode_tps"):
            out.append(f"{r['test']} {val:.1f} tok/s" if not _missing(val) else f"{r['test']} missing")
        elif m == "peak_rss" or (m in ("energy_per_token", "power_mean") and r.get("phase") == "decode"):
            name = {"peak_rss": "peak RSS", "energy_per_token": "energy/token", "power_mean": "power"}[m]
            if _missing(val):
                why.setdefault(r.get("missing_reason") or "missing", []).append(name)
            else:
                shown = f"{val * 1e3:.2f} mJ" if m == "energy_per_token" else human(val, METRICS[m])
                out.append(f"{name} {shown}")
    out += [f"{' and '.join(names)} missing: {reason}" for reason, names in why.items()]
    return "; ".join(out)


def _bench_captures(v: _Visit, art: Path) -> None:
    """The bench cell's raw outputs: llama-bench's JSONL as it printed it, the cell's sampler CSV, its snapshots."""
    tsv = art / "stdout.tsv"
    if tsv.is_file():
        lines = [ln.split("\t", 1)[-1] for ln in tsv.read_text(errors="replace").splitlines()]
        jsonl = "\n".join(ln for ln in lines if ln.lstrip().startswith("{")) + "\n"
        fmt = "llama-bench-jsonl" if "llama-bench-jsonl" in captures.formats() else None
        v.keep("bench-llama-bench.jsonl", jsonl, "llama-bench -o jsonl (the bench cell)", fmt)
    csv = art / "telemetry.csv"
    if csv.is_file():
        v.keep("bench-telemetry.csv", csv.read_text(errors="replace"), "the bench cell's sampler CSV", None)
    for p in sorted(art.glob("*.txt")):
        if p.name not in ("stderr.txt",):
            v.keep(f"bench-{p.name}", p.read_text(errors="replace"), f"the bench cell's {p.name}", None)


# ==================================================================== the bundle
NOT_PRIVATE = {
    "root",
    "shell",
    "mobile",
    "admin",
    "user",
    "nobody",
    "ubuntu",
    "pi",
    "debian",
    "android",
    "localhost",
    "localhost.localdomain",
    "127.0.0.1",
    "::1",
    "device",
    "phone",
    "board",
    "mac",
    "local",
}
_SERIAL_KEYS = re.compile(
    r"(?i)(?:serial[\w ]*|udid|ecid|uuid)[\"\]]?\s*[:=]\s*[\"\[]?([A-Za-z0-9][A-Za-z0-9_.:-]{3,})"
)
_TOKEN_KEYS = re.compile(r"(?i)(?:token|secret|password|passwd|api[_-]?key)[\"\]]?\s*[:=]\s*[\"\[]?([^\s\"\],]{6,})")
_HOME = re.compile(r"/(?:home|Users)/([A-Za-z0-9_.-]+)")


class Redactor:
    """Serial numbers, host names, user names and tokens, each replaced by a placeholder ('<serial-1>') wherever it
    occurs as a whole word; the manifest says what was replaced and where, never the value."""

    def __init__(self, secrets: dict[str, set[str]]):
        self.subs: dict[str, str] = {}
        self.kind: dict[str, str] = {}
        for kind in ("serial", "token", "host", "user"):
            for value in sorted(secrets.get(kind, ()), key=len, reverse=True):
                self.add(kind, value)

    def add(self, kind: str, value: str) -> None:
        value = value.strip()
        if (
            value in self.subs
            or value.lower() in NOT_PRIVATE
            or value.startswith("127.")
            or len(value) < 3
            or not re.search(r"[A-Za-z]", value)
            and len(value) < 6
        ):
            return
        n = sum(1 for k in self.kind.values() if k == kind) + 1
        self.subs[value], self.kind[value] = f"<{kind}-{n}>", kind

    def learn(self, text: str) -> None:
        """Secrets a text carries under a telling key (a serial number, a token) or in a home folder's path."""
        for m in _SERIAL_KEYS.finditer(text):
            self.add("serial", m.group(1))
        for m in _TOKEN_KEYS.finditer(text):
            self.add("token", m.group(1))
        for m in _HOME.finditer(text):
            self.add("user", m.group(1))

    def __call__(self, text: str) -> str:
        if not self.subs:
            return text
        rx = re.compile(
            "|".join(rf"(?<![\w-]){re.escape(s)}(?![\w-])" for s in sorted(self.subs, key=len, reverse=True))
        )
        return rx.sub(lambda m: self.subs[m.group(0)], text)

    def value(self, x: Any) -> Any:
        if isinstance(x, str):
            return self(x)
        if isinstance(x, captures.Missing):
            return captures.Missing(self(x.reason))
        if isinstance(x, list | tuple):
            return [self.value(y) for y in x]
        return x


def _expect_json(d: dict | None, red: Redactor) -> dict | None:
    """A reader's figures as the manifest keeps them: numbers, text, lists; {"missing": why}; no None or NaN."""
    if d is None:
        return None
    out = {}
    for k, x in d.items():
        j = _json_value(red.value(x))
        if j is not None:
            out[k] = j
    return out


def _json_value(x: Any) -> Any:
    if isinstance(x, captures.Missing):
        return {"missing": x.reason}
    if isinstance(x, bool | str):
        return x
    if isinstance(x, int | float):
        return None if isinstance(x, float) and not math.isfinite(x) else x
    if hasattr(x, "item"):  # a numpy scalar
        return _json_value(x.item())
    if isinstance(x, list | tuple):
        items = [_json_value(y) for y in x]
        return None if any(i is None for i in items) else items
    return None


def write_bundle(reports: list[DeviceReport], path: Path) -> dict:
    """Every raw capture the lab read from each device, with a manifest, into one tar.gz; secrets replaced."""
    from . import __version__

    secrets: dict[str, set[str]] = {}
    for rep in reports:
        for k, vals in rep.secrets.items():
            secrets.setdefault(k, set()).update(vals)
    import getpass
    import platform
    import socket

    secrets.setdefault("host", set()).update({platform.node(), socket.gethostname()})
    secrets.setdefault("user", set()).add(getpass.getuser())
    red = Redactor(secrets)
    for rep in reports:
        for c in rep.captures:
            red.learn(c.text)
    manifest: dict = {
        "made_by": "devicelab doctor",
        "devicelab": __version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "devices": [],
    }
    where: dict[str, set[str]] = {}
    files: dict[str, str] = {}
    for rep in reports:
        entry: dict[str, Any] = {"name": rep.name, "transport": rep.transport, "model": red(rep.model), "files": []}
        entry["checks"] = [{k: red(v) for k, v in asdict(c).items()} for c in rep.checks]
        for c in rep.captures:
            arc = f"{rep.name}/{c.name}"
            files[arc] = red(c.text)
            for s, ph in red.subs.items():
                if s in c.text:
                    where.setdefault(ph, set()).add(arc)
            f: dict[str, Any] = {"path": arc, "what": red(c.what), "format": c.format}
            if c.expect is not None:
                f["expect"] = _expect_json(c.expect, red)
            if c.unsupported:
                f["unsupported"] = red(c.unsupported)
            entry["files"].append(f)
        manifest["devices"].append(entry)
    manifest["replaced"] = [
        {"what": red.kind[s], "as": ph, "in": sorted(where.get(ph, ()))} for s, ph in red.subs.items() if ph in where
    ]
    manifest["not_replaced"] = "system account and loopback names (root, shell, localhost, 127.0.0.1 …): not a person's"
    _write_tar(path, manifest, files)
    return manifest


def _write_tar(path: Path, manifest: dict, files: dict[str, str]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in [("manifest.json", json.dumps(manifest, indent=1, ensure_ascii=False)), *files.items()]:
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))


def read_bundle(path: Path) -> tuple[dict, dict[str, str]]:
    with tarfile.open(path, "r:gz") as tar:
        texts = {}
        for m in tar.getmembers():
            fh = tar.extractfile(m) if m.isfile() else None
            if fh is not None:  # a regular file's contents
                texts[m.name] = fh.read().decode("utf-8")
    if "manifest.json" not in texts:
        raise DevicelabError(f"{path} is not a devicelab doctor bundle (no manifest.json)")
    return json.loads(texts.pop("manifest.json")), texts


# ==================================================================== a bundle → corpus entries
def source_line(model: str, date: str) -> str:
    """A fixture's `source` for a capture from a doctor bundle (tests/test_real_captures.py checks its form)."""
    return f"devicelab doctor bundle of {model} on {date}"


def _slug(text: str, n: int = 40) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:n].strip("-") or "device"


def _toml_value(x: Any) -> str:
    if isinstance(x, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in x.items()) + " }"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int | float):
        return repr(x)
    if isinstance(x, list):
        return "[" + ", ".join(_toml_value(y) for y in x) + "]"
    return json.dumps(str(x), ensure_ascii=False)


def fixture_toml(source: str, device: str, note: str, expect: dict | None, unsupported: str | None) -> str:
    lines = [f"source = {_toml_value(source)}", f"device = {_toml_value(device)}", f"note = {_toml_value(note)}"]
    if unsupported:
        lines.append(f"unsupported = {_toml_value(unsupported)}")
    else:
        lines += ["", "[expect]", *[f"{json.dumps(k)} = {_toml_value(v)}" for k, v in (expect or {}).items()]]
    return "\n".join(lines) + "\n"


def bundle_to_fixture(bundle: Path, out: Path) -> list[Path]:
    """Corpus entries from a doctor bundle: for each capture whose format the lab reads, the capture as the bundle
    has it (secrets replaced) and its TOML, whose [expect] values are what the lab read from the device live."""
    manifest, texts = read_bundle(bundle)
    date = manifest.get("date", "")
    made = []
    for dev in manifest["devices"]:
        model = dev.get("model") or dev["name"]
        for f in dev["files"]:
            fmt, expect, unsupported = f.get("format"), f.get("expect"), f.get("unsupported")
            if not fmt or not (expect or unsupported):
                continue
            fname = posixpath.basename(f["path"])
            stem, ext = (fname.split(".", 1) + [""])[:2]
            head = _slug(model.split(",")[0], 32)  # the device, not its OS
            name = f"doctor-{head}-{_slug(dev['name'])}-{date}" + ("" if stem == fmt else f"-{_slug(stem)}")
            folder = Path(out) / fmt
            folder.mkdir(parents=True, exist_ok=True)
            cap = folder / f"{name}.{ext or 'txt'}"
            cap.write_text(texts[f["path"]], encoding="utf-8", newline="")
            replaced = sorted({r["what"] for r in manifest.get("replaced", ()) if f["path"] in r["in"]})
            note = (
                f"{f['what']}; captured by devicelab doctor {manifest.get('devicelab', '')} on the lab's device "
                f"{dev['name']} ({dev['transport']}). Replaced in the bundle: {', '.join(replaced) or 'nothing'}. "
                "[expect] is what the lab read from the device live."
            )
            toml = folder / f"{name}.toml"
            toml.write_text(fixture_toml(source_line(model, date), model, note, expect, unsupported))
            made += [cap, toml]
    return made
