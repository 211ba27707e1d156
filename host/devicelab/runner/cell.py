"""One cell, kind-agnostic: prepare (the kind's command lines) → cool down → run under the sampler, with
its conditions → pull → derive rows from the stored artifacts (the kind's pure parser) → record."""

from __future__ import annotations

import json
import posixpath
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack

from .. import facts as factsmod
from .. import kinds
from .. import lab as labmod
from ..errors import DevicelabError, RetryableError
from ..kinds.base import HOST, SERVED, SkipCell
from ..models.gguf_info import ModelInfo
from ..proc import tail
from ..telemetry import normalize, snapshots
from ..transports.base import CommandResult
from . import artifacts
from .conditions import Charging, Contention, Powermetrics, Quota
from .session import DeviceSession, read_pids

PULLED = ("stdout.tsv", "stderr.txt", "telemetry.csv", "clock", "pids", "exit_code", "powermetrics.plist",
          "nvidia-smi.csv")


class CellContext:
    """What a kind's prepare / drive / on_host may use: the device's facts, its build's tools, pushes, and
    the host's shared work."""

    def __init__(self, s: DeviceSession, cell):
        self.s, self.cell = s, cell
        self.facts, self.device, self.host = s.facts, s.name, s.host
        self.same_build_as_host = s.same_build_as_host
        self.qf = None

    def tool(self, name: str) -> str:
        return self.s.tool(name, self.cell.params.get("backend"))

    def push(self, path) -> str:
        return self.s.push(path)

    def quant_file(self):
        if self.qf is None:
            self.qf = self.host.quant(self.cell.model, self.cell.quant)
        return self.qf

    def model(self) -> str:
        qf = self.quant_file()
        return self.s.push(qf.path, qf.sha256, name=qf.path.name)

    def membw(self) -> str:
        exe = self.host.membw(self.s.build)
        return self.s.push(exe, mode="755", name="membw")


def model_context(host, model: str, qf) -> dict:
    info = qf.info
    kv_per_tok = None
    try:
        mi = ModelInfo(**{k: info[k] for k in ModelInfo.__dataclass_fields__})
        kv_per_tok = mi.kv_cache_bytes(1)
    except (DevicelabError, KeyError, TypeError):
        pass
    return {"model_sha256": qf.sha256, "model_bytes": qf.manifest["bytes"], "bpw": qf.manifest["bpw"],
            "n_params": info.get("n_params"), "kv_bytes_per_token": kv_per_tok,
            "tensor_types": qf.manifest["tensor_types"], "base_note": host.base(model).manifest.get("note"),
            "model_source": host.model_source(model).provenance, "imatrix": qf.manifest.get("imatrix_from")}


def base_context(s: DeviceSession, cell, run_id: str) -> dict:
    on_host = kinds.get(cell.payload).where(cell.params) == HOST       # this host's llama.cpp, not the device's
    b = s.build if on_host else s.build_for(cell.params.get("backend"))
    return {"run_id": run_id, "cell_id": cell.cell_id, "recipe": cell.recipe, "device": cell.device,
            "target": b.manifest["target"], "model": cell.model, "quant": cell.quant, "payload": cell.payload,
            "build_commit": b.manifest["commit"], "build_flags": b.manifest["flags"], "build_key": b.key,
            "device_facts": factsmod.summary(s.facts), "lab_host": labmod.this_host(),
            "backend": cell.params.get("backend") or s.default_backend,
            "gpu_device": next((d for _, d in s.gpu_devices.get(cell.params.get("backend"), [])), None),
            "device_mem_bytes": s.device.ram_budget_bytes or s.facts.get("mem_total_bytes"),
            "ram_budget_bytes": s.budget.bytes, "ram_budget_source": s.budget.line(),
            "battery_wh": s.battery_wh, "battery_source": s.battery_source,
            **s.provenance, **kinds.get(cell.payload).provenance(cell.params)}


# a run whose output lost its last lines (llama.cpp's logger is not flushed at exit: upstream issue 22142) is run
# again this many times at most; the runs are kept in cell.json
LOST_TAIL_RERUNS = 4


def run_cell(s: DeviceSession, cell, run_id: str, interval_ms: int) -> None:
    """Run one cell to the end: done (rows recorded), skipped (with its reason), or an exception that
    the lane records as this cell's failure."""
    kind = kinds.get(cell.payload)
    led = s.ledger
    cx = CellContext(s, cell)
    if kind.where(cell.params) == HOST:
        attempt, _ = led.begin_cell(cell.cell_id, run_id)
        base = led.artifacts_dir / cell.cell_id / f"attempt-{attempt}"
        base.mkdir(parents=True, exist_ok=True)
        result = kind.on_host(cx, cell)
        (base / "host.json").write_text(json.dumps(result, default=str))
        ctx = base_context(s, cell, run_id)
        if cx.qf is None and cell.model != "-":
            cx.quant_file()
        if cx.qf is not None:
            ctx.update(model_context(s.host, cell.model, cx.qf))
        artifacts.write_meta(base, {"payload": cell.payload, "params": cell.params, "facts": s.facts, "runs": [],
                                    "data": ["host"], "telemetry": False, "context": ctx,
                                    "recorded_at": _now()})
        rows, _ = artifacts.derive(base)
        led.finish_cell(cell.cell_id, rows)
        return
    try:
        prep = kind.prepare(cx, cell)
    except SkipCell as e:
        led.begin_cell(cell.cell_id, run_id)
        led.skip_cell(cell.cell_id, str(e))
        return
    attempt, prev = led.begin_cell(cell.cell_id, run_id)
    if prev:                                        # a previous attempt was cut off: stop what it left running
        for pids in read_pids(s.t, prev).values():
            for pid in pids:
                s.t.run(["kill", pid])
    t = s.t
    base_remote = posixpath.join(t.workdir(), "cells", cell.cell_id, f"attempt-{attempt}")
    base = led.artifacts_dir / cell.cell_id / f"attempt-{attempt}"
    led.set_artifacts(cell.cell_id, base_remote)
    served = kind.where(cell.params) == SERVED
    data: list[str] = []
    prov: dict = dict(prep.provenance)
    prior = led.device_fact(s.name, "battery-calibration")
    with ExitStack() as conds:
        env = {**s.device.env, **prep.env}
        if "nvidia-smi" in s.snap_tools:      # the GPUs' own telemetry beside the payload
            env["DEVICELAB_NVIDIA_SMI"] = "1"
        pending = lambda on: led.set_device_fact(s.name, "battery-unplugged", on)   # noqa: E731
        try:
            for c in ([Quota(t, s.kit, cell.cell_id, float(prep.quota), s.name)] if prep.quota else []) + \
                    [Contention(prep.contention), Powermetrics(s.powermetrics)]:
                conds.enter_context(c)
                env.update(c.env)
                prov.update({k: v for k, v in c.provenance.items() if k not in prov})
        except SkipCell as e:
            led.skip_cell(cell.cell_id, str(e))
            return
        cooldown = s.cooldown()
        conds.enter_context(Charging(t, s.snap_tools, pending))
        base.mkdir(parents=True, exist_ok=True)
        snap_start = snapshots.take(t, s.snap_tools, "start", base)
        if snap_start.get("dumpsys-power", {}).get("screen_on"):
            s.warn("its screen is on: turn it off for measurements (the display draws power and heats the "
                   "phone); its state is recorded with every cell", key="screen")
        cpu = s.host.cpu
        t0 = time.time()
        own = f"{s.name} measuring" if s.measures_on_host else f"{s.name} cell"
        reruns: list[str] = []
        with (cpu.measure(own) if s.measures_on_host else cpu.activity(own)):
            for name, argv in prep.runs:
                remote_out = base_remote if name == "main" else posixpath.join(base_remote, name)
                local_out = artifacts.run_dir(base, name)
                runner = ["sh", f"{s.kit}/run_payload.sh", remote_out, str(interval_ms),
                          s.device.telemetry_root, "--", *s.device.exec_prefix, *argv]
                s.current_remote = remote_out
                try:
                    if served and name == "main":
                        result = _serve_and_drive(s, kind, cx, cell, runner, env, remote_out, local_out, argv)
                        (base / "served.json").write_text(json.dumps(result, default=str))
                        data.append("served")
                    else:
                        for attempt in range(1 + LOST_TAIL_RERUNS):
                            res = t.run(runner, timeout=6 * 3600, env=env or None)
                            _pull(s, res, runner, env, remote_out, local_out, cell, argv[0])
                            if kind.complete(name, artifacts.read_run(base, name)):
                                break
                            reruns.append(name)
                            s.ev.stage(f"{cell.label()}: {posixpath.basename(argv[0])} exited 0 but its last "
                                       "lines were lost (llama.cpp issue 22142): running it again")
                finally:
                    s.current_remote = None
        t1 = time.time()
        snapshots.take(t, s.snap_tools, "end", base)
    ctx = base_context(s, cell, run_id)
    ctx.update(prov)
    ctx["host_activity"] = cpu.during(t0, t1, exclude=own) or None
    if cx.qf is not None:
        ctx.update(model_context(s.host, cell.model, cx.qf))
    artifacts.write_meta(base, {"payload": cell.payload, "params": cell.params, "facts": s.facts,
                                "runs": [n for n, _ in prep.runs], "data": data, "telemetry": True,
                                "context": ctx, "cooldown": artifacts.row_dict(cooldown), "baseline": s.baseline,
                                "prior_calibration": prior, "recorded_at": _now(),
                                "reruns_lost_tail": reruns})
    rows, calibration = artifacts.derive(base)
    (base / "calibration.json").write_text(json.dumps(calibration, default=str))
    led.finish_cell(cell.cell_id, rows)
    if calibration.get("method") in {n for n, _ in normalize.COUNTERS}:
        # the battery's counter moved during this cell: the device's calibration from now on, for cells
        # too short for its counter to move
        led.set_device_fact(s.name, "battery-calibration", {**calibration, "cell": cell.cell_id})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _pull(s: DeviceSession, res: CommandResult, runner, env, remote_out, local_out, cell, tool) -> None:
    local_out.mkdir(parents=True, exist_ok=True)
    (local_out / "argv.json").write_text(json.dumps({"argv": runner, "env": env}))
    s.t.get_many(remote_out, PULLED, local_out)
    err = local_out / "stderr.txt"
    stderr = err.read_text(errors="replace") if err.exists() else res.stderr
    if res.rc != 0:
        if not (local_out / "exit_code").exists():
            raise RetryableError(f"{cell.label()}: the payload runner did not finish ({res.stderr.strip()[:200]})")
        raise DevicelabError(f"{cell.label()}: {posixpath.basename(tool)} exited {res.rc}: {tail(stderr, 3)[:300]}")


def _device_clock(s: DeviceSession) -> float | None:
    """The sampler's clock (device uptime) now, to place host-side events in its trace."""
    r = s.t.run(["cat", "/proc/uptime"], timeout=30)
    try:
        return float(r.stdout.split()[0])
    except (ValueError, IndexError):
        return None


def _payload_pid(s: DeviceSession, remote_out: str) -> str | None:
    for _ in range(50):                  # the runner writes its pids file right after starting
        pid = read_pids(s.t, remote_out).get("payload")
        if pid:
            return pid[0]
        time.sleep(0.1)
    return None


def _serve_and_drive(s: DeviceSession, kind, cx, cell, runner, env, remote_out, local_out, argv) -> dict:
    """The server on the device under the sampler (a host thread waits on it), the kind's driver on the host
    through a forwarded port, then the server is stopped and its artifacts pulled like any payload's."""
    t = s.t
    port = int(argv[argv.index("--port") + 1])
    box: dict = {}

    def serve():
        try:
            box["res"] = t.run(runner, timeout=6 * 3600, env=env or None)
        except BaseException as e:  # noqa: BLE001 - re-raised on the lane's thread
            box["err"] = e

    th = threading.Thread(target=serve, daemon=True, name=f"server {cell.cell_id}")
    th.start()
    marks: dict = {}
    result: dict = {}
    failure: BaseException | None = None
    try:
        with t.forward(port) as lp:
            url = f"http://127.0.0.1:{lp}"
            _wait_ready(s, url, th, remote_out, cell, posixpath.basename(argv[0]))
            marks["ready"] = _device_clock(s)
            result = kind.drive(cx, cell, url)
            marks["done"] = _device_clock(s)
    except (DevicelabError, OSError) as e:
        failure = e
    finally:
        try:
            pid = _payload_pid(s, remote_out)
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
        raise RetryableError(f"{cell.label()}: the forwarded port to the server failed: {failure}") from failure
    if failure is not None:
        raise failure
    res = box.get("res") or CommandResult(runner, 124, "", "the server did not stop")
    if res.rc in (130, 143):             # stopped by us (SIGINT/SIGTERM): the payload's normal end here
        res = CommandResult(res.argv, 0, res.stdout, res.stderr)
    _pull(s, res, runner, env, remote_out, local_out, cell, argv[0])
    return {**result, "marks": marks}


def _wait_ready(s: DeviceSession, url: str, th: threading.Thread, remote_out: str, cell, server: str,
                timeout: float = 900) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not th.is_alive():
            err = s.t.read_text(posixpath.join(remote_out, "stderr.txt")) or ""
            last = " | ".join(ln.strip() for ln in tail(err, 3).splitlines() if ln.strip())
            raise DevicelabError(f"{cell.label()}: {server} exited before it was ready: {last[:300]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.5)
    raise RetryableError(f"{cell.label()}: {server} was not ready after {timeout:.0f}s")
