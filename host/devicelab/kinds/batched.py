"""Parallel streams: aggregate throughput at several concurrent sequences (llama-batched-bench)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field

from ..errors import DevicelabError
from ..schema import Row
from .base import Artifacts, Kind, KVType, Parsed, Prepared, Spec, register, timed_lines


class BatchedSpec(Spec):
    kind: Literal["batched"]
    prompt: int = Field(default=64, ge=1)
    gen: int = Field(default=32, ge=1)
    parallel: list[Annotated[int, Field(ge=1)]] = [1, 2, 4, 8]
    threads: int | None = Field(default=None, ge=1)
    cache_type_k: KVType | None = None
    cache_type_v: KVType | None = None


def argv(tool: str, model: str, P: dict, threads: int) -> list[str]:
    npl = P["parallel"]
    a = [
        tool,
        "-m",
        model,
        "-c",
        str(max(npl) * (P["prompt"] + P["gen"])),
        "-b",
        "2048",
        "-ub",
        "512",
        "-npp",
        str(P["prompt"]),
        "-ntg",
        str(P["gen"]),
        "-npl",
        ",".join(map(str, npl)),
        "-t",
        str(threads),
        "--output-format",
        "jsonl",
    ]
    if P.get("cache_type_k"):
        a += ["-ctk", P["cache_type_k"]]
    if P.get("cache_type_v"):
        a += ["-ctv", P["cache_type_v"]]
    return a


def parse_batched(stdout: str) -> list[Row]:
    rows = []
    for _, line in timed_lines(stdout):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
            kw = dict(
                test=f"pp{r['pp']}+tg{r['tg']}x{r['pl']}",
                phase="parallel",
                n_prompt=r["pp"],
                n_gen=r["tg"],
                n_parallel=r["pl"],
                threads=r.get("n_threads"),
                ctx=r.get("n_kv_max"),
            )
            rows.append(Row(metric="aggregate_tps", value=float(r["speed"]), **kw))
            rows.append(Row(metric="aggregate_decode_tps", value=float(r["speed_tg"]), **kw))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise DevicelabError(
                f"llama-batched-bench printed a line devicelab cannot read ({type(e).__name__}: "
                f"{e}); see the cell's stdout.tsv"
            ) from None
    if not rows:
        raise DevicelabError("llama-batched-bench printed no result line; see the cell's stderr.txt")
    return rows


@register
class Batched(Kind):
    name = "batched"
    key_properties = (*Kind.key_properties, "threads", "n_prompt", "n_gen", "n_parallel")
    spec = BatchedSpec

    def tools(self, params):
        return ("llama-batched-bench",)

    def prepare(self, cx, cell):
        P = cell.params
        return Prepared(
            [
                (
                    "main",
                    argv(
                        cx.tool("llama-batched-bench"),
                        cx.model(),
                        P,
                        P.get("threads") or cx.facts.get("cpu_count") or 1,
                    ),
                )
            ]
        )

    def parse(self, a: Artifacts) -> Parsed:
        return Parsed(parse_batched(a.main.stdout))
