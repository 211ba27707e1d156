"""nvidia-smi's CSV as people publish it, through the lab's own parser and normalization (the figures a cell's
GPU rows get): `nvidia-smi --query-gpu=… --format=csv[,noheader][,nounits]`, one GPU or several, looped or once.

Output printed with `noheader` has no line naming its columns: the capture then carries the command line that
printed it (as people paste it: `$ nvidia-smi --query-gpu=… --format=csv,noheader`), which names them, as the
lab's own query names its file's columns."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ..telemetry import normalize, sampler_csv
from ..telemetry.sources import nvidia_smi
from . import Missing, Unsupported, reader

_QUERY = re.compile(r"--query-gpu[= ]([\w.,]+)")
METRICS = ("gpu_power_mean", "gpu_energy", "gpu_mem_peak", "gpu_busy_mean", "gpu_temp_max", "gpu_freq_mean")


@reader(nvidia_smi.TOOL)
def nvidia_smi_csv(path: Path) -> dict[str, Any]:
    """gpus (distinct GPUs), rounds (sampling rounds), and the cell's GPU figures in SI units: gpu_power_mean (W,
    all GPUs of a round summed), gpu_energy (J), gpu_mem_peak (B, summed), gpu_busy_mean (0–1), gpu_temp_max
    (°C), gpu_freq_mean (Hz); a figure nvidia-smi does not give is missing with why."""
    text = path.read_text(errors="replace")
    q = _QUERY.search(text)
    samples = nvidia_smi.parse(text, q[1].split(",") if q else None)
    if not samples:
        raise Unsupported(
            f"no {nvidia_smi.TOOL} CSV rows: neither a header line nor the --query-gpu command names the columns"
        )
    empty = sampler_csv.parse("tick,t_s\n")
    rows = {r.metric: r for r in normalize.gpu_rows(empty, {nvidia_smi.SOURCE.name: samples})}
    out: dict[str, Any] = {
        "gpus": len({s["gpu_id"] for s in samples}),
        "rounds": len({s["round"] for s in samples}),
    }
    for m in METRICS:
        r = rows[m]
        out[m] = Missing(r.missing_reason or "no value") if math.isnan(r.value) else r.value
    return out
