"""llama-bench: command line from a recipe's bench payload, and rows from its JSONL output."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from ..errors import DevicelabError
from ..schema import Row


@dataclass(frozen=True)
class BenchParams:
    prompt: tuple[int, ...] = (64,)
    gen: tuple[int, ...] = (32,)
    pg: tuple[tuple[int, int], ...] = ()
    depth: tuple[int, ...] = (0,)
    threads: int = 1
    repetitions: int = 3
    cpu_mask: str | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    warmup: bool = True


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
    return a


@dataclass
class BenchTest:
    record: dict
    t_end: float | None      # arrival of its JSONL line on the device clock (s)

    @property
    def kind(self) -> str:
        r = self.record
        if r["n_prompt"] and r["n_gen"]:
            return "pg"
        return "prefill" if r["n_prompt"] else "decode"

    @property
    def name(self) -> str:
        r = self.record
        base = {"pg": f"pp{r['n_prompt']}+tg{r['n_gen']}", "prefill": f"pp{r['n_prompt']}",
                "decode": f"tg{r['n_gen']}"}[self.kind]
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
    for line in stdout_tsv.splitlines():
        t, _, payload = line.partition("\t")
        if not payload:
            payload, t = t, ""
        payload = payload.strip()
        if not payload.startswith("{"):
            continue
        try:
            rec = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if "avg_ts" not in rec:
            continue
        try:
            te = float(t) if t else None
        except ValueError:
            te = None
        tests.append(BenchTest(rec, te))
    return tests


METRIC_FOR_KIND = {"prefill": "prefill_tps", "decode": "decode_tps", "pg": "pg_tps"}


def rows(tests: list[BenchTest]) -> list[Row]:
    out = []
    if not tests:
        raise DevicelabError("llama-bench printed no result line; see the cell's stderr.txt")
    for bt in tests:
        r = bt.record
        samples = [float(x) for x in r.get("samples_ts") or []]
        sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
        common = dict(test=bt.name, phase=bt.kind, threads=int(r["n_threads"]), n_prompt=int(r["n_prompt"]),
                      n_gen=int(r["n_gen"]), n_depth=int(r.get("n_depth") or 0), n=len(samples))
        out.append(Row(metric=METRIC_FOR_KIND[bt.kind], value=float(r["avg_ts"]), stddev=sd, samples=samples, **common))
        ns = r.get("samples_ns") or []
        out.append(Row(metric="test_seconds", value=sum(ns) / 1e9, samples=[x / 1e9 for x in ns], **common))
    return out
