"""DeviceSession: what one device carries through a run, opened and closed as a context, in three parts —
the link (its transport, the kit on it, its facts), the builds (its target, a build per backend, the devices
each sees, the tools' paths on the device) and the conditions (idle baseline and cooldown, memory budget,
battery, governor pin, the telemetry sources it has, warnings). The orchestrator holds no per-device state."""

from __future__ import annotations

import dataclasses
import posixpath
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from .. import budget as budgetmod
from .. import facts as factsmod
from .. import kit as kitmod
from .. import push
from ..build import backends as backendsmod
from ..build import choose, targets
from ..hashing import sha256_file
from ..kinds.base import SkipCell
from ..schema import Row
from ..telemetry import sources
from ..transports import Transport, open_transport
from ..transports.settings import SSHSettings
from .conditions import Governor

if TYPE_CHECKING:  # pragma: no cover
    from ..build import AnyBuild
    from ..lab import Device
    from ..recipes import TelemetrySpec
    from .lane import Events, HostServices, LaneLedger


class Warn(Protocol):
    """How a session says a warning about its device (DeviceConditions.warn: once per key)."""

    def __call__(self, text: str, key: str | None = None) -> None: ...


BASELINE_MAX_AGE_S = 6 * 3600
# Ctrl-C: how long to wait for a payload that has just started to write its pids file before giving up on it
INTERRUPT_PATIENCE_S = 60.0


def target_for(t: Transport, device: Device, facts: dict) -> tuple[targets.Target, list[str]]:
    """The device's build target: the lab file's `target` if set, else the default for what its transport reaches
    (build/choose.py); either way with the lab file's `cpu_features` where it gives them (a phone's default
    target too: its build is the board's when their features are the same)."""
    if device.cpu_features:
        facts = {**facts, "cpu.features": device.cpu_features}
    if device.target:
        return targets.by_name(device.target, set((facts.get("cpu.features") or "").split())), []
    cross_build = device.cross_build if isinstance(device, SSHSettings) else True
    return choose.default_target(t.platform, facts, t.name, cross_build=cross_build)


def read_pids(t: Transport, remote_out: str) -> dict[str, list[str]]:
    """run_payload.sh's pids file ('runner=1 payload=2 sampler=3 spin=4,5'), by role."""
    out: dict[str, list[str]] = {}
    for kv in (t.read_text(posixpath.join(remote_out, "pids")) or "").split():
        k, _, v = kv.partition("=")
        ids = [p for p in v.split(",") if p.isdigit()]
        if ids:
            out[k] = ids
    return out


# ==================================================================== the link
class Link:
    """The device as reached: its lab entry, its transport, the kit on it, the facts it told."""

    def __init__(self, device: Device, host: HostServices):
        self.device, self.host, self.name = device, host, device.name
        self.t: Transport | None = None  # once open() connected it
        self.kit = ""
        self.facts: dict = {}

    @property
    def connected(self) -> Transport:
        """Its transport, which open() connected (everything but the interrupt runs after it)."""
        assert self.t is not None, f"{self.name} is not connected yet"
        return self.t

    def open(self, ev: Events, stack: ExitStack) -> None:
        ev.lane(self.name, "connecting")
        self.t = t = open_transport(self.device)
        t.connect()
        stack.callback(t.close)
        ev.lane(self.name, "device facts and kit")
        self.kit = kitmod.ensure(t, lambda p, sha, name: self.push(p, sha, name=name))
        if not t.builds_before_facts:
            self.collect_facts()

    def collect_facts(self) -> None:
        self.facts = factsmod.collect(self.connected, self.kit, self.device.telemetry_root)

    @property
    def measures_on_host(self) -> bool:
        """Its payloads run on this host's CPUs (the local transport, or a device the lab file marks so)."""
        if self.device.host_cpus is not None:
            return self.device.host_cpus
        return bool(self.t is not None and self.t.measures_on_host)

    @property
    def same_build_as_host(self) -> bool:
        """It runs this host's own build on this host's CPUs: a device-vs-host logit check would compare a
        file with itself."""
        return bool(
            self.t is not None and self.t.measures_on_host and not self.device.exec_prefix and not self.device.target
        )

    def push(self, path: Path, sha: str | None = None, mode: str | None = None, name: str | None = None) -> str:
        """A file into the device's verified cache. Sending it is host-side work (the host reads, encrypts
        and streams it): it waits while a device measures on this host's CPUs."""
        sha, name = sha or sha256_file(path), name or path.name
        there = push.present(self.connected, sha, name)
        if there:
            return there
        with self.host.cpu.work(f"push to {self.name}"):
            return push.ensure(self.connected, path, sha, name, mode=mode)

    def alive(self) -> bool:
        try:
            return self.connected.alive(timeout=30)
        except Exception:  # any failure to reach it means it is gone
            return False

    def stop(self, remote: str, timeout: float | None = None) -> int:
        """Stop what run_payload.sh started in a device folder (its runner, payload, sampler, co-runners); how many
        of them were still running."""
        t, n = self.connected, 0
        for pids in read_pids(t, remote).values():
            for pid in pids:
                n += t.kill(pid, timeout=timeout)
        return n

    @property
    def current_file(self) -> str:
        """The device's "what runs now" file: run_payload.sh writes the running payload's folder into it."""
        return posixpath.join(self.connected.workdir(), "current")

    def stop_leftover(self, warn: Warn) -> None:
        """A payload an earlier session left running (its lane killed, its host gone): stopped before this session
        measures anything, and said. The device's lock is held, so nothing running there is anyone's now."""
        left = (self.connected.read_text(self.current_file) or "").strip()
        if not left:
            return
        if self.stop(left, timeout=30):
            warn(f"a payload left running by an earlier run ({left}) was stopped first")
        self.connected.remove(self.current_file, timeout=30)


# ==================================================================== the builds
class Builds:
    """What the device runs: its build target, the build of each backend it is asked for (or why it cannot have
    it), the devices each sees, and the tools' paths on the device."""

    def __init__(self, link: Link, host: HostServices, ev: Events, tools_needed: set[str]):
        self.link, self.host, self.ev = link, host, ev
        self.tools_needed = set(tools_needed)
        self.target: targets.Target | None = None
        self.default_backend: str = backendsmod.CPU
        self.default: AnyBuild | None = None  # the build of the default backend
        self._by_backend: dict[str, AnyBuild | SkipCell] = {}  # backend -> its build, or the SkipCell saying why not
        self.gpu_devices: dict[str, list[tuple[str, str]]] = {}  # backend -> [(name, description)] its build sees

    def open(self, warn: Warn) -> None:
        link = self.link
        tgt, warnings = target_for(link.connected, link.device, link.facts)
        for w in warnings:
            warn(w)
        tgt = self._with_tools(tgt)
        self.target, self.default_backend = tgt, backendsmod.default_backend(tgt)
        self.default = self._make(tgt, stage=True)

    def _make(self, tgt: targets.Target, stage: bool = False) -> AnyBuild:
        self.ev.lane(self.link.name, f"llama.cpp build ({tgt.name})")
        if tgt.where == "device":
            from ..build import remote

            if stage:
                self.ev.stage(f"llama.cpp native build on {self.link.name} ({tgt.name})")
            return remote.ensure(self.link.connected, self.host.src, tgt, jobs=self.host.jobs)
        if tgt.where == "transport":  # made through its transport: an app built and signed on the device's Mac
            from ..build import ios

            if stage:
                self.ev.stage(f"llama.cpp build for {self.link.name} ({tgt.name})")
            return ios.ensure(self.link.connected, self.host.src, tgt, jobs=self.host.jobs)
        return self.host.build(tgt)

    def for_backend(self, backend: str | None) -> AnyBuild:
        """The device's build for a backend (None: its default build); SkipCell with the reason when it
        cannot have that backend."""
        if backend is None or backend == self.default_backend:
            assert self.default is not None, "the builds are not open yet"
            return self.default
        if backend not in self._by_backend:
            try:
                self._by_backend[backend] = build = self._variant(backend)
                self.gpu_devices[backend] = self._list_devices(backend, build)
            except SkipCell as e:
                self._by_backend[backend] = e
        b = self._by_backend[backend]
        if isinstance(b, SkipCell):
            raise b
        return b

    def _variant(self, backend: str) -> AnyBuild:
        name, allowed = self.link.name, self.link.device.backends
        if allowed is not None and backend not in allowed:
            raise SkipCell(f"{name}'s lab entry allows the backends {', '.join(allowed)}")
        assert self.target is not None, "the builds are not open yet"
        try:
            tgt = backendsmod.variant(self.target, backend)
        except backendsmod.NoBackend as e:
            raise SkipCell(f"{name} cannot have the {backend} backend: {e}") from None
        return self._make(self._with_tools(tgt))

    def _with_tools(self, tgt: targets.Target) -> targets.Target:
        """The target built with the tools this recipe's kinds run, and llama-bench and llama-perplexity always
        (one build serves bench-only and KLD recipes alike). A build made here has only those: its folder adds
        tools when a later recipe needs more (build/cache.py). A build made on the device or through its transport
        keeps every tool its target lists (its key names them; one build serves every recipe)."""
        need = {"llama-bench", "llama-perplexity"} | self.tools_needed
        if tgt.where != "host":
            need |= set(tgt.tools)
        return dataclasses.replace(tgt, tools=tuple(sorted(need)))

    def _list_devices(self, backend: str, build: AnyBuild) -> list[tuple[str, str]]:
        """The devices a backend's build sees on this device (`--list-devices`, printed synchronously: unlike
        the tools' logs, never lost at exit). None seen: the cells of that backend are skipped, with the list."""
        d = self.link.device
        tool = next(
            (t for t in ("llama-bench", "llama-perplexity", "llama-server") if t in build.manifest["tools"]), None
        )
        if tool is None:
            return []
        r = self.link.connected.run(
            [*d.exec_prefix, self.tool(tool, backend), "--list-devices"], timeout=120, env=d.env or None
        )
        devs = [x for x in backendsmod.parse_devices(r.stdout) if not x[0].upper().startswith("CPU")]
        if not devs:
            raise SkipCell(
                f"the {backend} build of {self.link.name} sees no {backend} device ("
                + (r.stdout.strip().replace("\n", "; ")[:160] or f"exit {r.rc}")
                + f"); {backendsmod.NO_DEVICE_HINT.get(backend, '')}"
            )
        return devs

    def tool(self, name: str, backend: str | None = None) -> str:
        """A tool of the backend's build, on the device (pushed there when it was built on the host)."""
        build = self.for_backend(backend)
        if name not in build.manifest["tools"]:
            raise SkipCell(f"the {build.manifest['target']} build has no {name}")
        if build.manifest.get("where") == "device":
            return str(build.tool(name))  # built on the device, already there
        return self.link.push(Path(build.tool(name)), build.manifest["tools"][name], mode="755", name=name)


# ==================================================================== the conditions
class DeviceConditions:
    """What the device's measurements are made under: its idle baseline and the cooldown before each cell, one
    app's memory budget, its battery, the governor pin, the telemetry sources it has; warnings once a session."""

    def __init__(self, link: Link, ledger: LaneLedger, ev: Events, spec: TelemetrySpec):
        self.link, self.ledger, self.ev, self.spec = link, ledger, ev, spec
        self.baseline: float | None = None
        self.budget = budgetmod.Budget(None, "unknown", "")
        self.battery_wh: float | None = None
        self.battery_source = ""
        self.provenance: dict = {}  # device-wide conditions (the governor pin)
        self.sources: sources.DeviceSources | None = None
        self.stopping = threading.Event()  # the session's Ctrl-C (DeviceSession.interrupt)
        self._warned: set[str] = set()

    def measure_first(self) -> None:
        """At first contact, before a native build can warm the device: budget, battery, idle baseline."""
        self.budget = self._memory_budget()
        self.battery_wh, self.battery_source = budgetmod.battery(self.link.facts)
        self.baseline = self._idle_baseline()

    def open_sources(self) -> None:
        link, led = self.link, self.ledger
        self.sources = sources.open_on(
            sources.DeviceAccess(
                link.name,
                link.connected,
                fact=lambda k: led.device_fact(link.name, k),
                set_fact=lambda k, v: led.set_device_fact(link.name, k, v),
                note=self.ev.stage,
                warn=self.warn,
            )
        )

    def pin_governor(self, stack: ExitStack) -> None:
        d = self.link.device
        self.provenance["governor"] = None
        if d.governor:
            g = stack.enter_context(
                Governor(self.link.connected, self.link.kit, d.governor, d.telemetry_root, self.warn)
            )
            self.provenance.update(g.provenance)

    def warn(self, text: str, key: str | None = None) -> None:
        """A warning about this device, once per session."""
        key = key or text
        if key not in self._warned:
            self._warned.add(key)
            self.ev.stage(f"warning: {self.link.name}: {text}")

    # ---------------------------------------------------------------- thermal protocol
    def hottest(self) -> float | None:
        return sources.temperature_now(self.link.connected, self.link.kit, self.link.device.telemetry_root)

    def _idle_baseline(self) -> float | None:
        """The device's idle temperature: its hottest zone at first contact, or a cooler reading of it kept in
        the ledger from the last hours (a run resumed right after a heavy one starts on a warm device)."""
        name = self.link.name
        now = self.hottest()
        old = self.ledger.device_fact(name, "idle-baseline")
        fresh = old if old and time.time() - old["at"] < BASELINE_MAX_AGE_S else None
        if now is not None and (fresh is None or now <= fresh["c"]):
            self.ledger.set_device_fact(name, "idle-baseline", {"c": now, "at": time.time()})
            return now
        if fresh is not None:
            self.ev.stage(
                f"{name}: idle baseline {fresh['c']:.1f} °C, measured "
                f"{(time.time() - fresh['at']) / 60:.0f} min ago (now "
                + (f"{now:.1f} °C)" if now is not None else "unreadable)")
            )
            return fresh["c"]
        return now

    def _memory_budget(self) -> budgetmod.Budget:
        """One app's memory budget, measured now at first contact; like the idle baseline, a more generous
        reading of it from the last hours (the device idler then) is kept in the ledger and used instead."""
        d, name = self.link.device, self.link.name
        now = budgetmod.from_facts(self.link.facts, d.ram_budget_bytes)
        if d.ram_budget_bytes or now.bytes is None:
            return now
        old = self.ledger.device_fact(name, "ram-budget")
        fresh = (
            old
            if old and time.time() - old.get("at", 0) < BASELINE_MAX_AGE_S and old.get("source") == now.source
            else None
        )
        if fresh and fresh["bytes"] > now.bytes:
            return budgetmod.Budget(
                fresh["bytes"],
                fresh["source"],
                f"{fresh['detail']}, {(time.time() - fresh['at']) / 60:.0f} min ago (now {budgetmod.gib(now.bytes)})",
            )
        self.ledger.set_device_fact(name, "ram-budget", {**now.to_json(), "at": time.time()})
        return now

    def cooldown(self) -> Row:
        """Wait (bounded) until the hottest zone is within delta of the idle baseline: the wait as a row that
        says how it ended."""
        baseline = self.baseline
        if baseline is None:
            return Row(metric="cooldown_wait", value=0.0, phase="cell", test="no thermal zone: no wait")
        spec = self.spec
        limit = baseline + spec.cooldown_delta_c
        t0 = time.time()
        now = self.hottest()
        while now is not None and now > limit and time.time() - t0 < spec.cooldown_timeout_s:
            # read every second, never past the bound (a 2 s pace overshot a 3 s bound by up to 2 s)
            pace = min(1.0, max(0.0, t0 + spec.cooldown_timeout_s - time.time()))
            if self.stopping.wait(pace):  # Ctrl-C: the cell is cut before its payload starts
                return Row(metric="cooldown_wait", value=time.time() - t0, phase="cell", test="cut by Ctrl-C")
            now = self.hottest()
        waited = time.time() - t0
        goal = f"baseline {baseline:.1f} °C + {spec.cooldown_delta_c:g}"
        if now is not None and now > limit:
            self.ev.stage(
                f"warning: {self.link.name} still at {now:.1f} °C after {waited:.0f} s ({goal}): "
                "measuring warm; raise telemetry.cooldown_timeout_s to wait longer"
            )
            return Row(metric="cooldown_wait", value=waited, phase="cell", test=f"timed out at {now:.1f} °C ({goal})")
        return Row(
            metric="cooldown_wait",
            value=waited,
            phase="cell",
            test=f"reached {now:.1f} °C ({goal})" if now is not None else "thermal zone unreadable",
        )


# ==================================================================== the session
class DeviceSession:
    """One device through a run: the link, the builds and the conditions, opened in that order (the idle
    baseline before a native build can warm the device) and closed together."""

    def __init__(
        self,
        device: Device,
        ledger: LaneLedger,
        host: HostServices,
        events: Events,
        telemetry: TelemetrySpec,
        tools: set[str],
    ):
        self.device, self.ledger, self.host, self.ev, self.telemetry = device, ledger, host, events, telemetry
        self.name = device.name
        self.link = Link(device, host)
        self.builds = Builds(self.link, host, events, tools)
        self.conditions = DeviceConditions(self.link, ledger, events, telemetry)
        self.current_remote: str | None = None  # the running cell's device folder (for interrupt)
        self._stack = ExitStack()

    def __enter__(self) -> DeviceSession:
        try:
            with self.host.cpu.activity(f"{self.name} setup"):  # in every overlapping row's host_activity
                self._open()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._stack.close()
        return False

    def _open(self) -> None:
        self.link.open(self.ev, self._stack)
        self.link.stop_leftover(self.conditions.warn)
        if (
            self.link.connected.builds_before_facts
        ):  # its facts are its build's to tell (an app on a phone): build first
            self.builds.open(self.conditions.warn)
            self.link.collect_facts()
            self.conditions.measure_first()
        else:
            self.conditions.measure_first()
            self.builds.open(self.conditions.warn)
        self.conditions.open_sources()
        self.conditions.pin_governor(self._stack)

    # ---------------------------------------------------------------- what cells, kinds and the lane ask
    @property
    def t(self) -> Transport:
        return self.link.connected

    @property
    def facts(self) -> dict:
        return self.link.facts

    @property
    def build(self) -> AnyBuild:
        """The device's default build."""
        return self.builds.for_backend(None)

    @property
    def measures_on_host(self) -> bool:
        return self.link.measures_on_host

    @property
    def same_build_as_host(self) -> bool:
        return self.link.same_build_as_host

    def build_for(self, backend: str | None) -> AnyBuild:
        return self.builds.for_backend(backend)

    def tool(self, name: str, backend: str | None = None) -> str:
        return self.builds.tool(name, backend)

    def push(self, path: Path, sha: str | None = None, mode: str | None = None, name: str | None = None) -> str:
        return self.link.push(path, sha, mode=mode, name=name)

    def warn(self, text: str, key: str | None = None) -> None:
        self.conditions.warn(text, key)

    def alive(self) -> bool:
        return self.link.alive()

    @property
    def interrupted(self) -> bool:
        """Ctrl-C: the running cell is cut, whatever its payload did, and no payload starts after it."""
        return self.conditions.stopping.is_set()

    def interrupt(self, patience_s: float = INTERRUPT_PATIENCE_S) -> None:
        """Ctrl-C from another thread: stop the running payload on the device (its runner then returns). A payload
        that has only just started has no pids file yet: wait for it (on a loaded machine its runner may take
        seconds to write one) until it is found or is no longer the running one, rather than miss it and let it
        run to its end; the cell is cut either way (`interrupted`). The flag is set before the payload is looked
        for, and the cell looks at the flag after it names its payload, so one of the two sees the other."""
        self.conditions.stopping.set()  # the cooldown before a cell ends its wait too
        remote = self.current_remote
        if self.link.t is None or not remote:
            return
        try:
            deadline = time.monotonic() + patience_s
            while not read_pids(self.link.t, remote) and self.current_remote == remote:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.1)
            self.link.stop(remote, timeout=10)
        except Exception:  # best effort: the device may be gone already
            pass
