"""DeviceSession: everything one device carries through a run — transport, kit, facts, target, build,
idle baseline, charging hygiene, governor pin, powermetrics access, warnings — in one object, opened and
closed as a context. The orchestrator holds no per-device state."""

from __future__ import annotations

import dataclasses
import posixpath
import time
from contextlib import ExitStack

from .. import budget as budgetmod
from .. import facts as factsmod
from .. import kit as kitmod
from .. import push
from ..build import backends as backendsmod
from ..build import targets
from ..hashing import sha256_file
from ..kinds.base import SkipCell
from ..schema import Row
from ..telemetry import normalize, snapshots
from ..transports import open_transport
from .conditions import Governor

BASELINE_MAX_AGE_S = 6 * 3600


def target_for(t, device, facts: dict) -> tuple[targets.Target, list[str]]:
    """The device's build target: the lab file's `target` if set, else its transport's default."""
    if device.target:
        feats = set((device.cpu_features or facts.get("cpu.features") or "").split())
        return targets.by_name(device.target, feats), []
    return t.default_target(device, facts)


class DeviceSession:
    def __init__(self, device, ledger, host, events, telemetry, tools: set[str]):
        self.device, self.ledger, self.host, self.ev, self.telemetry = device, ledger, host, events, telemetry
        self.name = device.name
        self.tools_needed = set(tools)
        self.t = None
        self.kit = ""
        self.facts: dict = {}
        self.baseline: float | None = None
        self.budget = budgetmod.Budget(None, "unknown", "")
        self.battery_wh: float | None = None
        self.battery_source = ""
        self.build = None
        self.target = None
        self.default_backend = "cpu"
        self._builds: dict = {}             # backend -> its build, or the SkipCell saying why it cannot be
        self.gpu_devices: dict = {}         # backend -> [(name, description)] its build sees
        self.snap_tools: set[str] = set()
        self.powermetrics = ""
        self.provenance: dict = {}          # device-wide conditions (the governor pin)
        self._stack = ExitStack()
        self._warned: set[str] = set()
        self.current_remote: str | None = None      # the running cell's device folder (for interrupt)

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self):
        try:
            with self.host.cpu.activity(f"{self.name} setup"):    # in every overlapping row's host_activity
                self._open()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

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
        return bool(self.t is not None and self.t.measures_on_host and not self.device.exec_prefix
                    and not self.device.target)

    def _open(self) -> None:
        d = self.device
        self.ev.lane(self.name, "connecting")
        self.t = open_transport(d)
        self.t.connect()
        self._stack.callback(self.t.close)
        self.ev.lane(self.name, "device facts and kit")
        self.kit = kitmod.ensure(self.t, lambda p, sha, name: self.push(p, sha, name=name))
        self.facts = factsmod.collect(self.t, self.kit, d.telemetry_root)
        self.budget = self._memory_budget()
        self.battery_wh, self.battery_source = budgetmod.battery(self.facts)
        self.baseline = self._idle_baseline()      # before a native build can warm the device
        tgt, warnings = target_for(self.t, d, self.facts)
        for w in warnings:
            self.warn(w)
        if self.tools_needed - set(tgt.tools):         # a kind needs a tool the target does not list
            tgt = dataclasses.replace(tgt, tools=tuple(sorted(set(tgt.tools) | self.tools_needed)))
        self.target, self.default_backend = tgt, backendsmod.default_backend(tgt)
        self.ev.lane(self.name, f"llama.cpp build ({tgt.name})")
        if tgt.where == "device":
            from ..build import remote
            self.ev.stage(f"llama.cpp native build on {self.name} ({tgt.name})")
            self.build = remote.ensure(self.t, self.host.src, tgt, jobs=self.host.jobs)
        else:
            self.build = self.host.build(tgt)
        self.snap_tools = snapshots.available(self.t)
        if snapshots.restore_if_pending(self.t, self.snap_tools,
                                        bool(self.ledger.device_fact(self.name, "battery-unplugged"))):
            self.ledger.set_device_fact(self.name, "battery-unplugged", False)
            self.ev.stage(f"{self.name}: charging state restored (dumpsys battery reset): an earlier run lost "
                          "the device while it was set unplugged")
        # macOS: the SoC's energy model (CPU/GPU/ANE) beside each payload, where the user may run it
        self.powermetrics = snapshots.powermetrics_access(self.t) if "ioreg" in self.snap_tools else ""
        if "ioreg" in self.snap_tools and not self.powermetrics:
            self.ev.stage(f"note: {self.name} has no power figures without powermetrics, which needs root: allow "
                          "it with a sudoers rule (NOPASSWD: /usr/bin/powermetrics) for the SSH user")
        self.provenance["governor"] = None
        if d.governor:
            g = self._stack.enter_context(Governor(self.t, self.kit, d.governor, d.telemetry_root, self.warn))
            self.provenance.update(g.provenance)

    # ---------------------------------------------------------------- helpers for cells and kinds
    def warn(self, text: str, key: str | None = None) -> None:
        """A warning about this device, once per session."""
        key = key or text
        if key not in self._warned:
            self._warned.add(key)
            self.ev.stage(f"warning: {self.name}: {text}")

    def build_for(self, backend: str | None):
        """The device's build for a backend (None: its default build); SkipCell with the reason when it
        cannot have that backend."""
        if backend is None or backend == self.default_backend:
            return self.build
        if backend not in self._builds:
            try:
                if self.device.backends is not None and backend not in self.device.backends:
                    raise SkipCell(f"{self.name}'s lab entry allows the backends {', '.join(self.device.backends)}")
                try:
                    tgt = backendsmod.variant(self.target, backend)
                except backendsmod.NoBackend as e:
                    raise SkipCell(f"{self.name} cannot have the {backend} backend: {e}") from None
                # llama-bench and llama-perplexity always (one build serves bench-only and KLD recipes alike),
                # with what else this recipe's kinds run
                tgt = dataclasses.replace(tgt, tools=tuple(sorted({"llama-bench", "llama-perplexity"}
                                                                  | self.tools_needed)))
                self.ev.lane(self.name, f"llama.cpp build ({tgt.name})")
                if tgt.where == "device":
                    from ..build import remote
                    self._builds[backend] = remote.ensure(self.t, self.host.src, tgt, jobs=self.host.jobs)
                else:
                    self._builds[backend] = self.host.build(tgt)
                self.gpu_devices[backend] = self._list_devices(backend)
            except SkipCell as e:
                self._builds[backend] = e
        b = self._builds[backend]
        if isinstance(b, SkipCell):
            raise b
        return b

    def _list_devices(self, backend: str) -> list[tuple[str, str]]:
        """The devices a backend's build sees on this device (`--list-devices`, printed synchronously: unlike
        the tools' logs, never lost at exit). None seen: the cells of that backend are skipped, with the list."""
        build = self._builds[backend]
        tool = next((t for t in ("llama-bench", "llama-perplexity", "llama-server") if t in build.manifest["tools"]),
                    None)
        if tool is None:
            return []
        r = self.t.run([*self.device.exec_prefix, self.tool(tool, backend), "--list-devices"], timeout=120,
                       env=self.device.env or None)
        devs = [d for d in backendsmod.parse_devices(r.stdout) if not d[0].upper().startswith("CPU")]
        if not devs:
            raise SkipCell(f"the {backend} build of {self.name} sees no {backend} device ("
                           + (r.stdout.strip().replace("\n", "; ")[:160] or f"exit {r.rc}")
                           + f"); {backendsmod.NO_DEVICE_HINT.get(backend, '')}")
        return devs

    def tool(self, name: str, backend: str | None = None) -> str:
        build = self.build_for(backend)
        if name not in build.manifest["tools"]:
            raise SkipCell(f"the {build.manifest['target']} build has no {name}")
        if build.manifest.get("where") == "device":
            return build.tool(name)                       # built on the device, already there
        return self.push(build.tool(name), build.manifest["tools"][name], mode="755", name=name)

    def push(self, path, sha: str | None = None, mode: str | None = None, name: str | None = None) -> str:
        """A file into the device's verified cache. Sending it is host-side work (the host reads, encrypts
        and streams it): it waits while a device measures on this host's CPUs."""
        sha, name = sha or sha256_file(path), name or path.name
        there = push.present(self.t, sha, name)
        if there:
            return there
        with self.host.cpu.work(f"push to {self.name}"):
            return push.ensure(self.t, path, sha, name, mode=mode)

    def alive(self) -> bool:
        try:
            return self.t.run(["true"], timeout=30).rc == 0
        except Exception:          # noqa: BLE001 - any failure to reach it means it is gone
            return False

    def interrupt(self) -> None:
        """Ctrl-C from another thread: stop the running payload on the device (its runner then returns)."""
        remote = self.current_remote
        if self.t is None or not remote:
            return
        try:
            for pids in read_pids(self.t, remote).values():
                for pid in pids:
                    self.t.run(["kill", pid], timeout=10)
        except Exception:          # noqa: BLE001 - best effort: the device may be gone already
            pass

    # ---------------------------------------------------------------- thermal protocol
    def hottest(self) -> float | None:
        r = self.t.run(["sh", f"{self.kit}/thermal.sh", self.device.telemetry_root], timeout=30)
        try:
            return normalize.temp_to_c(float(r.stdout.strip()))
        except ValueError:
            return None

    def _idle_baseline(self) -> float | None:
        """The device's idle temperature: its hottest zone at first contact, or a cooler reading of it kept in
        the ledger from the last hours (a run resumed right after a heavy one starts on a warm device)."""
        now = self.hottest()
        old = self.ledger.device_fact(self.name, "idle-baseline")
        fresh = old if old and time.time() - old["at"] < BASELINE_MAX_AGE_S else None
        if now is not None and (fresh is None or now <= fresh["c"]):
            self.ledger.set_device_fact(self.name, "idle-baseline", {"c": now, "at": time.time()})
            return now
        if fresh is not None:
            self.ev.stage(f"{self.name}: idle baseline {fresh['c']:.1f} °C, measured "
                          f"{(time.time() - fresh['at']) / 60:.0f} min ago (now "
                          + (f"{now:.1f} °C)" if now is not None else "unreadable)"))
            return fresh["c"]
        return now

    def _memory_budget(self) -> budgetmod.Budget:
        """One app's memory budget, measured now at first contact; like the idle baseline, a more generous
        reading of it from the last hours (the device idler then) is kept in the ledger and used instead."""
        now = budgetmod.from_facts(self.facts, self.device.ram_budget_bytes)
        if self.device.ram_budget_bytes or now.bytes is None:
            return now
        old = self.ledger.device_fact(self.name, "ram-budget")
        fresh = (old if old and time.time() - old.get("at", 0) < BASELINE_MAX_AGE_S and old.get("source") == now.source
                 else None)
        if fresh and fresh["bytes"] > now.bytes:
            return budgetmod.Budget(fresh["bytes"], fresh["source"],
                                    f"{fresh['detail']}, {(time.time() - fresh['at']) / 60:.0f} min ago "
                                    f"(now {budgetmod.gib(now.bytes)})")
        self.ledger.set_device_fact(self.name, "ram-budget", {**now.to_json(), "at": time.time()})
        return now

    def cooldown(self) -> Row:
        """Wait (bounded) until the hottest zone is within delta of the idle baseline: the wait as a row that
        says how it ended."""
        baseline = self.baseline
        if baseline is None:
            return Row(metric="cooldown_wait", value=0.0, phase="cell", test="no thermal zone: no wait")
        spec = self.telemetry
        limit = baseline + spec.cooldown_delta_c
        t0 = time.time()
        now = self.hottest()
        while now is not None and now > limit and time.time() - t0 < spec.cooldown_timeout_s:
            time.sleep(2.0)
            now = self.hottest()
        waited = time.time() - t0
        goal = f"baseline {baseline:.1f} °C + {spec.cooldown_delta_c:g}"
        if now is not None and now > limit:
            self.ev.stage(f"warning: {self.name} still at {now:.1f} °C after {waited:.0f} s ({goal}): measuring "
                          "warm; raise telemetry.cooldown_timeout_s to wait longer")
            return Row(metric="cooldown_wait", value=waited, phase="cell", test=f"timed out at {now:.1f} °C ({goal})")
        return Row(metric="cooldown_wait", value=waited, phase="cell",
                   test=f"reached {now:.1f} °C ({goal})" if now is not None else "thermal zone unreadable")


def read_pids(t, remote_out: str) -> dict[str, list[str]]:
    """run_payload.sh's pids file ('runner=1 payload=2 sampler=3 spin=4,5'), by role."""
    out: dict[str, list[str]] = {}
    for kv in (t.read_text(posixpath.join(remote_out, "pids")) or "").split():
        k, _, v = kv.partition("=")
        ids = [p for p in v.split(",") if p.isdigit()]
        if ids:
            out[k] = ids
    return out
