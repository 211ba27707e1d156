"""One cell, kind-agnostic, in three steps over a small state object (`CellRun`): prepare (the kind's command
lines, the cell's folders) → execute (its conditions, the cooldown, snapshots, the payloads under the sampler,
their outputs pulled) → record (rows derived from the stored artifacts by the kind's pure parser)."""

from __future__ import annotations

import json
import posixpath
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import facts as factsmod
from .. import kinds
from .. import lab as labmod
from ..errors import DevicelabError, NotMeasurable, RetryableError
from ..kinds.base import HOST, SERVED, Kind, Prepared, SkipCell
from ..models.gguf_info import ModelInfo
from ..proc import tail
from ..schema import Row
from ..telemetry import snapshots, sources
from ..transports.base import CommandResult
from ..transports.commands import PayloadRun
from . import artifacts
from .conditions import Contention, Quota
from .session import DeviceSession, read_pids

if TYPE_CHECKING:  # pragma: no cover
    from ..build import AnyBuild
    from ..plan import Cell

# what run_payload.sh leaves in a cell's device folder, with the files telemetry sources write beside the payload
PULLED = ("stdout.tsv", "stderr.txt", "telemetry.csv", "clock", "pids", "exit_code", *sources.pulled())

CALIBRATION = "battery-calibration"  # the ledger's device fact: the energy calibration of an earlier cell


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

    @property
    def build(self) -> AnyBuild:
        """The device's build (its manifest says the target a payload is built for)."""
        return self.s.build

    def push(self, path, mode: str | None = None, name: str | None = None) -> str:
        return self.s.push(path, mode=mode, name=name)

    def host_op(self, name: str, *args):
        """A kind's host operation (kinds/base.py), made once per (name, args) by the run's host work."""
        return self.host.op(name, *args)

    def quant_file(self):
        if self.qf is None:
            self.qf = self.host.quant(self.cell.model, self.cell.quant)
        return self.qf

    def model(self) -> str:
        qf = self.quant_file()
        return self.s.push(qf.path, qf.sha256, name=qf.path.name)


def model_context(host, model: str, qf) -> dict:
    info = qf.info
    kv_per_tok = None
    try:
        mi = ModelInfo(**{k: info[k] for k in ModelInfo.__dataclass_fields__ if k in info})
        kv_per_tok = mi.kv_cache_bytes(1)
    except (DevicelabError, KeyError, TypeError):
        pass
    return {
        "model_sha256": qf.sha256,
        "model_bytes": qf.manifest["bytes"],
        "bpw": qf.manifest["bpw"],
        "n_params": info.get("n_params"),
        "n_params_blocks": info.get("n_params_blocks"),
        "model_blocks_bytes": info.get("blocks_bytes"),
        "n_layer": info.get("n_layer"),
        "n_vocab": info.get("n_vocab"),
        "kv_bytes_per_token": kv_per_tok,
        "n_swa": info.get("n_swa"),
        "swa_layers": info.get("swa_layers") or None,
        "tensor_types": qf.manifest["tensor_types"],
        "tensor_type_bytes": info.get("tensor_type_bytes"),
        "blocks_type_params": info.get("blocks_type_params"),
        "n_rows_blocks": info.get("n_rows_blocks"),
        "base_note": host.base(model).manifest.get("note"),
        "model_source": host.model_source(model).provenance,
        "imatrix": qf.manifest.get("imatrix_from"),
    }


def base_context(s: DeviceSession, cell, run_id: str) -> dict:
    on_host = kinds.get(cell.payload).where(cell.params) == HOST  # this host's llama.cpp, not the device's
    backend = cell.params.get("backend")
    b = s.build if on_host else s.build_for(backend)
    c = s.conditions
    return {
        "run_id": run_id,
        "cell_id": cell.cell_id,
        "recipe": cell.recipe,
        "device": cell.device,
        "target": b.manifest["target"],
        "model": cell.model,
        "quant": cell.quant,
        "payload": cell.payload,
        "build_commit": b.manifest["commit"],
        "build_flags": b.manifest["flags"],
        "build_key": b.key,
        "device_facts": factsmod.summary(s.facts),
        "lab_host": labmod.this_host(),
        "backend": backend or s.builds.default_backend,
        "gpu_device": next((d for _, d in s.builds.gpu_devices.get(backend, [])), None),
        "device_mem_bytes": s.device.ram_budget_bytes or s.facts.get("mem_total_bytes"),
        "ram_budget_bytes": c.budget.bytes,
        "ram_budget_source": c.budget.line(),
        "battery_wh": c.battery_wh,
        "battery_source": c.battery_source,
        "round": cell.round,
        "round_position": cell.position,
        "round_seed": cell.seed,
        **c.provenance,
        **kinds.get(cell.payload).provenance(cell.params),
    }


# a run whose output lost its last lines (llama.cpp's logger is not flushed at exit: upstream issue 22142) is run
# again this many times at most; the runs are kept in cell.json
LOST_TAIL_RERUNS = 4


@dataclass
class CellRun:
    """One cell's run, as its steps fill it in."""

    s: DeviceSession
    cell: Cell
    run_id: str
    interval_ms: int
    kind: Kind = field(init=False)
    cx: CellContext = field(init=False)
    prep: Prepared = field(init=False)  # what the kind prepared (_prepare)
    attempt: int = 0  # the cell's attempt number: its artifacts' folder
    base: Path = field(init=False)  # the attempt's artifacts here (_prepare) …
    remote: str = ""  # … and on the device
    env: dict = field(default_factory=dict)  # run_payload.sh's environment
    provenance: dict = field(default_factory=dict)  # row columns: what prepare and the conditions resolved
    data: list[str] = field(default_factory=list)  # the JSON documents the run produced (served)
    reruns: list[str] = field(default_factory=list)  # runs repeated for a lost tail
    prior: dict | None = None  # the device's energy calibration before this cell
    cooldown: Row = field(init=False)  # the wait before it measured (_execute)
    own: str = ""  # this cell in the host's CPU activity …
    host_window: tuple[float, float] = (0.0, 0.0)  # … and when it measured, host clock
    host_busy: float | None = None  # CPUs other processes kept busy while it measured on this host's CPUs

    def __post_init__(self):
        self.kind = kinds.get(self.cell.payload)
        self.cx = CellContext(self.s, self.cell)


@dataclass
class Payload:
    """One of a cell's command lines, run through run_payload.sh."""

    name: str  # 'main' or the kind's name for a further run
    argv: list[str]
    runner: PayloadRun  # the device's command: argv under run_payload.sh
    remote: str  # its outputs on the device …
    local: Path  # … and here


def run_cell(s: DeviceSession, cell, run_id: str, interval_ms: int) -> None:
    """Run one cell to the end: done (rows recorded), skipped (with its reason), or an exception that
    the lane records as this cell's failure."""
    r = CellRun(s, cell, run_id, interval_ms)
    if r.kind.where(cell.params) == HOST:
        _run_on_host(r)
    elif _prepare(r) and _measured(r):
        _record(r)


def _measured(r: CellRun) -> bool:
    """_execute, with the device's own verdict that the cell cannot be measured there (killed for memory) recorded
    as the cell's result: skipped with that reason, not retried."""
    try:
        return _execute(r)
    except NotMeasurable as e:
        r.s.ledger.skip_cell(r.cell.cell_id, str(e))
        return False


def _run_on_host(r: CellRun) -> None:
    """A host cell: the kind's whole cell on this host, its result recorded like a device cell's artifacts."""
    s, cell, led = r.s, r.cell, r.s.ledger
    r.attempt, _ = led.begin_cell(cell.cell_id, r.run_id)
    base = led.artifacts_dir / cell.cell_id / f"attempt-{r.attempt}"
    base.mkdir(parents=True, exist_ok=True)
    result = r.kind.on_host(r.cx, cell)
    (base / "host.json").write_text(json.dumps(result, default=str))
    ctx = base_context(s, cell, r.run_id)
    if r.cx.qf is None and cell.model != "-":
        r.cx.quant_file()
    if r.cx.qf is not None:
        ctx.update(model_context(s.host, cell.model, r.cx.qf))
    artifacts.write_meta(
        base,
        {
            "payload": cell.payload,
            "params": cell.params,
            "facts": s.facts,
            "runs": [],
            "data": ["host"],
            "telemetry": False,
            "context": ctx,
            "recorded_at": _now(),
        },
    )
    rows, _ = artifacts.derive(base)
    led.finish_cell(cell.cell_id, rows)


# ---------------------------------------------------------------- prepare
def _prepare(r: CellRun) -> bool:
    """The kind's command lines and the attempt's folders; False when the kind skips the cell."""
    s, cell, led = r.s, r.cell, r.s.ledger
    try:
        r.prep = r.kind.prepare(r.cx, cell)
    except SkipCell as e:
        led.begin_cell(cell.cell_id, r.run_id)
        led.skip_cell(cell.cell_id, str(e))
        return False
    r.attempt, prev = led.begin_cell(cell.cell_id, r.run_id)
    if prev:  # a previous attempt was cut off: stop what it left running
        s.link.stop(prev)
    r.remote = posixpath.join(s.t.workdir(), "cells", cell.cell_id, f"attempt-{r.attempt}")
    r.base = led.artifacts_dir / cell.cell_id / f"attempt-{r.attempt}"
    led.set_artifacts(cell.cell_id, r.remote)
    r.provenance = dict(r.prep.provenance)
    r.prior = led.device_fact(s.name, CALIBRATION)
    return True


# ---------------------------------------------------------------- execute
def _execute(r: CellRun) -> bool:
    """Under the cell's conditions, after the cooldown: snapshots, the payloads under the sampler, snapshots.
    False when a condition cannot be had (the cell is skipped, saying why)."""
    s = r.s
    found = s.conditions.sources
    assert found is not None, "the session opened its telemetry sources"
    with ExitStack() as conds:
        r.env = {**s.device.env, **r.prep.env, **found.env(), "DEVICELAB_CURRENT": s.link.current_file}
        try:
            _enter_conditions(r, conds)
        except SkipCell as e:
            s.ledger.skip_cell(r.cell.cell_id, str(e))
            return False
        r.cooldown = s.conditions.cooldown()
        for around in found.around():  # the sources' own, entered after the cooldown
            conds.enter_context(around)
        r.base.mkdir(parents=True, exist_ok=True)
        found.check(snapshots.take(s.t, found.tools, "start", r.base))
        _measure(r)
        snapshots.take(s.t, found.tools, "end", r.base)
    return True


def _enter_conditions(r: CellRun, conds: ExitStack) -> None:
    s, prep = r.s, r.prep
    quota = [Quota(s.t, s.link.kit, r.cell.cell_id, float(prep.quota), s.name)] if prep.quota else []
    for c in [*quota, Contention(prep.contention)]:
        conds.enter_context(c)
        r.env.update(c.env)
        r.provenance.update({k: v for k, v in c.provenance.items() if k not in r.provenance})


def _measure(r: CellRun) -> None:
    """The cell's command lines, in order, while this host's CPUs are the measurement's (or noted as busy)."""
    s = r.s
    cpu = s.host.cpu
    t0 = time.time()
    r.own = f"{s.name} measuring" if s.measures_on_host else f"{s.name} cell"
    with cpu.measure(r.own) if s.measures_on_host else cpu.activity(r.own) as m:
        for name, argv in r.prep.runs:
            remote = r.remote if name == "main" else posixpath.join(r.remote, name)
            runner = PayloadRun(
                s.link.kit,
                remote,
                r.interval_ms,
                s.device.telemetry_root,
                argv[0],
                tuple(argv[1:]),
                tuple(s.device.exec_prefix),
            )
            _run_payload(r, Payload(name, argv, runner, remote, artifacts.run_dir(r.base, name)))
    r.host_window = (t0, time.time())
    r.host_busy = getattr(m, "others_cpus", None)


def _run_payload(r: CellRun, p: Payload) -> None:
    s = r.s
    s.current_remote = p.remote
    try:
        # Ctrl-C before it started: interrupt() sets `interrupted` before it looks for a payload to stop, so one it
        # found none for is seen here, and is not started
        if s.interrupted:
            raise RetryableError(f"{r.cell.label()}: interrupted by the user")
        if r.kind.where(r.cell.params) == SERVED and p.name == "main":
            result = _serve_and_drive(r, p)
            (r.base / "served.json").write_text(json.dumps(result, default=str))
            r.data.append("served")
        else:
            _run_to_the_end(r, p)
    finally:
        s.current_remote = None
    if s.interrupted:  # Ctrl-C while it ran (even if its payload ended before it could be stopped): cut, not done
        raise RetryableError(f"{r.cell.label()}: interrupted by the user")


def _run_to_the_end(r: CellRun, p: Payload) -> None:
    """Run it, and again (LOST_TAIL_RERUNS times at most) while its output lost its last lines."""
    for _try in range(1 + LOST_TAIL_RERUNS):
        res = r.s.t.execute(p.runner, timeout=6 * 3600, env=r.env or None)
        _pull(r, p, res)
        if r.kind.complete(p.name, artifacts.read_run(r.base, p.name)):
            break
        r.reruns.append(p.name)
        r.s.ev.stage(
            f"{r.cell.label()}: {posixpath.basename(p.argv[0])} exited 0 but its last "
            "lines were lost (llama.cpp issue 22142): running it again"
        )


def _pull(r: CellRun, p: Payload, res: CommandResult) -> None:
    p.local.mkdir(parents=True, exist_ok=True)
    (p.local / "argv.json").write_text(json.dumps({"argv": p.runner.argv(), "env": r.env}))
    r.s.t.get_many(p.remote, PULLED, p.local)
    err = p.local / "stderr.txt"
    stderr = err.read_text(errors="replace") if err.exists() else res.stderr
    if res.rc != 0:
        label = r.cell.label()
        if not (p.local / "exit_code").exists():
            raise RetryableError(f"{label}: the payload runner did not finish ({res.stderr.strip()[:200]})")
        raise DevicelabError(f"{label}: {posixpath.basename(p.argv[0])} exited {res.rc}: {tail(stderr, 3)[:300]}")


# ---------------------------------------------------------------- record
def _record(r: CellRun) -> None:
    """The cell's provenance and artifacts' description (cell.json), its rows derived from them, into the
    ledger; the device's energy calibration when this cell could make one."""
    s, cell, led = r.s, r.cell, r.s.ledger
    ctx = base_context(s, cell, r.run_id)
    ctx.update(r.provenance)
    ctx["host_activity"] = s.host.cpu.during(*r.host_window, exclude=r.own) or None
    ctx["host_busy_cpus"] = r.host_busy
    if r.cx.qf is not None:
        ctx.update(model_context(s.host, cell.model, r.cx.qf))
    artifacts.write_meta(
        r.base,
        {
            "payload": cell.payload,
            "params": cell.params,
            "facts": s.facts,
            "runs": [n for n, _ in r.prep.runs],
            "data": r.data,
            "telemetry": True,
            "context": ctx,
            "cooldown": artifacts.row_dict(r.cooldown),
            "baseline": s.conditions.baseline,
            "prior_calibration": r.prior,
            "recorded_at": _now(),
            "reruns_lost_tail": r.reruns,
        },
    )
    rows, calibration = artifacts.derive(r.base)
    (r.base / "calibration.json").write_text(json.dumps(calibration, default=str))
    led.finish_cell(cell.cell_id, rows)
    if sources.keeps_calibration(calibration):
        # the battery's counter moved during this cell: the device's calibration from now on, for cells
        # too short for its counter to move
        led.set_device_fact(s.name, CALIBRATION, {**calibration, "cell": cell.cell_id})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- a served cell
def _device_clock(s: DeviceSession) -> float | None:
    """The sampler's clock (device uptime) now, to place host-side events in its trace."""
    text = s.t.read_text("/proc/uptime")
    try:
        return float((text or "").split()[0])
    except (ValueError, IndexError):
        return None


def _payload_pid(s: DeviceSession, remote_out: str, th: threading.Thread) -> str | None:
    """The server's pid from the runner's pids file, which it writes right after starting: read until it is there,
    for 5 s at most, and once more after the runner has ended (`th`, the host thread waiting on it) — a runner
    that ended without writing it never will (a server that could not be launched), and on a device each read is
    a round trip (on an iPhone, a whole devicectl copy)."""
    for _ in range(50):
        ended = not th.is_alive()
        pid = read_pids(s.t, remote_out).get("payload")
        if pid:
            return pid[0]
        if ended:
            return None
        th.join(0.1)
    return None


def _serve_and_drive(r: CellRun, p: Payload) -> dict:
    """The server on the device under the sampler (a host thread waits on it), the kind's driver on the host
    through a forwarded port, then the server is stopped and its artifacts pulled like any payload's."""
    s, t = r.s, r.s.t
    port = int(p.argv[p.argv.index("--port") + 1])
    box: dict = {}

    def serve():
        try:
            box["res"] = t.execute(p.runner, timeout=6 * 3600, env=r.env or None)
        except BaseException as e:  # re-raised on the lane's thread
            box["err"] = e

    th = threading.Thread(target=serve, daemon=True, name=f"server {r.cell.cell_id}")
    th.start()
    marks: dict = {}
    result: dict = {}
    failure: BaseException | None = None
    try:
        with t.forward(port) as lp:
            url = f"http://127.0.0.1:{lp}"
            _wait_ready(r, p, url, th)
            marks["ready"] = _device_clock(s)
            result = r.kind.drive(r.cx, r.cell, url)
            marks["done"] = _device_clock(s)
    except (DevicelabError, OSError) as e:
        failure = e
    finally:
        _stop_server(s, p, th)
    if "err" in box:  # the device side failed (a lost phone/board is retryable)
        raise box["err"] from failure
    if isinstance(failure, OSError):
        raise RetryableError(f"{r.cell.label()}: the forwarded port to the server failed: {failure}") from failure
    if failure is not None:
        raise failure
    res = box.get("res") or CommandResult(p.runner.argv(), 124, "", "the server did not stop")
    if res.rc in (130, 143):  # stopped by us (SIGINT/SIGTERM): the payload's normal end here
        res = CommandResult(res.argv, 0, res.stdout, res.stderr)
    _pull(r, p, res)
    return {**result, "marks": marks}


def _stop_server(s: DeviceSession, p: Payload, th: threading.Thread) -> None:
    try:
        pid = _payload_pid(s, p.remote, th)
        if pid:
            s.t.kill(pid)
            th.join(60)
            if th.is_alive():
                s.t.kill(pid, force=True)
    except (DevicelabError, OSError):
        pass  # the device is gone: its thread says so
    th.join(120)


def _wait_ready(r: CellRun, p: Payload, url: str, th: threading.Thread, timeout: float = 900) -> None:
    server = posixpath.basename(p.argv[0])
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not th.is_alive():
            err = r.s.t.read_text(posixpath.join(p.remote, "stderr.txt")) or ""
            last = " | ".join(ln.strip() for ln in tail(err, 3).splitlines() if ln.strip())
            raise DevicelabError(f"{r.cell.label()}: {server} exited before it was ready: {last[:300]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        th.join(0.1 if time.time() - t0 < 10 else 0.5)  # a small model is ready in a second or two
    raise RetryableError(f"{r.cell.label()}: {server} was not ready after {timeout:.0f}s")
