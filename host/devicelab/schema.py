"""The normalized row: the one vocabulary every room speaks, for desktop and device runs alike.

Long form: one row per (cell, test, metric). Units are SI (or SI-derived: tokens/s, °C) and fixed per
metric, so a value never needs its unit guessed. A value that could not be measured is NaN with a
`missing_reason`, never 0. Power and current use one sign convention: positive = drawn from the
source (battery discharging / wall power consumed)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# metric name -> unit
METRICS: dict[str, str] = {
    # llama-bench
    "prefill_tps": "tok/s", "decode_tps": "tok/s", "pg_tps": "tok/s",
    "test_seconds": "s",
    # perplexity / KLD
    "ppl": "1", "ppl_base": "1", "ppl_ratio": "1", "ln_ppl_ratio": "1",
    "kld_mean": "nat", "kld_median": "nat", "kld_p99": "nat", "kld_p90": "nat", "kld_max": "nat",
    "same_top_p": "1", "rms_dp": "1",
    # process
    "peak_rss": "B", "wall_seconds": "s",
    # thermal / frequency
    "temp_start": "degC", "temp_end": "degC", "temp_max": "degC",
    "cpu_freq_mean": "Hz", "cpu_freq_min": "Hz",
    # power / energy
    "power_mean": "W", "energy": "J", "energy_per_token": "J/tok", "wh_per_prompt": "Wh",
    "cooldown_wait": "s", "temp_baseline": "degC",
    # once-per-cell snapshots (dumpsys, ioreg, pmset), phase = snapshot_start / snapshot_end
    "battery_level": "1", "battery_voltage": "V", "battery_current": "A", "battery_power": "W",
    "battery_temp": "degC", "charge_counter": "C", "thermal_status": "1", "cpu_speed_limit": "1",
    "screen_on": "1",
    # roofline payload (device_payloads/membw.c) and parallel streams (llama-batched-bench)
    "mem_bandwidth": "B/s", "peak_flops": "FLOP/s", "aggregate_tps": "tok/s", "aggregate_decode_tps": "tok/s",
    # host/device logit check (same file on the device and on the host)
    "devhost_kld_mean": "nat", "devhost_same_top_p": "1",
    # task evals; llama-server's own token counters over an lm-eval run (server-generate)
    "accuracy": "1", "tokens_prompt": "tok", "tokens_generated": "tok", "eval_gen_tps": "tok/s",
}

ROW_COLUMNS = [
    "run_id", "cell_id", "recipe", "device", "target", "model", "quant", "payload", "test",
    "threads", "n_prompt", "n_gen", "n_depth", "ctx", "phase", "cpu_mask", "cpu_quota", "contention", "n_parallel",
    "eval_route", "eval_engine", "governor",
    "metric", "value", "unit", "stddev", "n", "samples", "missing_reason",
    "model_sha256", "model_bytes", "bpw", "n_params", "kv_bytes_per_token", "tensor_types", "base_note",
    "build_commit", "build_flags", "build_key", "device_facts", "device_mem_bytes",
    "temp_start_c", "temp_end_c", "throttled", "energy_calibration", "recorded_at",
]


@dataclass
class Row:
    metric: str
    value: float
    test: str = ""
    phase: str = ""
    stddev: float | None = None
    n: int | None = None
    samples: list | None = None
    missing_reason: str | None = None
    threads: int | None = None
    n_prompt: int | None = None
    n_gen: int | None = None
    n_depth: int | None = None
    ctx: int | None = None
    n_parallel: int | None = None
    context: dict[str, Any] = field(default_factory=dict)   # cell-level columns filled by the executor

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}")
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            self.value = float("nan")
            if not self.missing_reason:
                raise ValueError(f"{self.metric}: a missing value needs a missing_reason")

    @property
    def unit(self) -> str:
        return METRICS[self.metric]

    def record(self) -> dict:
        d = {c: None for c in ROW_COLUMNS}
        d.update(self.context)
        base = asdict(self)
        base.pop("context")
        d.update(base)
        d["unit"] = self.unit
        d["samples"] = json.dumps(self.samples) if self.samples is not None else None
        for k in ("tensor_types", "build_flags", "device_facts", "energy_calibration"):
            if d.get(k) is not None and not isinstance(d[k], str):
                d[k] = json.dumps(d[k], sort_keys=True)
        d.setdefault("recorded_at", None)
        d["recorded_at"] = d["recorded_at"] or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return d


def missing(metric: str, reason: str, **kw) -> Row:
    return Row(metric=metric, value=float("nan"), missing_reason=reason, **kw)
