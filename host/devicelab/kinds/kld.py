"""llama-perplexity KL divergence of a quant against the base's logits, made once on the host; with
`host_check`, also against the host's logits of the same file (a backend bug or a silent fallback on the
device shows up as device-vs-host KLD > 0)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from .. import paths
from ..build import backends
from ..errors import DevicelabError
from ..hashing import sha256_file
from ..proc import run_logged
from ..recipe_paths import resolve_text
from ..schema import Row, missing
from .base import (
    FILE,
    Artifacts,
    CellParams,
    Kind,
    Parsed,
    Prepared,
    Spec,
    gpu_from_log,
    host_op,
    log_safe_threads,
    register,
)

DEFAULT_TEXT = "llama.cpp:docs/build.md"  # ships with the pinned llama.cpp source: on every machine


class _KLDFields(BaseModel):
    """What a KLD spec and each of its cells hold alike."""

    text: str = DEFAULT_TEXT
    ctx: int = Field(default=128, ge=16)
    chunks: int = Field(default=8, ge=1)
    threads: int | None = Field(default=None, ge=1)
    host_check: bool | None = None  # also compare the device's logits with the host's for the same file
    # (default: on for every device that does not measure on this host's CPUs,
    # and for every GPU backend: does the GPU path change the answers?)


class KLDCell(CellParams, _KLDFields):
    """One KLD cell: the spec at one layer count, on one of the recipe's backends."""

    n_gpu_layers: int | None = None
    backend: str | None = None  # the recipe's backend axis, where it has one (plan.expand adds it)


class KLDSpec(Spec, _KLDFields):
    kind: Literal["kld"]
    n_gpu_layers: list[Annotated[int, Field(ge=0)] | None] = [None]  # llama.cpp -ngl (99 = all), one cell each

    @model_validator(mode="after")
    def _enough_tokens(self) -> "KLDSpec":
        scored = (self.ctx - self.ctx // 2 - 1) * self.chunks  # llama-perplexity scores each chunk's 2nd half
        if scored < 100:
            raise ValueError(
                f"ctx {self.ctx} × chunks {self.chunks} scores {scored} tokens; llama-perplexity "
                "prints KL-divergence statistics only over ≥ 100 (e.g. ctx: 128, chunks: 2)"
            )
        return self


@dataclass(frozen=True)
class KLDParams:
    ctx: int = 128
    chunks: int = 8
    threads: int = 2
    batch: int | None = None
    n_gpu_layers: int | None = None


def base_argv(bin_: str, base_model: str, text: str, logits_out: str, p: KLDParams) -> list[str]:
    a = [
        bin_,
        "-m",
        base_model,
        "-f",
        text,
        "-c",
        str(p.ctx),
        "--chunks",
        str(p.chunks),
        "-t",
        str(p.threads),
        "--kl-divergence-base",
        logits_out,
    ]
    if p.batch:
        a += ["-b", str(p.batch)]
    return a


def kld_argv(bin_: str, model: str, logits: str, p: KLDParams) -> list[str]:
    a = [
        bin_,
        "-m",
        model,
        "-c",
        str(p.ctx),
        "--chunks",
        str(p.chunks),
        "-t",
        str(p.threads),
        "--kl-divergence-base",
        logits,
        "--kl-divergence",
    ]
    if p.batch:
        a += ["-b", str(p.batch)]
    if p.n_gpu_layers is not None:
        a += ["-ngl", str(p.n_gpu_layers)]
    return a


_NUM = r"([-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf))"
# the "±" between a figure and its spread, also as it arrives after passing through another encoding: "Â±"
# (UTF-8 read as cp1252), "┬▒" (cp437), "_" or "?" (a console that could not show it), "�", or written "+/-"
_PM = r"\s*(?:±|\+/-|\+-|[^\s\d.+\-]{1,3})\s*"
# llama-perplexity's summary (April 2024 on: "====== KL divergence statistics ======"): metric -> (the line's label,
# the figures after it). A label found with figures that do not read is refused, never dropped to a missing figure.
LABELS = {
    "ppl": (r"Mean PPL\(Q\)\s*:", rf"{_NUM}{_PM}{_NUM}"),
    "ppl_base": (r"Mean PPL\(base\)\s*:", rf"{_NUM}{_PM}{_NUM}"),
    "ln_ppl_ratio": (r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:", rf"{_NUM}{_PM}{_NUM}"),
    "ppl_ratio": (r"Mean PPL\(Q\)/PPL\(base\)\s*:", rf"{_NUM}{_PM}{_NUM}"),
    "kld_mean": (r"Mean\s+KLD:", rf"{_NUM}{_PM}{_NUM}"),
    "kld_max": (r"Maximum KLD:", _NUM),
    "kld_p99": (r"99\.0%\s+KLD:", _NUM),
    "kld_p90": (r"90\.0%\s+KLD:", _NUM),
    "kld_median": (r"Median\s+KLD:", _NUM),
    "rms_dp": (r"RMS \S{0,4}p\s*:", rf"{_NUM}{_PM}{_NUM}\s*%"),  # "RMS Δp", mangled: "RMS _p", "RMS Î”p"
    "same_top_p": (r"Same top p:", rf"{_NUM}{_PM}{_NUM}\s*%"),
}
# January-April 2024 builds (llama.cpp #5076/#5081): "===== KL-divergence statistics", "Average: m ± s", "KLD_99 : v";
# perplexity, its ratio and the same-top fraction only in the per-chunk table, whose last row is the whole run's
EARLY_LABELS = {
    "kld_mean": (r"Average\s*:", rf"{_NUM}{_PM}{_NUM}"),
    "kld_median": (r"Median\s*:", _NUM),
    "kld_max": (r"Maximum\s*:", _NUM),
    "kld_p99": (r"KLD_99\s*:", _NUM),
    "kld_p90": (r"KLD_90\s*:", _NUM),
}
_PM1 = r"[ \t]*(?:±|\+/-|\+-|[^\s\d.+\-]{1,3})[ \t]*"  # _PM within one line
EARLY_CHUNK = re.compile(
    rf"^(?:[\d.]+\t)?[ \t]*(\d+)[ \t]+{_NUM}[ \t]+{_NUM}{_PM1}{_NUM}[ \t]+{_NUM}{_PM1}{_NUM}"
    rf"(?:[ \t]+{_NUM}{_PM1}{_NUM})?[ \t]*$",
    re.M,
)
PERCENT = {"rms_dp", "same_top_p"}
FINAL = re.compile(rf"Final estimate: PPL = {_NUM} \+/- {_NUM}")
NOT_PRINTED = "not printed by llama-perplexity"


def _figures(text: str, labels: dict) -> dict[str, tuple[float, float | None] | str]:
    """metric -> (value, spread) read off its labelled line, or why it is absent. A labelled line whose figures do not
    read (a sign mangled beyond recognition, a cut line) raises: one line, never a partial row."""
    out: dict[str, tuple[float, float | None] | str] = {}
    for metric, (label, figures) in labels.items():
        line = re.search(rf"(?:^|\t)[ \t]*({label}.*)$", text, re.M)  # a line, or a stdout.tsv's "time<TAB>line"
        if not line:
            out[metric] = NOT_PRINTED
            continue
        m = re.match(rf"{label}\s*{figures}", line.group(1))
        if not m:
            raise DevicelabError(
                f"llama-perplexity's line {line.group(1).strip()!r} does not read as figures (its ± sign or digits "
                "mangled, or the line cut?); give the log as llama-perplexity wrote it"
            )
        sd = float(m.group(2)) if m.lastindex and m.lastindex >= 2 else None
        if sd is not None and sd != sd:  # llama-perplexity prints '-nan' for the spread of identical logits
            sd = None
        out[metric] = (float(m.group(1)), sd)
    return out


def _early(text: str) -> dict[str, tuple[float, float | None] | str]:
    """The early-2024 summary and the per-chunk table's last row (cumulative over the run)."""
    out = _figures(text, EARLY_LABELS)
    rows = EARLY_CHUNK.findall(text)
    why = "not printed by this llama-perplexity (early 2024 format)"
    out.update({"ppl_base": why, "rms_dp": why})
    if not rows:
        out.update({k: "no per-chunk row in the log (early 2024 format)" for k in ("ppl", "ln_ppl_ratio", "ppl_ratio")})
        out["same_top_p"] = out["ppl"]
        return out
    last = [float(x) for x in rows[-1][1:] if x != ""]
    out["ppl"] = (last[0], None)
    ln, ln_sd = last[1], last[2]
    out["ln_ppl_ratio"] = (ln, ln_sd)
    # what later builds print as "Mean PPL(Q)/PPL(base)", by llama-perplexity's own formula: exp(ln), its spread × ln's
    out["ppl_ratio"] = (math.exp(ln), math.exp(ln) * ln_sd)
    # "Same top" (a fraction here, a percentage later) is a column added by #5081; #5076's table has none
    out["same_top_p"] = (last[5] * 100, last[6] * 100) if len(last) == 7 else why  # as a percentage, like later
    return out


def parse_kld(text: str, p: KLDParams) -> list[Row]:
    early = "===== KL-divergence statistics" in text and "Mean    KLD" not in text
    if "KL divergence statistics" not in text and "Mean    KLD" not in text and not early:
        tail = "\n".join(text.strip().splitlines()[-3:])
        raise DevicelabError(f"llama-perplexity printed no KL divergence statistics ({tail[:200]})")
    figures = _early(text) if early else _figures(text, LABELS)
    if not early and figures["kld_p90"] == NOT_PRINTED and len(re.findall(r"99\.0%\s+KLD:", text)) > 1:
        # builds of April 2024 to September 2025 print the 99th percentile twice where the 90th belongs (#15999)
        figures["kld_p90"] = "not printed by this llama-perplexity (it prints 99.0% twice instead, llama.cpp #15999)"
    out = []
    gpu = gpu_from_log(text)
    if "n_gpu_layers" not in gpu and p.n_gpu_layers is not None:
        gpu["n_gpu_layers"] = p.n_gpu_layers  # as asked: the tool's log line saying so can be lost
    common = dict(test=f"kld@c{p.ctx}x{p.chunks}", phase="perplexity", ctx=p.ctx, n=p.chunks, threads=p.threads, **gpu)
    for metric in LABELS:
        got = figures[metric]
        if isinstance(got, str):
            out.append(missing(metric, got, **common))
            continue
        v, sd = got
        if metric in PERCENT:
            v, sd = v / 100, (sd / 100 if sd is not None else None)
        out.append(Row(metric=metric, value=v, stddev=sd, **common))
    return out


def parse_base_ppl(text: str) -> float | None:
    m = FINAL.search(text)
    return float(m.group(1)) if m else None


def _params(c: KLDCell, facts: dict) -> KLDParams:
    return KLDParams(
        ctx=c.ctx, chunks=c.chunks, threads=c.threads or log_safe_threads(facts), n_gpu_layers=c.n_gpu_layers
    )


# ---- host work: logits made once on the host, per (model file, text, ctx, chunks) ----
BASE_LOGITS, HOST_LOGITS = "kld-base-logits", "kld-host-logits"


def _logits(host, model_file, sha: str, spec: dict, out_name: str, what: str):
    c = KLDCell.model_validate(spec)
    text = host.resolve_text(c.text)
    key = hashlib.sha256(json.dumps([sha, sha256_file(text), c.ctx, c.chunks]).encode()).hexdigest()[:16]
    out = paths.sub("kld") / f"{out_name}-{key}.kld"
    meta = out.with_suffix(".json")
    if out.exists() and meta.exists():
        return out
    with paths.result_lock(out):  # another process making the same logits: wait for them
        if out.exists() and meta.exists():
            return out
        hb = host.host_build("llama-perplexity")
        host.ev.stage(f"{what} (host, once)")
        p = KLDParams(ctx=c.ctx, chunks=c.chunks, threads=max(1, os.cpu_count() or 2))
        log = out.with_suffix(".log")
        log.write_text("")
        tmp = paths.temp_for(out)
        with host.cpu.work(what):
            run_logged(
                base_argv(str(hb.tool("llama-perplexity")), str(model_file), str(text), str(tmp), p),
                log,
                what=f"llama-perplexity ({what})",
            )
        tmp.replace(out)
        ppl = parse_base_ppl(log.read_text(errors="replace"))
        meta.write_text(json.dumps({"ppl_base": ppl, "sha256": sha, "text": str(text), **spec}))
    return out


@host_op(BASE_LOGITS, FILE)
def base_logits(host, model: str, spec: dict):
    """The F16 base's logits of the text, on the host, once per (base file, text, ctx, chunks)."""
    base = host.base(model)
    return _logits(host, base.path, base.sha256, spec, model, f"KLD base logits for {model}")


@host_op(HOST_LOGITS, FILE)
def host_quant_logits(host, model: str, quant: str, spec: dict):
    """The same quant file's logits made on the host: the reference a device's run of that file is checked
    against."""
    qf = host.quant(model, quant)
    return _logits(host, qf.path, qf.sha256, spec, f"{model}-{quant}-host", f"host logits of {model} {quant}")


@register
class KLD(Kind[KLDCell]):
    name = "kld"
    key_properties = (*Kind.key_properties, "ctx")
    shape_properties = (*Kind.shape_properties, "ctx")
    spec = KLDSpec
    cell = KLDCell

    def tools(self, params):
        return ("llama-perplexity",)

    def variants(self, spec):
        base = spec.model_dump(exclude={"kind", "n_gpu_layers"})
        return [{**base, **({"n_gpu_layers": n} if n is not None else {})} for n in spec.n_gpu_layers]

    def label(self, params):
        c = self.typed(params)
        return f"ngl={c.n_gpu_layers}" if c.n_gpu_layers is not None else ""

    def check(self, spec, recipe_dir):
        if not spec.text.startswith("llama.cpp:"):
            resolve_text(spec.text, None, recipe_dir)

    def prepare(self, cx, cell):
        P, c = cell.params, self.typed(cell.params)
        tool = cx.tool("llama-perplexity")
        model = cx.model()
        logits = cx.host_op(BASE_LOGITS, cell.model, P)  # the host work is keyed by the cell's stored params
        kp = _params(c, cx.facts)
        runs = [("main", kld_argv(tool, model, cx.push(logits), kp))]
        check = c.host_check
        if check is None:
            check = not cx.same_build_as_host or c.backend not in (None, backends.CPU)
        if check:
            runs.append(
                ("check", kld_argv(tool, model, cx.push(cx.host_op(HOST_LOGITS, cell.model, cell.quant, P)), kp))
            )
        return Prepared(runs)

    def complete(self, run, out):
        text = out.stdout + "\n" + out.stderr
        return "KL divergence statistics" in text or "Mean    KLD" in text or "KL-divergence statistics" in text

    def parse(self, a: Artifacts) -> Parsed:
        kp = _params(self.typed(a.params), a.facts)
        argv = [str(x) for x in a.main.argv]
        if "-t" in argv[:-1]:  # the threads it ran with, whatever today's default
            kp = KLDParams(kp.ctx, kp.chunks, int(argv[argv.index("-t") + 1]), kp.batch, kp.n_gpu_layers)
        out = parse_kld(a.main.stdout + "\n" + a.main.stderr, kp)
        if "check" in a.runs:
            chk = {r.metric: r for r in parse_kld(a.runs["check"].stdout + "\n" + a.runs["check"].stderr, kp)}
            for src, dst in (("kld_mean", "devhost_kld_mean"), ("same_top_p", "devhost_same_top_p")):
                r = chk[src]
                out.append(
                    Row(
                        metric=dst,
                        value=r.value,
                        stddev=r.stddev,
                        test=r.test,
                        phase="host-check",
                        ctx=r.ctx,
                        n=r.n,
                        missing_reason=r.missing_reason,
                        gpu_device=r.gpu_device,
                        n_gpu_layers=r.n_gpu_layers,
                    )
                )
        return Parsed(out)
