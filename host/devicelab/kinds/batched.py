"""Parallel streams: aggregate throughput at several concurrent sequences (llama-batched-bench)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from ..errors import DevicelabError
from ..schema import Row
from .base import Artifacts, CellParams, Kind, KVType, Parsed, Prepared, Spec, register, timed_lines


class BatchedCell(CellParams):
    """A batched cell's parameters (the payload sweeps nothing: its spec's fields)."""

    prompt: int = Field(default=64, ge=1)
    gen: int = Field(default=32, ge=1)
    parallel: list[Annotated[int, Field(ge=1)]] = [1, 2, 4, 8]
    threads: int | None = Field(default=None, ge=1)
    cache_type_k: KVType | None = None
    cache_type_v: KVType | None = None


class BatchedSpec(Spec, BatchedCell):
    model_config = ConfigDict(extra="forbid", frozen=False)
    kind: Literal["batched"]


def argv(tool: str, model: str, c: BatchedCell, threads: int) -> list[str]:
    npl = c.parallel
    a = [
        tool,
        "-m",
        model,
        "-c",
        str(max(npl) * (c.prompt + c.gen)),
        "-b",
        "2048",
        "-ub",
        "512",
        "-npp",
        str(c.prompt),
        "-ntg",
        str(c.gen),
        "-npl",
        ",".join(map(str, npl)),
        "-t",
        str(threads),
        "--output-format",
        "jsonl",
    ]
    if c.cache_type_k:
        a += ["-ctk", c.cache_type_k]
    if c.cache_type_v:
        a += ["-ctv", c.cache_type_v]
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
class Batched(Kind[BatchedCell]):
    name = "batched"
    key_properties = (*Kind.key_properties, "threads", "n_prompt", "n_gen", "n_parallel")
    shape_properties = (*Kind.shape_properties, "n_prompt", "n_gen")
    spec = BatchedSpec
    cell = BatchedCell

    def tools(self, params):
        return ("llama-batched-bench",)

    def prepare(self, cx, cell):
        c = self.typed(cell.params)
        threads = c.threads or cx.facts.get("cpu_count") or 1
        return Prepared([("main", argv(cx.tool("llama-batched-bench"), cx.model(), c, threads))])

    def parse(self, a: Artifacts) -> Parsed:
        return Parsed(parse_batched(a.main.stdout))
