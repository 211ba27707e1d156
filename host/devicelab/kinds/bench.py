"""llama-bench: prompt/generation/depth sweeps at thread counts, CPU masks, CPU quotas and contention.
Rows: prefill/decode/pg t/s with every repetition; each llama-bench test is an energy phase."""

from __future__ import annotations

import itertools
import json
import re
import statistics
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, field_validator

from .. import facts as factsmod
from ..errors import DevicelabError
from ..schema import Row, missing
from ..telemetry.normalize import Phase
from .base import Artifacts, CellParams, Kind, KVType, Parsed, Prepared, SkipCell, Spec, register, timed_lines

AXES = ("threads", "cpu_mask", "quota", "contention")


class BenchSpec(Spec):
    kind: Literal["bench"]
    prompt: list[Annotated[int, Field(ge=0)]] = [64]
    gen: list[Annotated[int, Field(ge=0)]] = [32]
    pg: list[tuple[int, int]] = []
    depth: list[Annotated[int, Field(ge=0)]] = [0]
    threads: list[int | str] = [1]  # counts, or auto: one thread per CPU of the mask
    # llama-bench -C affinity, one cell each: a hex mask, or big.LITTLE-aware names resolved per device
    # from its cpufreq clusters: prime (fastest cluster), big (all but the slowest), little, all
    cpu_masks: list[str | None] = [None]
    quota: list[Annotated[float, Field(gt=0)] | None] = [None]  # CPU quota in cores (0.5 = half a core), cgroup
    contention: list[Annotated[int, Field(ge=0)]] = [0]  # busy-looping co-runners
    repetitions: int = Field(default=3, ge=1)
    warmup: bool = True
    cache_type_k: KVType | None = None
    cache_type_v: KVType | None = None
    # GPU axes, with llama-bench's names: layers offloaded (99 = all), flash attention, the GPU device
    n_gpu_layers: list[Annotated[int, Field(ge=0)] | None] = [None]
    flash_attn: list[Literal["on", "off", "auto"] | None] = [None]
    device: str | None = None  # llama-bench -dev (e.g. Vulkan0) where there are several

    @field_validator("threads")
    @classmethod
    def _threads(cls, v: list[int | str]) -> list[int | str]:
        for t in v:
            if t != "auto" and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
                raise ValueError(f"thread count {t!r}: give an integer ≥ 1 or auto")
        return v

    @field_validator("cpu_masks")
    @classmethod
    def _masks(cls, v: list[str | None]) -> list[str | None]:
        for m in v:
            if m is not None and m not in factsmod.MASK_NAMES and not re.fullmatch(r"0x[0-9a-fA-F]+", m):
                raise ValueError(f"cpu mask {m!r}: give a hex mask (0xf0) or prime | big | little | all")
        return v


class BenchCell(CellParams):
    """One bench cell: the spec with one point of each sweep axis."""

    prompt: list[int] = [64]
    gen: list[int] = [32]
    pg: list[tuple[int, int]] = []
    depth: list[int] = [0]
    threads: int | str = 1
    cpu_mask: str | None = None
    quota: float | None = None
    contention: int = 0
    repetitions: int = 3
    warmup: bool = True
    cache_type_k: KVType | None = None
    cache_type_v: KVType | None = None
    n_gpu_layers: int | None = None
    flash_attn: str | None = None
    device: str | None = None


@dataclass(frozen=True)
class BenchParams:
    prompt: tuple[int, ...] = (64,)
    gen: tuple[int, ...] = (32,)
    pg: tuple[tuple[int, int], ...] = ()
    depth: tuple[int, ...] = (0,)
    threads: int = 1
    repetitions: int = 3
    cpu_mask: str | None = None
    cache_type_k: KVType | None = None
    cache_type_v: KVType | None = None
    warmup: bool = True
    n_gpu_layers: int | None = None
    flash_attn: str | None = None
    device: str | None = None


def argv(bench_bin: str, model: str, p: BenchParams) -> list[str]:
    a = [bench_bin, "-m", model, "-o", "jsonl", "-r", str(p.repetitions), "-t", str(p.threads)]
    a += ["-p", ",".join(map(str, p.prompt)) if p.prompt else "0"]
    a += ["-n", ",".join(map(str, p.gen)) if p.gen else "0"]
    if p.pg:
        a += ["-pg", ",".join(f"{x},{y}" for x, y in p.pg)]
    if any(p.depth):
        a += ["-d", ",".join(map(str, p.depth))]
    if p.cpu_mask:
        a += ["-C", p.cpu_mask]
    if p.cache_type_k:
        a += ["-ctk", p.cache_type_k]
    if p.cache_type_v:
        a += ["-ctv", p.cache_type_v]
    if not p.warmup:
        a.append("--no-warmup")
    if p.n_gpu_layers is not None:
        a += ["-ngl", str(p.n_gpu_layers)]
    if p.flash_attn:
        a += ["-fa", p.flash_attn]
    if p.device:
        a += ["-dev", p.device]
    return a


@dataclass
class BenchTest:
    record: dict
    t_end: float | None  # arrival of its JSONL line on the device clock (s)

    @property
    def kind(self) -> str:
        r = self.record
        if r["n_prompt"] and r["n_gen"]:
            return "pg"
        return "prefill" if r["n_prompt"] else "decode"

    @property
    def name(self) -> str:
        r = self.record
        base = {
            "pg": f"pp{r['n_prompt']}+tg{r['n_gen']}",
            "prefill": f"pp{r['n_prompt']}",
            "decode": f"tg{r['n_gen']}",
        }[self.kind]
        return base + (f"@d{r['n_depth']}" if r.get("n_depth") else "")

    @property
    def tokens(self) -> int:
        r = self.record
        return int(r["n_prompt"]) + int(r["n_gen"])

    def window(self) -> tuple[float, float] | None:
        """[start, end] of the timed repetitions on the device clock."""
        if self.t_end is None:
            return None
        dur = sum(self.record.get("samples_ns") or []) / 1e9
        return (self.t_end - dur, self.t_end)


def parse(stdout_tsv: str) -> list[BenchTest]:
    """Parse run_payload.sh's stdout.tsv (time<TAB>line) or plain JSONL."""
    tests = []
    for te, payload in timed_lines(stdout_tsv):
        payload = payload.strip()
        if not payload.startswith("{"):
            continue
        try:
            rec = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or "avg_ts" not in rec:
            continue
        tests.append(BenchTest(rec, te))
    return tests


METRIC_FOR_KIND = {"prefill": "prefill_tps", "decode": "decode_tps", "pg": "pg_tps"}


def rows(tests: list[BenchTest]) -> list[Row]:
    out = []
    if not tests:
        raise DevicelabError("llama-bench printed no result line; see the cell's stderr.txt")
    for bt in tests:
        r = bt.record
        try:
            samples = [float(x) for x in r.get("samples_ts") or []]
            sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
            n: int | None = len(samples)
            if not samples and r.get("stddev_ts") not in (None, ""):  # -o csv / -o sql: no repetitions kept
                sd, n = float(r["stddev_ts"]), None
            common = dict(
                test=bt.name,
                phase=bt.kind,
                threads=int(r["n_threads"]) if r["n_threads"] is not None else None,  # a markdown table may not say
                n_prompt=int(r["n_prompt"]),
                n_gen=int(r["n_gen"]),
                n_depth=int(r.get("n_depth") or 0),
                n=n,
                **gpu_columns(r),
            )
            out.append(
                Row(metric=METRIC_FOR_KIND[bt.kind], value=float(r["avg_ts"]), stddev=sd, samples=samples, **common)
            )
            ns = r.get("samples_ns") or []
            if ns:
                out.append(Row(metric="test_seconds", value=sum(ns) / 1e9, samples=[x / 1e9 for x in ns], **common))
            else:  # -o csv / sql / md keep no repetitions: how long they took is not known, not zero
                out.append(
                    missing("test_seconds", "llama-bench's output keeps no repetitions (csv, sql, md)", **common)
                )
        except (KeyError, TypeError, ValueError) as e:
            raise DevicelabError(
                f"llama-bench printed a result line devicelab cannot read ({type(e).__name__}: "
                f"{e}); see the cell's stdout.tsv"
            ) from None
    return out


def gpu_columns(r: dict) -> dict:
    """The GPU side of one llama-bench record: the GPU device that did the work (gpu_info), layers offloaded and
    flash attention; none of it on a CPU-only build (llama-bench's "backends" is "CPU" there). With 0 layers a
    GPU build still runs large prompt batches on the GPU device: its name is recorded all the same."""
    if r.get("backends", "CPU") in ("CPU", "", None):
        return {}
    fa = r.get("flash_attn")
    if isinstance(fa, bool):
        fa = "on" if fa else "off"
    elif fa is not None:
        fa = {"1": "on", "0": "off", "-1": "auto"}.get(str(fa), str(fa))
    ngl = r.get("n_gpu_layers")
    return {
        "gpu_device": r.get("gpu_info") or None,
        "n_gpu_layers": int(ngl) if ngl is not None else None,
        "flash_attn": fa,
    }


def affinity(c: BenchCell, facts: dict, device: str) -> tuple[str | None, int, dict]:
    """llama-bench's -C mask and -t count for a bench cell: named masks (prime/big/little/all) are
    resolved from the device's cpufreq clusters; threads 'auto' = one per CPU of the mask."""
    name = c.cpu_mask
    cpus = None
    mask = name
    prov: dict = {}
    if name in factsmod.MASK_NAMES:
        cpus = factsmod.named_cpus(name, facts)
        if cpus is None:
            raise SkipCell(
                f"{device} has no big.LITTLE clusters to pick '{name}' from (the max clocks of its "
                "CPUs are all equal or unreadable)"
            )
        mask = factsmod.mask_hex(cpus)
        prov["cpu_mask"] = f"{name}={mask}"
    elif name:
        cpus = [i for i in range(int(name, 16).bit_length()) if int(name, 16) >> i & 1]
    threads = c.threads
    if threads == "auto":
        threads = len(cpus) if cpus else (facts.get("cpu_count") or 1)
    return mask, int(threads), prov


@register
class Bench(Kind[BenchCell]):
    name = "bench"
    cell = BenchCell
    key_properties = (
        *Kind.key_properties,
        "threads",
        "n_prompt",
        "n_gen",
        "n_depth",
        "flash_attn",
        "cpu_mask",
        "cpu_quota",
        "contention",
    )
    shape_properties = (*Kind.shape_properties, "n_prompt", "n_gen", "n_depth")
    spec = BenchSpec

    def tools(self, params):
        return ("llama-bench",)

    def variants(self, spec):
        gpu = ("n_gpu_layers", "flash_attn", "device")
        base = spec.model_dump(exclude={"threads", "kind", "cpu_masks", "quota", "contention", *gpu})
        out = []
        for t, m, q, c, ngl, fa in itertools.product(
            spec.threads, spec.cpu_masks, spec.quota, spec.contention, spec.n_gpu_layers, spec.flash_attn
        ):
            params = {**base, "threads": t, "cpu_mask": m, "quota": q, "contention": c}
            if m is None and q is None and c == 0:  # the plain cell keeps the id it always had
                params = {k: x for k, x in params.items() if k not in ("cpu_mask", "quota", "contention")}
            params.update(
                {k: v for k, v in (("n_gpu_layers", ngl), ("flash_attn", fa), ("device", spec.device)) if v is not None}
            )
            out.append(params)
        return out

    def label(self, params):
        c = self.typed(params)
        return (
            f"t={c.threads}"
            + (f" mask={c.cpu_mask}" if c.cpu_mask else "")
            + (f" quota={c.quota}" if c.quota else "")
            + (f" load={c.contention}" if c.contention else "")
            + (f" ngl={c.n_gpu_layers}" if c.n_gpu_layers is not None else "")
            + (f" fa={c.flash_attn}" if c.flash_attn else "")
        )

    def provenance(self, params):
        c = self.typed(params)
        # a plain cell has no contention axis, and its rows say None (not 0), as they always have
        contention = c.contention if "contention" in c.model_fields_set else None
        return {"cpu_mask": c.cpu_mask, "cpu_quota": c.quota, "contention": contention}

    def prepare(self, cx, cell):
        c = self.typed(cell.params)
        mask, threads, prov = affinity(c, cx.facts, cx.device)
        bp = BenchParams(
            prompt=tuple(c.prompt),
            gen=tuple(c.gen),
            pg=tuple(tuple(x) for x in c.pg),
            depth=tuple(c.depth),
            threads=threads,
            repetitions=c.repetitions,
            warmup=c.warmup,
            cpu_mask=mask,
            cache_type_k=c.cache_type_k,
            cache_type_v=c.cache_type_v,
            n_gpu_layers=c.n_gpu_layers,
            flash_attn=c.flash_attn,
            device=c.device,
        )
        return Prepared(
            [("main", argv(cx.tool("llama-bench"), cx.model(), bp))],
            quota=c.quota,
            contention=c.contention,
            provenance=prov,
        )

    def parse(self, a: Artifacts) -> Parsed:
        tests = parse(a.main.stdout)
        out = rows(tests)
        phases = []
        for bt in tests:
            w = bt.window()
            if w:
                n = len(bt.record.get("samples_ns") or [])
                phases.append(Phase(bt.name, bt.kind, w[0], w[1], bt.tokens * n, n))
        win = a.main.window
        if phases and win and min(p.start for p in phases) > win[0]:
            # from the payload's start to its first timed test: model load (+ warmup)
            phases.insert(0, Phase("load", "load", win[0], min(p.start for p in phases)))
        return Parsed(out, phases)
