"""The executor: for each device, for each pending cell — ensure build, ensure model, cool down, run
the payload under the sampler, pull, normalize, record. Finished cells are never re-run."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import posixpath
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import facts as factsmod
from . import kit as kitmod
from . import lab as labmod
from . import paths, push, recipes
from .build import cache as buildcache
from .build import source as sourcemod
from .build import targets
from .errors import DevicelabError, RetryableError
from .hashing import sha256_file
from .ledger import DONE, SKIPPED, Ledger
from .models import store
from .models.ladder import Ladder
from .payloads import bench as benchp
from .payloads import perplexity as pplp
from .plan import Cell, expand
from .proc import run_logged, tail
from .schema import Row
from .telemetry import normalize, parsers, sampler_csv, snapshots
from .transports import open_transport
from .transports.base import CommandResult, Transport, quote_argv

PULLED = ("stdout.tsv", "stderr.txt", "telemetry.csv", "clock", "pids", "exit_code", "powermetrics.plist")


class SkipCell(Exception):
    """This device cannot run this cell (a reason, not an error): recorded as skipped."""


def parse_batched(stdout: str) -> list[Row]:
    rows = []
    for line in stdout.splitlines():
        line = line.split("\t", 1)[-1].strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        kw = dict(test=f"pp{r['pp']}+tg{r['tg']}x{r['pl']}", phase="parallel", n_prompt=r["pp"], n_gen=r["tg"],
                  n_parallel=r["pl"], threads=r.get("n_threads"), ctx=r.get("n_kv_max"))
        rows.append(Row(metric="aggregate_tps", value=float(r["speed"]), **kw))
        rows.append(Row(metric="aggregate_decode_tps", value=float(r["speed_tg"]), **kw))
    if not rows:
        raise DevicelabError("llama-batched-bench printed no result line; see the cell's stderr.txt")
    return rows


@dataclass
class RunReport:
    run_id: str
    total: int
    skipped: int
    ran: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Events:
    """What the executor tells the user; the CLI renders it with rich."""

    def stage(self, text: str) -> None: ...
    def build_progress(self, pct: float, line: str) -> None: ...
    def cells(self, total: int) -> None: ...
    def cell_start(self, cell: Cell) -> None: ...
    def cell_done(self, cell: Cell, ok: bool, note: str = "") -> None: ...


def resolve_text(spec: str, src: sourcemod.Source, base: Path | None = None) -> Path:
    if spec.startswith("llama.cpp:"):
        p = src.path / spec[len("llama.cpp:"):]
    else:
        p = Path(spec).expanduser()
        if not p.is_absolute() and base is not None and (base / p).exists():
            p = base / p            # relative paths in a recipe are relative to the recipe file
    if not p.exists():
        raise DevicelabError(f"perplexity text {spec} not found; give a text file path or 'llama.cpp:RELATIVE/PATH'")
    return p


def target_for(device: labmod.Device, facts: dict) -> targets.Target:
    if device.transport == "local":
        return targets.local_native()
    feats = set((facts.get("cpu.features") or "").split())
    arch = facts.get("arch", "")
    if device.transport == "ssh" and not device.cross_build:
        return targets.native_on_device(arch or "aarch64", "darwin" if "Darwin" in facts.get("uname", "") else "linux")
    if arch == platform.machine() and "Linux" in facts.get("uname", "") and device.transport == "ssh" \
            and set(buildcache.cpu_features()) <= feats:
        return targets.local_native()   # same arch and every CPU feature of this host: the host's build runs there
    if device.transport == "adb":
        ndk = targets.find_ndk()
        return targets.android_ndk(ndk, feats) if ndk else targets.aarch64_cross_static(feats)
    if arch in ("aarch64", "arm64") and "Darwin" not in facts.get("uname", ""):
        return targets.aarch64_cross_static(feats)
    if "Darwin" in facts.get("uname", ""):
        return targets.macos_metal()
    raise DevicelabError(f"no build target for {device.name} ({facts.get('uname')}); supported: local, aarch64 Linux, macOS")


class Executor:
    def __init__(self, recipe_path: Path, lab_path: Path | None, lab_dir: Path, events: Events | None = None,
                 source_override: str | None = None, jobs: int | None = None):
        self.recipe, self.recipe_sha = recipes.load(recipe_path)
        self.recipe_dir = Path(recipe_path).resolve().parent
        self.lab = labmod.load(lab_path)
        for d in self.recipe.devices:
            self.lab.device(d)      # unknown device: fail before anything runs
        self.ledger = Ledger(Path(lab_dir) / "ledger.sqlite")
        self.ev = events or Events()
        self.source_spec = source_override or self.recipe.source
        self.jobs = jobs
        self._host_build = None
        self._ladders: dict[str, Ladder] = {}
        self._model_paths: dict[str, Path] = {}

    # ---------- lazily prepared things ----------
    def host_build(self) -> buildcache.Build:
        if self._host_build is None:
            self.ev.stage("llama.cpp build for this host")
            self._host_build = buildcache.ensure(self.src, targets.local_native(), jobs=self.jobs,
                                                 progress=self.ev.build_progress)
        return self._host_build

    def ladder(self, model: str) -> Ladder:
        if model not in self._ladders:
            hb = self.host_build()
            self._ladders[model] = Ladder(model, self._model_paths[model], hb.tool("llama-quantize"),
                                          {"quantized_with_build": hb.key})
        return self._ladders[model]

    def kld_base(self, model: str, spec: dict) -> tuple[Path, float | None]:
        """Base logits, made once on the host per (base file, text, ctx, chunks)."""
        base = self.ladder(model).base()
        text = resolve_text(spec["text"], self.src, self.recipe_dir)
        key = hashlib.sha256(json.dumps([base.sha256, sha256_file(text), spec["ctx"], spec["chunks"]]).encode()).hexdigest()[:16]
        d = paths.sub("kld")
        out = d / f"{model}-{key}.kld"
        meta = out.with_suffix(".json")
        if out.exists() and meta.exists():
            return out, json.loads(meta.read_text()).get("ppl_base")
        hb = self.host_build()
        self.ev.stage(f"KLD base logits for {model} (host, once)")
        p = pplp.KLDParams(ctx=spec["ctx"], chunks=spec["chunks"], threads=max(1, (os.cpu_count() or 2)))
        log = d / f"{model}-{key}.log"
        log.write_text("")
        tmp = out.with_suffix(".part")
        run_logged(pplp.base_argv(str(hb.tool("llama-perplexity")), str(base.path), str(text), str(tmp), p), log,
                   what="llama-perplexity (KLD base)")
        tmp.rename(out)
        ppl = pplp.parse_base_ppl(log.read_text(errors="replace"))
        meta.write_text(json.dumps({"ppl_base": ppl, "base_sha256": base.sha256, "text": str(text), **spec}))
        return out, ppl

    def host_quant_logits(self, model: str, quant: str, spec: dict) -> Path:
        """The same quant file's logits made on the host: the reference a device's run of that file is
        checked against (a backend bug or a silent fallback on the device shows up as KLD > 0)."""
        qf = self.ladder(model).quant(quant)
        text = resolve_text(spec["text"], self.src, self.recipe_dir)
        key = hashlib.sha256(json.dumps([qf.sha256, sha256_file(text), spec["ctx"], spec["chunks"]]).encode()).hexdigest()[:16]
        out = paths.sub("kld") / f"{model}-{quant}-host-{key}.kld"
        if out.exists():
            return out
        hb = self.host_build()
        p = pplp.KLDParams(ctx=spec["ctx"], chunks=spec["chunks"], threads=max(1, os.cpu_count() or 2))
        log = out.with_suffix(".log")
        log.write_text("")
        tmp = out.with_suffix(".part")
        run_logged(pplp.base_argv(str(hb.tool("llama-perplexity")), str(qf.path), str(text), str(tmp), p), log,
                   what=f"llama-perplexity (host logits of {quant})")
        tmp.rename(out)
        return out

    # ---------- main ----------
    def run(self) -> RunReport:
        t0 = time.time()
        r = self.recipe
        self.src = sourcemod.resolve(self.source_spec)
        for m in r.models:
            self._model_paths[m.name] = store.resolve(m.source)
        shas = {m.name: sha256_file(self._model_paths[m.name]) for m in r.models}
        cells = expand(r, self.src.commit, shas)
        self.ledger.register(cells)
        todo = [c for c in cells if self.ledger.status(c.cell_id) not in (DONE, SKIPPED)]
        run_id = self.ledger.start_run(r.name, self.recipe_sha, len(cells))
        rep = RunReport(run_id, len(cells), len(cells) - len(todo))
        self.ev.cells(len(todo))
        status = "done"
        try:
            for dev_name in r.devices:
                dcells = [c for c in todo if c.device == dev_name]
                if dcells:
                    self._run_device(self.lab.device(dev_name), dcells, run_id, rep)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            rep.seconds = time.time() - t0
            if rep.failed and status == "done":
                status = "failed"
            self.ledger.finish_run(run_id, status, rep.ran, rep.skipped)
        return rep

    def _run_device(self, dev: labmod.Device, cells: list[Cell], run_id: str, rep: RunReport) -> None:
        try:
            t = open_transport(dev)
            t.connect()
        except DevicelabError as e:
            for c in cells:
                self.ledger.fail_cell(c.cell_id, str(e), retryable=True)
                rep.failed.append(c.cell_id)
                self.ev.cell_done(c, False, str(e))
            return
        try:
            self.ev.stage(f"{dev.name}: device facts and kit")
            kit = kitmod.ensure(t)
            facts = factsmod.collect(t, kit)
            baseline = self._idle_baseline(t, kit, dev)     # before a native build can warm the device
            if dev.target:
                feats = set((dev.cpu_features or facts.get("cpu.features") or "").split())
                tgt = targets.by_name(dev.target, feats)
            else:
                tgt = target_for(dev, facts)
            if dev.transport == "adb" and not tgt.name.startswith("arm64-v8a-android"):
                self.ev.stage(f"warning: no Android NDK (set ANDROID_NDK_HOME): {dev.name} gets a static aarch64 "
                              "Linux build, which runs on Android's kernel but misses NDK-only paths (bionic, "
                              "Android's libc++ and its CPU feature detection)")
            if tgt.where == "host" and tgt.name == targets.local_native().name:
                build = self.host_build()
            elif tgt.where == "device":
                from .build import remote
                self.ev.stage(f"llama.cpp native build on {dev.name} ({tgt.name})")
                build = remote.ensure(t, self.src, tgt, jobs=self.jobs)
            else:
                self.ev.stage(f"llama.cpp build for {dev.name} ({tgt.name})")
                build = buildcache.ensure(self.src, tgt, jobs=self.jobs, progress=self.ev.build_progress)
            self._snap_tools = snapshots.available(t)
            if snapshots.restore_if_pending(t, self._snap_tools, bool(self.ledger.device_fact(dev.name, "battery-unplugged"))):
                self.ledger.set_device_fact(dev.name, "battery-unplugged", False)
                self.ev.stage(f"{dev.name}: charging state restored (dumpsys battery reset): an earlier run lost "
                              "the device while it was set unplugged")
            # macOS: the SoC's energy model (CPU/GPU/ANE) beside each payload, where the user may run it
            self._powermetrics = snapshots.powermetrics_access(t) if "ioreg" in self._snap_tools else ""
            if "ioreg" in self._snap_tools and not self._powermetrics:
                self.ev.stage(f"note: {dev.name} has no power figures without powermetrics, which needs root: allow "
                              "it with a sudoers rule (NOPASSWD: /usr/bin/powermetrics) for the SSH user")
            self._governor = self._pin_governor(t, kit, dev) if dev.governor else None
            for c in cells:
                self.ev.cell_start(c)
                try:
                    self._run_cell(t, dev, kit, facts, build, baseline, c, run_id)
                    rep.ran += 1
                    self.ev.cell_done(c, True)
                except SkipCell as e:
                    rep.ran += 1
                    self.ev.cell_done(c, True, f"skipped: {e}")
                except KeyboardInterrupt:
                    self.ledger.fail_cell(c.cell_id, "interrupted by the user", retryable=True)
                    raise
                except RetryableError as e:
                    self.ledger.fail_cell(c.cell_id, str(e), retryable=True)
                    rep.failed.append(c.cell_id)
                    self.ev.cell_done(c, False, str(e))
                except DevicelabError as e:
                    self.ledger.fail_cell(c.cell_id, str(e), retryable=False)
                    rep.failed.append(c.cell_id)
                    self.ev.cell_done(c, False, str(e))
        finally:
            if getattr(self, "_governor", None) and self._governor.startswith("pinned"):
                self._governor_cmd(t, kit, ["restore", self._governor_state(t), dev.telemetry_root])
            self._governor = None
            t.close()

    def _governor_state(self, t: Transport) -> str:
        return posixpath.join(t.workdir(), "governor.saved")

    def _governor_cmd(self, t: Transport, kit: str, args: list[str]) -> str:
        """governor.sh as the device user, then through `su -c` (rooted phones) if that was refused."""
        argv = ["sh", f"{kit}/governor.sh", *args]
        out = t.run(argv, timeout=60).stdout.strip()
        if "permission denied" in out:
            su = t.run(["su", "-c", quote_argv(argv)], timeout=60)
            if su.rc == 0 and su.stdout.strip():
                out = su.stdout.strip()
        return out

    def _pin_governor(self, t: Transport, kit: str, dev: labmod.Device) -> str:
        """Pin every cpufreq policy to dev.governor for this device's cells (restored afterwards); the
        outcome, pinned or why not, goes into every row's `governor` column."""
        out = self._governor_cmd(t, kit, ["set", dev.governor, self._governor_state(t), dev.telemetry_root])
        if not out.startswith("pinned"):
            self.ev.stage(f"warning: {dev.name}: governor {dev.governor} not pinned ({out or 'no answer'}); "
                          "measuring with the device's own governor")
            return f"not pinned: {out}"
        return out

    def _hottest(self, t: Transport, kit: str, dev: labmod.Device) -> float | None:
        r = t.run(["sh", f"{kit}/thermal.sh", dev.telemetry_root], timeout=30)
        try:
            return normalize.temp_to_c(float(r.stdout.strip()))
        except ValueError:
            return None

    BASELINE_MAX_AGE_S = 6 * 3600

    def _idle_baseline(self, t: Transport, kit: str, dev: labmod.Device) -> float | None:
        """The device's idle temperature: its hottest zone at first contact, or a cooler reading of it kept in
        the ledger from the last hours (a run resumed right after a heavy one starts on a warm device)."""
        now = self._hottest(t, kit, dev)
        old = self.ledger.device_fact(dev.name, "idle-baseline")
        fresh = old if old and time.time() - old["at"] < self.BASELINE_MAX_AGE_S else None
        if now is not None and (fresh is None or now <= fresh["c"]):
            self.ledger.set_device_fact(dev.name, "idle-baseline", {"c": now, "at": time.time()})
            return now
        if fresh is not None:
            self.ev.stage(f"{dev.name}: idle baseline {fresh['c']:.1f} °C, measured "
                          f"{(time.time() - fresh['at']) / 60:.0f} min ago (now " + (f"{now:.1f} °C)" if now is not None else "unreadable)"))
            return fresh["c"]
        return now

    def _cooldown(self, t: Transport, kit: str, dev: labmod.Device, baseline: float | None) -> Row:
        """Wait (bounded) until the hottest zone is within delta of the idle baseline: the wait as a row that
        says how it ended."""
        if baseline is None:
            return Row(metric="cooldown_wait", value=0.0, phase="cell", test="no thermal zone: no wait")
        spec = self.recipe.telemetry
        limit = baseline + spec.cooldown_delta_c
        t0 = time.time()
        now = self._hottest(t, kit, dev)
        while now is not None and now > limit and time.time() - t0 < spec.cooldown_timeout_s:
            time.sleep(2.0)
            now = self._hottest(t, kit, dev)
        waited = time.time() - t0
        goal = f"baseline {baseline:.1f} °C + {spec.cooldown_delta_c:g}"
        if now is not None and now > limit:
            self.ev.stage(f"warning: {dev.name} still at {now:.1f} °C after {waited:.0f} s ({goal}): measuring warm; "
                          "raise telemetry.cooldown_timeout_s to wait longer")
            return Row(metric="cooldown_wait", value=waited, phase="cell", test=f"timed out at {now:.1f} °C ({goal})")
        return Row(metric="cooldown_wait", value=waited, phase="cell",
                   test=f"reached {now:.1f} °C ({goal})" if now is not None else "thermal zone unreadable")

    def _tool(self, t: Transport, build, tool: str) -> str:
        if tool not in build.manifest["tools"]:
            raise SkipCell(f"the {build.manifest['target']} build has no {tool}")
        if build.manifest.get("where") == "device":
            return build.tool(tool)                       # built on the device, already there
        return push.ensure(t, build.tool(tool), build.manifest["tools"][tool], tool, mode="755")

    def _prepare(self, t: Transport, dev: labmod.Device, kit: str, facts: dict, build, c: Cell):
        """Per payload kind: the device command line(s), the environment, and the model file if any."""
        P = c.params
        ncpu = facts.get("cpu_count") or 1
        env: dict[str, str] = {}
        qf = None
        if c.payload != "membw":
            qf = self.ladder(c.model).quant(c.quant)
            remote_model = push.ensure(t, qf.path, qf.sha256, qf.path.name)
        runs: list[tuple[str, list[str]]] = []
        if c.payload == "bench":
            mask, threads = self._affinity(P, facts, dev)
            bp = benchp.BenchParams(prompt=tuple(P["prompt"]), gen=tuple(P["gen"]), pg=tuple(tuple(x) for x in P["pg"]),
                                    depth=tuple(P["depth"]), threads=threads, repetitions=P["repetitions"],
                                    warmup=P["warmup"], cpu_mask=mask,
                                    cache_type_k=P.get("cache_type_k"), cache_type_v=P.get("cache_type_v"))
            runs.append(("main", benchp.argv(self._tool(t, build, "llama-bench"), remote_model, bp)))
            if P.get("contention"):
                env["DEVICELAB_CONTENTION"] = str(P["contention"])
        elif c.payload == "kld":
            tool = self._tool(t, build, "llama-perplexity")
            logits, _ = self.kld_base(c.model, P)
            remote_logits = push.ensure(t, logits, sha256_file(logits), logits.name)
            kp = pplp.KLDParams(ctx=P["ctx"], chunks=P["chunks"], threads=P.get("threads") or ncpu)
            runs.append(("main", pplp.kld_argv(tool, remote_model, remote_logits, kp)))
            check = P.get("host_check")
            if check is None:
                check = dev.transport != "local" or bool(dev.exec_prefix) or bool(dev.target)
            if check:
                hl = self.host_quant_logits(c.model, c.quant, P)
                rl = push.ensure(t, hl, sha256_file(hl), hl.name)
                runs.append(("check", pplp.kld_argv(tool, remote_model, rl, kp)))
        elif c.payload == "membw":
            from .build import payloads as bpay
            exe = bpay.ensure_membw(build)
            remote = push.ensure(t, exe, sha256_file(exe), "membw", mode="755")
            a = [remote, "-m", str(P["mib"]), "-r", str(P["repetitions"])]
            a += ["-t", str(P.get("threads") or ncpu)]
            runs.append(("main", a))
        elif c.payload == "batched":
            tool = self._tool(t, build, "llama-batched-bench")
            npl = P["parallel"]
            a = [tool, "-m", remote_model, "-c", str(max(npl) * (P["prompt"] + P["gen"])), "-b", "2048", "-ub", "512",
                 "-npp", str(P["prompt"]), "-ntg", str(P["gen"]), "-npl", ",".join(map(str, npl)),
                 "-t", str(P.get("threads") or ncpu), "--output-format", "jsonl"]
            if P.get("cache_type_k"):
                a += ["-ctk", P["cache_type_k"]]
            if P.get("cache_type_v"):
                a += ["-ctv", P["cache_type_v"]]
            runs.append(("main", a))
        elif c.payload == "eval" and P["route"] == "server-generate":
            tool = self._tool(t, build, "llama-server")
            slots = P["slots"]
            port = random.randint(20000, 45000)          # on the device's loopback only
            runs.append(("main", [tool, "-m", remote_model, "-c", str(P["ctx"] * slots), "-np", str(slots),
                                  "--host", "127.0.0.1", "--port", str(port), "-t", str(P.get("threads") or ncpu),
                                  "--metrics", "--no-webui"]))
        elif c.payload == "eval":
            from .payloads import evals
            tool = self._tool(t, build, "llama-perplexity")
            data = resolve_text(P["data"], self.src, self.recipe_dir)
            rd = push.ensure(t, data, sha256_file(data), data.name)
            runs.append(("main", evals.device_mc_argv(tool, remote_model, rd, P, P.get("threads") or ncpu)))
        return runs, env, qf

    def _affinity(self, P: dict, facts: dict, dev: labmod.Device) -> tuple[str | None, int]:
        """llama-bench's -C mask and -t count for a bench cell: named masks (prime/big/little/all) are
        resolved from the device's cpufreq clusters; threads 'auto' = one per CPU of the mask."""
        name = P.get("cpu_mask")
        cpus = None
        mask = name
        if name in factsmod.MASK_NAMES:
            cpus = factsmod.named_cpus(name, facts)
            if cpus is None:
                raise SkipCell(f"{dev.name} has no big.LITTLE clusters to pick '{name}' from (its cpufreq max "
                               "frequencies are all equal or unreadable)")
            mask = factsmod.mask_hex(cpus)
            self._cell_extra["cpu_mask"] = f"{name}={mask}"
        elif name:
            cpus = [i for i in range(int(name, 16).bit_length()) if int(name, 16) >> i & 1]
        threads = P["threads"]
        if threads == "auto":
            threads = len(cpus) if cpus else (facts.get("cpu_count") or 1)
        return mask, int(threads)

    def _run_cell(self, t: Transport, dev: labmod.Device, kit: str, facts: dict, build,
                  baseline: float | None, c: Cell, run_id: str) -> None:
        if c.payload == "eval" and c.params.get("route") == "host-loglikelihood":
            return self._run_host_eval(dev, facts, c, run_id)
        self._cell_extra: dict = {}             # provenance resolved while preparing (named CPU masks)
        try:
            runs, env, qf = self._prepare(t, dev, kit, facts, build, c)
        except SkipCell as e:
            self.ledger.begin_cell(c.cell_id, run_id)
            self.ledger.skip_cell(c.cell_id, str(e))
            return
        attempt, prev = self.ledger.begin_cell(c.cell_id, run_id)
        if prev:
            self._kill_stale(t, prev)
        cgroup = None
        if c.payload == "bench" and c.params.get("quota"):
            q = float(c.params["quota"])
            r = t.run(["sh", f"{kit}/cgroup.sh", "create", c.cell_id, str(int(q * 100000)), "100000"])
            out = r.stdout.strip()
            if not out or out.startswith("unsupported"):
                self.ledger.skip_cell(c.cell_id, f"CPU quota not available on {dev.name}: {out or r.stderr.strip()}")
                raise SkipCell(out)
            cgroup = out.split(" ", 1)[1]
            env["DEVICELAB_CGROUP"] = cgroup
        if getattr(self, "_powermetrics", ""):
            env["DEVICELAB_POWERMETRICS"] = self._powermetrics
        cooldown = self._cooldown(t, kit, dev, baseline)
        base_remote = posixpath.join(t.workdir(), "cells", c.cell_id, f"attempt-{attempt}")
        local_base = self.ledger.artifacts_dir / c.cell_id / f"attempt-{attempt}"
        self.ledger.set_artifacts(c.cell_id, base_remote)
        tools = getattr(self, "_snap_tools", set())
        results = {}
        try:
            with snapshots.ChargingHygiene(t, tools, pending=lambda on: self.ledger.set_device_fact(
                    dev.name, "battery-unplugged", on)):
                local_base.mkdir(parents=True, exist_ok=True)
                snap_rows, snap_start = snapshots.take(t, tools, "start", local_base)
                if snap_start.get("dumpsys-power", {}).get("screen_on") and not getattr(self, "_screen_warned", False):
                    self._screen_warned = True
                    self.ev.stage(f"warning: {dev.name}'s screen is on: turn it off for measurements (the display "
                                  "draws power and heats the phone); its state is recorded with every cell")
                for name, argv in runs:
                    remote_out = base_remote if name == "main" else posixpath.join(base_remote, name)
                    local_out = local_base if name == "main" else local_base / name
                    runner = ["sh", f"{kit}/run_payload.sh", remote_out, str(self.recipe.telemetry.interval_ms),
                              dev.telemetry_root, "--", *dev.exec_prefix, *argv]
                    if c.payload == "eval" and c.params["route"] == "server-generate":
                        results[name], served = self._serve_and_drive(t, runner, env, remote_out, local_out, c, argv)
                    else:
                        results[name] = self._run_and_pull(t, runner, env, remote_out, local_out, c, argv[0])
                more, snap_end = snapshots.take(t, tools, "end", local_base)
                snap_rows += more
        finally:
            if cgroup:
                t.run(["sh", f"{kit}/cgroup.sh", "remove", cgroup])
        stdout, stderr, trace, cell_window = results["main"]
        rows: list[Row] = []
        phases: list[normalize.Phase] = []
        if c.payload == "bench":
            tests = benchp.parse(stdout)
            rows += benchp.rows(tests)
            for bt in tests:
                w = bt.window()
                if w:
                    n = len(bt.record.get("samples_ns") or [])
                    phases.append(normalize.Phase(bt.name, bt.kind, w[0], w[1], bt.tokens * n, n))
            if phases and cell_window and min(p.start for p in phases) > cell_window[0]:
                # from the payload's start to its first timed test: model load (+ warmup)
                phases.insert(0, normalize.Phase("load", "load", cell_window[0], min(p.start for p in phases)))
        elif c.payload == "kld":
            kp = pplp.KLDParams(ctx=c.params["ctx"], chunks=c.params["chunks"],
                                threads=c.params.get("threads") or facts.get("cpu_count") or 1)
            rows += pplp.parse_kld(stdout + "\n" + stderr, kp)
            if "check" in results:
                chk = {r.metric: r for r in pplp.parse_kld(results["check"][0] + "\n" + results["check"][1], kp)}
                for src, dst in (("kld_mean", "devhost_kld_mean"), ("same_top_p", "devhost_same_top_p")):
                    r = chk[src]
                    rows.append(Row(metric=dst, value=r.value, stddev=r.stddev, test=r.test, phase="host-check",
                                    ctx=r.ctx, n=r.n, missing_reason=r.missing_reason))
        elif c.payload == "membw":
            from .build import payloads as bpay
            rows += bpay.membw_rows(stdout)
        elif c.payload == "batched":
            rows += parse_batched(stdout)
        elif c.payload == "eval" and c.params["route"] == "server-generate":
            from .payloads import lmeval
            lm_res, marks, counters = served
            rows += lmeval.rows(lm_res, "server-generate")
            gen, prompt = counters.get("tokens_predicted_total"), counters.get("prompt_tokens_total")
            for metric, v in (("tokens_generated", gen), ("tokens_prompt", prompt)):
                if v is not None:
                    rows.append(Row(metric=metric, value=v, phase="eval", n_parallel=c.params["slots"]))
            ready, done = marks.get("ready"), marks.get("done")
            if cell_window and ready is not None and done is not None and done > ready:
                phases.append(normalize.Phase("load", "load", cell_window[0], ready))
                phases.append(normalize.Phase("lm-eval", "eval", ready, done, int(gen or 0)))
                if gen:
                    rows.append(Row(metric="eval_gen_tps", value=gen / (done - ready), phase="eval",
                                    n_parallel=c.params["slots"], test="generated tokens / lm-eval wall time"))
        elif c.payload == "eval":
            from .payloads import evals
            plain = "\n".join(l.split("\t", 1)[1] if "\t" in l else l for l in stdout.splitlines())
            rows += evals.parse_device_mc(plain + "\n" + stderr, c.params)
        pmf = local_base / "powermetrics.plist"
        summ = normalize.summarize(trace, phases, cell_window,
                                   parsers.powermetrics(pmf.read_bytes()) if pmf.is_file() else None,
                                   prior_calibration=self.ledger.device_fact(dev.name, "battery-calibration"))
        rows += summ.rows + snap_rows
        ts0 = snap_start.get("dumpsys-thermalservice", {}).get("thermal_status")
        ts1 = snap_end.get("dumpsys-thermalservice", {}).get("thermal_status")
        if ts0 is not None and ts1 is not None and ts1 > ts0:
            summ.throttled = True          # Android's thermal status rose during the cell
        if cell_window:
            rows.append(Row(metric="wall_seconds", value=cell_window[1] - cell_window[0], phase="cell"))
        rows.append(cooldown)
        if baseline is not None:
            rows.append(Row(metric="temp_baseline", value=baseline, phase="cell"))
        ctx = {
            "run_id": run_id, "cell_id": c.cell_id, "recipe": c.recipe, "device": c.device,
            "target": build.manifest["target"], "model": c.model, "quant": c.quant, "payload": c.payload,
            "build_commit": build.manifest["commit"], "build_flags": build.manifest["flags"],
            "build_key": build.key, "device_facts": factsmod.summary(facts),
            "device_mem_bytes": dev.ram_budget_bytes or facts.get("mem_total_bytes"),
            "temp_start_c": summ.temp_start_c, "temp_end_c": summ.temp_end_c, "throttled": summ.throttled,
            "cpu_mask": c.params.get("cpu_mask"), "cpu_quota": c.params.get("quota"),
            "contention": c.params.get("contention"),
        }
        ctx.update(self._cell_extra)
        ctx["governor"] = getattr(self, "_governor", None)
        if c.payload == "eval":
            ctx["eval_route"] = c.params["route"]
            ctx["eval_engine"] = "llama-server + lm-eval" if c.params["route"] == "server-generate" else "llama-perplexity"
        if qf is not None:
            ctx.update(self._model_context(c, qf))
        for row in rows:
            row.context = ctx
        ctx["energy_calibration"] = summ.calibration or None
        (local_base / "calibration.json").write_text(json.dumps(summ.calibration, default=str))
        self.ledger.finish_cell(c.cell_id, rows)
        if summ.calibration.get("method") in {n for n, _ in normalize.COUNTERS}:
            # the battery's counter moved during this cell: the device's calibration from now on, for
            # cells too short for its counter to move
            self.ledger.set_device_fact(dev.name, "battery-calibration", {**summ.calibration, "cell": c.cell_id})

    def _model_context(self, c: Cell, qf) -> dict:
        info = qf.info
        kv_per_tok = None
        try:
            from .models.gguf_info import ModelInfo
            mi = ModelInfo(**{k: info[k] for k in ModelInfo.__dataclass_fields__})
            kv_per_tok = mi.kv_cache_bytes(1)
        except (DevicelabError, KeyError, TypeError):
            pass
        base_man = self.ladder(c.model).base().manifest
        return {"model_sha256": qf.sha256, "model_bytes": qf.manifest["bytes"], "bpw": qf.manifest["bpw"],
                "n_params": info.get("n_params"), "kv_bytes_per_token": kv_per_tok,
                "tensor_types": qf.manifest["tensor_types"], "base_note": base_man.get("note")}

    # ---------- lm-eval routes ----------
    def _include(self, P: dict) -> Path | None:
        return recipes.resolve_include(P["include"], self.recipe_dir) if P.get("include") else None

    def host_eval(self, model: str, quant: str, P: dict) -> dict:
        """lm-eval log-likelihood tasks on the host through llama-cpp-python, once per (file, tasks, task
        files, limit, ctx, engine versions): every device of a recipe shares the file's score."""
        from .payloads import lmeval
        qf = self.ladder(model).quant(quant)
        include = self._include(P)
        files = sorted(p for p in include.rglob("*") if p.is_file() and not p.name.endswith(".sha256.json")) \
            if include else []
        versions = lmeval.versions()
        tasks_digest = [(str(p.relative_to(include)), hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]
        key = hashlib.sha256(json.dumps([qf.sha256, tasks_digest, P["lm_tasks"],
                                         P.get("limit"), P["ctx"], versions]).encode()).hexdigest()[:16]
        out = paths.sub("evals") / f"{model}-{quant}-host-{key}.json"
        if out.exists():
            return json.loads(out.read_text())
        self.ev.stage(f"lm-eval {', '.join(P['lm_tasks'])} on the host (llama-cpp-python) for {model} {quant}")
        t0 = time.time()
        # one core left free: llama.cpp's OpenMP threads spin at barriers, and one thread per core with
        # anything else running slows scoring ~30× (measured on this 2-core VM: 0.24 s vs 7.8 s per request)
        lm = lmeval.host_lm(qf.path, P["ctx"], P.get("threads") or max(1, (os.cpu_count() or 2) - 1))
        res = lmeval.evaluate("host-loglikelihood", lm, P["lm_tasks"], include, P.get("limit"))
        keep = {k: res.get(k) for k in ("results", "configs", "n-samples", "versions")}
        keep["provenance"] = {**lm.provenance, **versions, "seconds": time.time() - t0}
        text = json.dumps(keep, default=str)
        tmp = out.with_suffix(".part")
        tmp.write_text(text)
        tmp.rename(out)
        return json.loads(text)              # the same shape as a cached result

    def _run_host_eval(self, dev: labmod.Device, facts: dict, c: Cell, run_id: str) -> None:
        from .payloads import lmeval
        self.ledger.begin_cell(c.cell_id, run_id)
        res = self.host_eval(c.model, c.quant, c.params)
        prov = res["provenance"]
        rows = lmeval.rows(res, "host-loglikelihood")
        rows.append(Row(metric="wall_seconds", value=prov["seconds"], phase="cell", test="lm-eval on the host"))
        qf = self.ladder(c.model).quant(c.quant)
        ctx = {"run_id": run_id, "cell_id": c.cell_id, "recipe": c.recipe, "device": c.device,
               "target": "host (llama-cpp-python)", "model": c.model, "quant": c.quant, "payload": c.payload,
               "build_commit": prov["eval_engine"], "build_flags": {"system_info": prov.get("eval_engine_system_info")},
               "build_key": None, "device_facts": factsmod.summary(facts),
               "device_mem_bytes": dev.ram_budget_bytes or facts.get("mem_total_bytes"),
               "eval_route": "host-loglikelihood", "eval_engine": f"{prov['eval_engine']} + lm-eval {prov.get('lm_eval')}"}
        ctx.update(self._model_context(c, qf))
        for row in rows:
            row.context = ctx
        self.ledger.finish_cell(c.cell_id, rows)

    def _device_clock(self, t: Transport) -> float | None:
        """The sampler's clock (device uptime) now, to place host-side events in its trace."""
        r = t.run(["cat", "/proc/uptime"], timeout=30)
        try:
            return float(r.stdout.split()[0])
        except (ValueError, IndexError):
            return None

    def _payload_pid(self, t: Transport, remote_out: str) -> str | None:
        for _ in range(50):                  # the runner writes its pids file right after starting
            pid = _read_pids(t, remote_out).get("payload")
            if pid:
                return pid[0]
            time.sleep(0.1)
        return None

    def _serve_and_drive(self, t: Transport, runner, env, remote_out, local_out, c: Cell, argv):
        """llama-server on the device under the sampler (a host thread waits on it), lm-eval on the host
        through a forwarded port, then the server is stopped and its artifacts pulled like any payload's."""
        from .payloads import lmeval
        P = c.params
        port = int(argv[argv.index("--port") + 1])
        box: dict = {}

        def serve():
            try:
                box["res"] = t.run(runner, timeout=6 * 3600, env=env or None)
            except BaseException as e:  # noqa: BLE001 - re-raised on the main thread
                box["err"] = e

        th = threading.Thread(target=serve, daemon=True, name=f"llama-server {c.cell_id}")
        th.start()
        marks: dict = {}
        counters: dict = {}
        lm_res = None
        failure: BaseException | None = None
        try:
            with t.forward(port) as lp:
                url = f"http://127.0.0.1:{lp}"
                self._wait_ready(url, th, t, remote_out, c)
                marks["ready"] = self._device_clock(t)
                client = lmeval.server_client(url, P["chat"], P["slots"], c.model)
                lm_res = lmeval.evaluate("server-generate", client, P["lm_tasks"], self._include(P), P.get("limit"))
                marks["done"] = self._device_clock(t)
                counters = _prometheus(url + "/metrics")
        except (DevicelabError, OSError) as e:
            failure = e
        finally:
            try:
                pid = self._payload_pid(t, remote_out)
                if pid:
                    t.run(["kill", pid])
                    th.join(60)
                    if th.is_alive():
                        t.run(["kill", "-9", pid])
            except (DevicelabError, OSError):
                pass                      # the device is gone: its thread below says so
            th.join(120)
        if "err" in box:                  # the device side failed (a lost phone/board is retryable)
            raise box["err"] from failure
        if isinstance(failure, OSError):
            raise RetryableError(f"{c.label()}: the forwarded port to llama-server failed: {failure}") from failure
        if failure is not None:
            raise failure
        res = box.get("res") or CommandResult(runner, 124, "", "llama-server did not stop")
        if res.rc in (130, 143):             # stopped by us (SIGINT/SIGTERM): the payload's normal end here
            res = CommandResult(res.argv, 0, res.stdout, res.stderr)
        return self._pull(t, res, runner, env, remote_out, local_out, c, argv[0]), (lm_res, marks, counters)

    def _wait_ready(self, url: str, th: threading.Thread, t: Transport, remote_out: str, c: Cell,
                    timeout: float = 900) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if not th.is_alive():
                err = t.read_text(posixpath.join(remote_out, "stderr.txt")) or ""
                last = " | ".join(l.strip() for l in tail(err, 3).splitlines() if l.strip())
                raise DevicelabError(f"{c.label()}: llama-server exited before it was ready: {last[:300]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.5)
        raise RetryableError(f"{c.label()}: llama-server not ready after {timeout:.0f}s")

    def _run_and_pull(self, t, runner, env, remote_out, local_out, c, tool):
        res = t.run(runner, timeout=6 * 3600, env=env or None)
        return self._pull(t, res, runner, env, remote_out, local_out, c, tool)

    def _pull(self, t, res, runner, env, remote_out, local_out, c, tool):
        local_out.mkdir(parents=True, exist_ok=True)
        (local_out / "argv.json").write_text(json.dumps({"argv": runner, "env": env}))
        for name in PULLED:
            try:
                t.get(posixpath.join(remote_out, name), local_out / name)
            except (OSError, IOError):
                pass
        stderr = (local_out / "stderr.txt").read_text(errors="replace") if (local_out / "stderr.txt").exists() else res.stderr
        if res.rc != 0:
            if not (local_out / "exit_code").exists():
                raise RetryableError(f"{c.label()}: the payload runner did not finish ({res.stderr.strip()[:200]})")
            raise DevicelabError(f"{c.label()}: {posixpath.basename(tool)} exited {res.rc}: {tail(stderr, 3)[:300]}")
        stdout = (local_out / "stdout.tsv").read_text(errors="replace")
        clock = dict(l.split("=", 1) for l in (local_out / "clock").read_text().splitlines() if "=" in l)
        trace = sampler_csv.parse((local_out / "telemetry.csv").read_text(errors="replace")
                                  if (local_out / "telemetry.csv").exists() else "")
        cell_window = None
        try:
            cell_window = (float(clock["start_s"]), float(clock["end_s"]))
        except (KeyError, ValueError):
            pass
        return stdout, stderr, trace, cell_window

    def _kill_stale(self, t: Transport, prev_remote_out: str) -> None:
        """A previous attempt was cut off (host killed): stop what it left running on the device."""
        for pids in _read_pids(t, prev_remote_out).values():
            for pid in pids:
                t.run(["kill", pid])


def _read_pids(t: Transport, remote_out: str) -> dict[str, list[str]]:
    """run_payload.sh's pids file ('runner=1 payload=2 sampler=3 spin=4,5'), by role."""
    out: dict[str, list[str]] = {}
    for kv in (t.read_text(posixpath.join(remote_out, "pids")) or "").split():
        k, _, v = kv.partition("=")
        ids = [p for p in v.split(",") if p.isdigit()]
        if ids:
            out[k] = ids
    return out


def _prometheus(url: str) -> dict[str, float]:
    """llama-server's /metrics counters (llamacpp:NAME VALUE), by NAME."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return out
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, v = line[len("llamacpp:"):].partition(" ")
            try:
                out[name] = float(v.split()[0])
            except (ValueError, IndexError):
                pass
    return out
