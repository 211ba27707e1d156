"""Task evals, three routes, each recorded in its rows' `eval_route`:
- 'device-mc': llama-perplexity --hellaswag/--winogrande/--multiple-choice on the device with a data
  file in llama.cpp's format (`task`, `data`, `tasks`);
- 'server-generate': lm-eval generation tasks against llama-server on the device through a forwarded
  port, `slots` parallel slots (`include`, `lm_tasks`, `limit`, `chat`);
- 'host-loglikelihood': lm-eval log-likelihood tasks in-process on the host through llama-cpp-python
  on the same GGUF file (`include`, `lm_tasks`, `limit`).
Multiple-choice scored through llama-server is refused when the recipe loads: its completions return no
prompt logprobs, so lm-eval would score those tasks at chance."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from .. import paths
from ..errors import DevicelabError
from ..recipe_paths import resolve_include, resolve_text
from ..schema import Row, missing
from ..telemetry.normalize import Phase
from .base import (
    DATA,
    DEVICE,
    HOST,
    SERVED,
    TEXT,
    TREE,
    Artifacts,
    CellParams,
    Kind,
    Parsed,
    Prepared,
    Spec,
    host_op,
    log_safe_threads,
    plain,
    register,
)

ROUTES = {"device-mc": DEVICE, "server-generate": SERVED, "host-loglikelihood": HOST}
FLAGS = {
    "hellaswag": ("--hellaswag", "--hellaswag-tasks"),
    "winogrande": ("--winogrande", "--winogrande-tasks"),
    "multiple-choice": ("--multiple-choice", "--multiple-choice-tasks"),
}


class _EvalFields(BaseModel):
    """What an eval spec and each of its cells hold alike (a cell keeps only its route's fields: the others take
    their defaults)."""

    route: Literal["device-mc", "server-generate", "host-loglikelihood"] = "device-mc"
    task: Literal["hellaswag", "winogrande", "multiple-choice"] = "hellaswag"
    data: str | None = None
    tasks: int = Field(default=0, ge=0)  # 0 = all
    ctx: int = Field(default=512, ge=64)
    threads: int | None = Field(default=None, ge=1)
    include: str | None = None  # folder of lm-eval task YAMLs (relative to the recipe)
    lm_tasks: list[str] = []
    limit: int | None = Field(default=None, ge=1)  # lm-eval --limit: first N documents per task
    slots: int = Field(default=1, ge=1, le=64)  # llama-server --parallel = lm-eval num_concurrent
    chat: bool = False  # local-chat-completions (the model's chat template)
    n_gpu_layers: int | None = Field(default=None, ge=0)  # device routes: llama.cpp -ngl (99 = all)


class EvalCell(CellParams, _EvalFields):
    """One eval cell."""


class EvalSpec(Spec, _EvalFields):
    kind: Literal["eval"]

    @model_validator(mode="after")
    def _route_fields(self) -> "EvalSpec":
        if self.route == "device-mc":
            if not self.data:
                raise ValueError("route device-mc needs `data:` (a task file in llama.cpp's format)")
            if self.lm_tasks or self.include:
                raise ValueError(
                    "`lm_tasks`/`include` are for the lm-eval routes (server-generate, "
                    "host-loglikelihood); route device-mc takes `task` and `data`"
                )
        else:
            if not self.lm_tasks:
                raise ValueError(f"route {self.route} needs `lm_tasks:` (lm-eval task names)")
            if self.data:
                raise ValueError(
                    f"`data` is for route device-mc; route {self.route} reads lm-eval task YAMLs from `include:`"
                )
            if self.route == "host-loglikelihood" and (self.slots != 1 or self.chat):
                raise ValueError("`slots` and `chat` are llama-server settings (route server-generate)")
        return self

    def cell_params(self) -> dict:
        """What identifies a cell of this payload (only its route's fields: adding a field to another
        route never changes the cell ids of a recorded run)."""
        keep: tuple[str, ...]
        if self.route == "device-mc":
            keep = ("route", "task", "data", "tasks", "ctx", "threads")
        elif self.route == "server-generate":
            keep = ("route", "include", "lm_tasks", "limit", "ctx", "threads", "slots", "chat")
        else:
            keep = ("route", "include", "lm_tasks", "limit", "ctx", "threads")
        out = {k: getattr(self, k) for k in keep}
        if self.n_gpu_layers is not None and self.route != "host-loglikelihood":  # set: a new cell
            out["n_gpu_layers"] = self.n_gpu_layers
        return out


def device_mc_argv(tool: str, model: str, data: str, c: EvalCell, threads: int) -> list[str]:
    flag, count = FLAGS[c.task]
    a = [tool, "-m", model, "-f", data, flag, "-c", str(c.ctx), "-t", str(threads), "-b", str(max(512, c.ctx))]
    if c.tasks:
        a += [count, str(c.tasks)]
    if c.n_gpu_layers is not None:
        a += ["-ngl", str(c.n_gpu_layers)]
    return a


_HS = re.compile(r"^(\d+)\t([\d.]+)%\t\[", re.M)
_WG = re.compile(r"Final Winogrande score\((\d+) tasks\): ([\d.]+) \+/- ([\d.]+)")
_MC = re.compile(r"Final result: ([\d.]+) \+/- ([\d.]+)")


def parse_device_mc(text: str, c: EvalCell) -> list[Row]:
    kw: dict[str, Any] = dict(test=f"{c.task}:{Path(c.data or '').name}", phase="eval", ctx=c.ctx)
    if c.task == "hellaswag":
        found = _HS.findall(text)
        if not found:
            return [missing("accuracy", "llama-perplexity printed no hellaswag score", **kw)]
        n, acc = found[-1]
        return [Row(metric="accuracy", value=float(acc) / 100, n=int(n), **kw)]
    rx = _WG if c.task == "winogrande" else _MC
    m = rx.search(text)
    if not m:
        return [missing("accuracy", f"llama-perplexity printed no {c.task} score", **kw)]
    if c.task == "winogrande":
        return [
            Row(
                metric="accuracy",
                value=float(m.group(2)) / 100,
                stddev=float(m.group(3)) / 100,
                n=int(m.group(1)),
                **kw,
            )
        ]
    return [Row(metric="accuracy", value=float(m.group(1)) / 100, stddev=float(m.group(2)) / 100, **kw)]


def prometheus(url: str) -> dict[str, float]:
    """llama-server's /metrics counters (llamacpp:NAME VALUE), by NAME."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return out
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, v = line[len("llamacpp:") :].partition(" ")
            try:
                out[name] = float(v.split()[0])
            except (ValueError, IndexError):
                pass
    return out


def keep(res: dict) -> dict:
    """The part of lm-eval's results dict that rows are made from (JSON-safe, stored with the cell)."""
    return {k: res.get(k) for k in ("results", "configs", "n-samples", "versions")}


# ---- host work: the task files, and log-likelihood scores on the host once per file ----
TASKS, HOST_EVAL = "eval-tasks", "eval-host"


@host_op(TASKS, TREE)
def task_files(host, P: dict):
    """The recipe's folder of lm-eval task YAMLs (None: lm-eval's own tasks only)."""
    c = EvalCell.model_validate(P)
    return resolve_include(c.include, host.recipe_dir) if c.include else None


@host_op(HOST_EVAL, DATA)
def host_eval(host, model: str, quant: str, P: dict) -> dict:
    """lm-eval log-likelihood tasks on the host through llama-cpp-python, once per (file, tasks, task files,
    limit, ctx, engine versions): every device of a recipe shares the file's score."""
    from .. import lmeval

    qf, c = host.quant(model, quant), EvalCell.model_validate(P)
    include = task_files(host, P)
    files = (
        sorted(p for p in include.rglob("*") if p.is_file() and not p.name.endswith(".sha256.json")) if include else []
    )
    versions = lmeval.versions()
    lib = host.eval_library()  # the host build's libllama.so (None: llama-cpp-python's own), before the key
    versions["library_sha256"] = lib.sha256 if lib is not None else None
    tasks_digest = [(str(p.relative_to(include)), hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]
    key = hashlib.sha256(
        json.dumps([qf.sha256, tasks_digest, c.lm_tasks, c.limit, c.ctx, versions]).encode()
    ).hexdigest()[:16]
    out = paths.sub("evals") / f"{model}-{quant}-host-{key}.json"
    if out.exists():
        return json.loads(out.read_text())
    host.ev.stage(f"lm-eval {', '.join(c.lm_tasks)} on the host (llama-cpp-python) for {model} {quant}")
    t0 = time.time()
    with host.cpu.work(f"lm-eval {model} {quant} (host)"):
        # one core left free: llama.cpp's OpenMP threads spin at barriers, and one thread per core
        # with anything else running slows scoring ~30× (this 2-core VM: 0.24 s vs 7.8 s a request)
        lm = lmeval.host_lm(qf.path, c.ctx, c.threads or max(1, (os.cpu_count() or 2) - 1), lib)
        res = lmeval.evaluate("host-loglikelihood", lm, c.lm_tasks, include, c.limit)
    kept = keep(res)
    kept["provenance"] = {**lm.provenance, **versions, "seconds": time.time() - t0}
    text = json.dumps(kept, default=str)
    tmp = paths.temp_for(out)
    tmp.write_text(text)
    tmp.replace(out)
    return json.loads(text)  # the same shape as a cached result


@register
class Eval(Kind[EvalCell]):
    name = "eval"
    key_properties = (*Kind.key_properties, "eval_route", "ctx")
    shape_properties = (*Kind.shape_properties, "eval_route", "ctx")
    spec = EvalSpec
    cell = EvalCell

    def where(self, params):
        return ROUTES[self.typed(params).route]

    def tools(self, params):
        return {"device-mc": ("llama-perplexity",), "server-generate": ("llama-server",)}.get(
            self.typed(params).route, ()
        )

    def variants(self, spec):
        return [spec.cell_params()]

    def label(self, params):
        return self.typed(params).route

    def provenance(self, params):
        route = self.typed(params).route
        engine = {"device-mc": "llama-perplexity", "server-generate": "llama-server + lm-eval"}.get(route)
        return {"eval_route": route, "eval_engine": engine}

    def check(self, spec, recipe_dir):
        """Refuse, before anything runs, a missing data file or an lm-eval task on a route that cannot
        score it honestly."""
        from .. import lmeval

        if spec.route == "device-mc":
            if not spec.data.startswith("llama.cpp:"):
                resolve_text(spec.data, None, recipe_dir, what="eval data")
            return
        types: dict = {}
        if spec.include:
            inc = resolve_include(spec.include, recipe_dir)
            if not inc.is_dir():
                raise DevicelabError(
                    f"include: {inc} is not a folder; give the folder of the lm-eval task YAMLs, relative to the recipe"
                )
            types = lmeval.declared_output_types(inc)
        if any(t not in types for t in spec.lm_tasks):  # lm-eval's own tasks (hellaswag, gsm8k, …)
            types.update(lmeval.builtin_output_types(t for t in spec.lm_tasks if t not in types))
        lmeval.check_tasks(spec.route, spec.lm_tasks, types)

    def prepare(self, cx, cell):
        c = self.typed(cell.params)
        threads = c.threads or cx.facts.get("cpu_count") or 1
        if c.route == "device-mc":
            threads = c.threads or log_safe_threads(cx.facts)  # its score is in its log lines
            data = cx.host_op(TEXT, c.data, "eval data")
            return Prepared(
                [("main", device_mc_argv(cx.tool("llama-perplexity"), cx.model(), cx.push(data), c, threads))]
            )
        slots = c.slots
        port = random.randint(20000, 45000)  # on the device's loopback only
        return Prepared(
            [
                (
                    "main",
                    [
                        cx.tool("llama-server"),
                        "-m",
                        cx.model(),
                        "-c",
                        str(c.ctx * slots),
                        "-np",
                        str(slots),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "-t",
                        str(threads),
                        "--metrics",
                        "--no-webui",
                    ]
                    + (["-ngl", str(c.n_gpu_layers)] if c.n_gpu_layers is not None else []),
                )
            ]
        )

    def drive(self, cx, cell, url):
        from .. import lmeval

        c = self.typed(cell.params)
        client = lmeval.server_client(url, c.chat, c.slots, cell.model)
        res = lmeval.evaluate("server-generate", client, c.lm_tasks, cx.host_op(TASKS, cell.params), c.limit)
        return {"result": keep(res), "counters": prometheus(url + "/metrics")}

    def on_host(self, cx, cell):
        return cx.host_op(HOST_EVAL, cell.model, cell.quant, cell.params)

    def complete(self, run, out):
        """device-mc's score is in llama-perplexity's log, whose tail can be lost at exit (upstream 22142): a
        hellaswag run cut short would read as the running accuracy of its first tasks. Complete: as many task
        lines as it said it selected (hellaswag), or its final score line (winogrande, multiple choice)."""
        argv = " ".join(map(str, out.argv))
        if run != "main" or "llama-perplexity" not in argv:
            return True
        text = out.stdout + "\n" + out.stderr
        if "--hellaswag" in argv:
            n = re.search(r"selecting (\d+) (?:randomized )?tasks", text)
            done = [int(i) for i, _ in _HS.findall("\n".join(ln.split("\t", 1)[-1] for ln in text.splitlines()))]
            return not n or (bool(done) and max(done) >= int(n.group(1)))
        return bool(_WG.search(text) or _MC.search(text))

    def parse(self, a: Artifacts) -> Parsed:
        from .. import lmeval

        c = self.typed(a.params)
        route = c.route
        if route == "device-mc":
            return Parsed(parse_device_mc(plain(a.main.stdout) + "\n" + a.main.stderr, c))
        if route == "host-loglikelihood":
            res = a.data["host"]
            prov = res["provenance"]
            rows = lmeval.rows(res, route)
            rows.append(Row(metric="wall_seconds", value=prov["seconds"], phase="cell", test="lm-eval on the host"))
            ctx = {  # the host build whose library llama-cpp-python called (older results: its own library)
                "target": "host (llama-cpp-python)",
                "build_commit": prov.get("eval_library_build_commit") or prov["eval_engine"],
                "build_flags": {"system_info": prov.get("eval_engine_system_info")},
                "build_key": prov.get("eval_library_build_key"),
                "eval_engine": f"{prov['eval_engine']} + lm-eval {prov.get('lm_eval')}",
            }
            return Parsed(rows, context=ctx)
        served = a.data["served"]
        rows = lmeval.rows(served["result"], route)
        counters, marks = served.get("counters") or {}, served.get("marks") or {}
        gen, prompt = counters.get("tokens_predicted_total"), counters.get("prompt_tokens_total")
        for metric, v in (("tokens_generated", gen), ("tokens_prompt", prompt)):
            if v is not None:
                rows.append(Row(metric=metric, value=v, phase="eval", n_parallel=c.slots))
        phases = []
        ready, done, win = marks.get("ready"), marks.get("done"), a.main.window
        if win and ready is not None and done is not None and done > ready:
            phases.append(Phase("load", "load", win[0], ready))
            phases.append(Phase("lm-eval", "eval", ready, done, int(gen or 0)))
            if gen:
                rows.append(
                    Row(
                        metric="eval_gen_tps",
                        value=gen / (done - ready),
                        phase="eval",
                        n_parallel=c.slots,
                        test="generated tokens / lm-eval wall time",
                    )
                )
        return Parsed(rows, phases)
