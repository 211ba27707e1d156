"""llama.cpp's tools as people publish their output: llama-bench in each of its formats (through the importer the
lab's `import-bench` uses) and llama-perplexity's KL-divergence summary (through the KLD kind's parser).

llama-bench figures are keyed by the result's place in the capture, from 1: `2.tps` is the second result's speed
(tokens/s, whichever of prefill, decode or pp+tg its test is), `2.test` its test ('pp512', 'tg128@d512'), and beside
them `n_prompt`, `n_gen`, `n_depth`, `threads`, `quant`, `model_type`, `build_commit`, `build_number`, `backend`,
`n_gpu_layers`, `gpu_device`, `model_bytes`, `n_params`, `repetitions`. `results` is how many there are."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import DevicelabError
from ..importer import imported_cells, read_records
from ..kinds.kld import KLDParams, parse_kld
from ..validation import read_text
from . import Missing, Unsupported, reader


def _value(v: Any, why: str) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return Missing(why)
    return v


@reader("llama-bench-json", "llama-bench-jsonl", "llama-bench-csv", "llama-bench-sql", "llama-bench-md")
def llama_bench(path: Path) -> dict[str, Any]:
    try:
        recs = read_records(path)
        cells = imported_cells(recs, path, device="capture", recipe="imported")
    except DevicelabError as e:
        raise Unsupported(" ".join(str(e).split())) from None
    place = {id(r): i for i, r in enumerate(recs, 1)}
    out: dict[str, Any] = {"results": len(recs)}
    for ic in cells:
        for k, r in enumerate(ic.records):
            speed, seconds = ic.rows[2 * k], ic.rows[2 * k + 1]
            i = place[id(r)]
            on_gpu = speed.n_gpu_layers is not None or str(r.get("backends") or "CPU") != "CPU"
            no_gpu = "not printed in this capture" if on_gpu else "a CPU run"
            rounded = "rounded in llama-bench's markdown table: {}"
            fig = {
                "test": speed.test,
                "metric": speed.metric,
                "tps": _value(speed.value, speed.missing_reason or "not printed"),
                "tps_sd": _value(speed.stddev, "no spread printed"),
                "n_prompt": speed.n_prompt,
                "n_gen": speed.n_gen,
                "n_depth": speed.n_depth,
                "threads": _value(speed.threads, "not printed (the markdown table shows threads only for CPU runs)"),
                "repetitions": _value(speed.n, "this format keeps no repetitions"),
                "test_seconds": _value(seconds.value, seconds.missing_reason or "not printed"),
                "quant": ic.cell.quant,
                "model": ic.cell.model,
                "model_type": r.get("model_type"),
                "build_commit": _value(r.get("build_commit"), "no build line in the capture"),
                "build_number": _value(r.get("build_number"), "no build line in the capture"),
                "backend": _value(r.get("backends"), "not printed"),
                "n_gpu_layers": _value(speed.n_gpu_layers, no_gpu),
                "gpu_device": _value(speed.gpu_device, no_gpu),
                "model_bytes": _value(
                    r.get("model_size"), rounded.format(r["md_size"]) if "md_size" in r else "not printed"
                ),
                "n_params": _value(
                    r.get("model_n_params"), rounded.format(r["md_params"]) if "md_params" in r else "not printed"
                ),
            }
            out.update({f"{i}.{k2}": v for k2, v in fig.items()})
    return out


@reader("llama-perplexity-kld")
def llama_perplexity_kld(path: Path) -> dict[str, Any]:
    text = read_text(path, "llama-perplexity output")
    try:
        rows = parse_kld(text, KLDParams())
    except DevicelabError as e:
        raise Unsupported(" ".join(str(e).split())) from None
    out: dict[str, Any] = {}
    for row in rows:
        if row.missing_reason:
            out[row.metric] = Missing(row.missing_reason)
            out[row.metric + "_sd"] = Missing(row.missing_reason)
        else:
            out[row.metric] = row.value
            out[row.metric + "_sd"] = _value(row.stddev, "no spread printed")
    return out
