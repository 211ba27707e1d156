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

HIGHER, LOWER = "higher", "lower"
# every metric, once: name -> (unit, which way is better; None where neither is: a condition or a count)
METRIC_DEFS: dict[str, tuple[str, str | None]] = {
    # llama-bench
    "prefill_tps": ("tok/s", HIGHER),
    "decode_tps": ("tok/s", HIGHER),
    "pg_tps": ("tok/s", HIGHER),
    "test_seconds": ("s", LOWER),
    # sustained speed (a generation run of duration_s): per slice of the run, the first burst_s, the last quarter
    "window_tps": ("tok/s", HIGHER),
    "burst_tps": ("tok/s", HIGHER),
    "sustained_tps": ("tok/s", HIGHER),
    "stability": ("1", HIGHER),  # sustained ÷ burst
    "time_to_throttle": ("s", HIGHER),
    "sustained_seconds": ("s", None),
    # perplexity / KLD
    "ppl": ("1", LOWER),
    "ppl_base": ("1", None),
    "ppl_ratio": ("1", LOWER),
    "ln_ppl_ratio": ("1", LOWER),
    "kld_mean": ("nat", LOWER),
    "kld_median": ("nat", LOWER),
    "kld_p99": ("nat", LOWER),
    "kld_p90": ("nat", LOWER),
    "kld_max": ("nat", LOWER),
    "same_top_p": ("1", HIGHER),
    "rms_dp": ("1", LOWER),
    # process
    "peak_rss": ("B", LOWER),
    "wall_seconds": ("s", LOWER),
    # thermal / frequency
    "temp_start": ("degC", None),
    "temp_end": ("degC", None),
    "temp_max": ("degC", LOWER),
    "cpu_freq_mean": ("Hz", None),
    "cpu_freq_min": ("Hz", None),
    # power / energy
    "power_mean": ("W", LOWER),
    "energy": ("J", LOWER),
    "energy_per_token": ("J/tok", LOWER),
    "wh_per_prompt": ("Wh", LOWER),
    "battery_drop": ("1", LOWER),  # share of a full charge used over the cell (iOS: the level's 1 % steps)
    "cooldown_wait": ("s", None),
    "temp_baseline": ("degC", None),
    # once-per-cell snapshots (dumpsys, ioreg, pmset), phase = snapshot_start / snapshot_end
    "battery_level": ("1", None),
    "battery_voltage": ("V", None),
    "battery_current": ("A", None),
    "battery_power": ("W", LOWER),
    "battery_temp": ("degC", None),
    "charge_counter": ("C", None),
    "thermal_status": ("1", LOWER),
    "cpu_speed_limit": ("1", HIGHER),
    "screen_on": ("1", None),
    # roofline payload (device_payloads/membw.c) and parallel streams (llama-batched-bench)
    "mem_bandwidth": ("B/s", HIGHER),
    "peak_flops": ("FLOP/s", HIGHER),
    "aggregate_tps": ("tok/s", HIGHER),
    "aggregate_decode_tps": ("tok/s", HIGHER),
    # host/device logit check (same file on the device and on the host)
    "devhost_kld_mean": ("nat", LOWER),
    "devhost_same_top_p": ("1", HIGHER),
    # task evals; llama-server's own token counters over an lm-eval run (server-generate)
    "accuracy": ("1", HIGHER),
    "tokens_prompt": ("tok", None),
    "tokens_generated": ("tok", None),
    "eval_gen_tps": ("tok/s", HIGHER),
    # GPU telemetry (sampler: kgsl, devfreq, Tegra load, GPU rails; nvidia-smi beside the payload)
    "gpu_power_mean": ("W", LOWER),
    "gpu_energy": ("J", LOWER),
    "gpu_mem_peak": ("B", LOWER),
    "gpu_busy_mean": ("1", None),
    "gpu_temp_max": ("degC", LOWER),
    "gpu_freq_mean": ("Hz", None),
}
METRICS: dict[str, str] = {k: unit for k, (unit, _) in METRIC_DEFS.items()}  # name -> unit
BETTER: dict[str, str | None] = {k: b for k, (_, b) in METRIC_DEFS.items()}  # name -> higher | lower | None
# phases of a timed prompt/generation test: their rows give the context a cell's memory was measured at
TOKEN_PHASES = ("prefill", "decode", "pg")


@dataclass(frozen=True)
class Column:
    """One column of the normalized row, declared once: the ledger's tables, the query layer's types, the numeric
    columns of `results`/`recommend`/`report` and the columns rows can be selected on all come from here."""

    name: str
    type: str  # text | int | real | bool | json (a JSON text)
    part: str  # where the ledger keeps it: cell (its cell's context), shape (what the row measured), own (the value)
    unit: str | None = None  # SI unit of the column itself ("value"'s is per metric: the `unit` column)
    fact: bool = False  # a big text stored once in the ledger's facts table
    match: bool = False  # rows may be selected on it in SQL (Selection.match, compare's --a/--b)
    affinity: str | None = None  # its SQLite type where ledger version 1 declared it otherwise than its type says


CELL, SHAPE, OWN = "cell", "shape", "own"
COLUMNS: tuple[Column, ...] = (
    Column("run_id", "text", CELL, match=True),
    Column("cell_id", "text", CELL, match=True),
    Column("recipe", "text", CELL, match=True),
    Column("device", "text", CELL, match=True),
    Column("target", "text", CELL, match=True),
    Column("model", "text", CELL, match=True),
    Column("quant", "text", CELL, match=True),
    Column("payload", "text", CELL, match=True),
    Column("test", "text", SHAPE),
    Column("threads", "int", SHAPE),
    Column("n_prompt", "int", SHAPE, "tok"),
    Column("n_gen", "int", SHAPE, "tok"),
    Column("n_depth", "int", SHAPE, "tok"),
    Column("ctx", "int", SHAPE, "tok"),
    Column("phase", "text", SHAPE),
    Column("cpu_mask", "text", CELL),
    Column("cpu_quota", "real", CELL, "CPU", affinity="TEXT"),
    Column("contention", "int", CELL),
    Column("n_parallel", "int", SHAPE),
    Column("eval_route", "text", CELL),
    Column("eval_engine", "text", CELL),
    Column("governor", "text", CELL),
    Column("backend", "text", CELL, match=True),
    Column("gpu_device", "text", SHAPE),
    Column("n_gpu_layers", "int", SHAPE),
    Column("flash_attn", "text", SHAPE),
    Column("metric", "text", SHAPE),
    Column("value", "real", OWN),
    Column("unit", "text", SHAPE),
    Column("stddev", "real", OWN),
    Column("n", "int", OWN),
    Column("samples", "json", OWN),
    Column("missing_reason", "text", SHAPE),
    Column("model_sha256", "text", CELL, match=True),
    Column("model_bytes", "int", CELL, "B"),
    Column("bpw", "real", CELL, "bit/weight"),
    Column("n_params", "int", CELL),
    Column("n_params_blocks", "int", CELL),
    Column("model_blocks_bytes", "int", CELL, "B"),
    Column("n_layer", "int", CELL),
    Column("n_vocab", "int", CELL),  # the vocabulary's tokens (predict's peak RSS: the runtime's tables of them)
    Column("kv_bytes_per_token", "int", CELL, "B/tok"),
    # sliding-window attention: the window (tokens) and the layers that slide, whose KV cache holds the window
    Column("n_swa", "int", CELL, "tok"),
    Column("swa_layers", "int", CELL),
    Column("tensor_types", "json", CELL, fact=True),
    Column("tensor_type_bytes", "json", CELL, fact=True),  # type -> bytes of its tensors (predict's decode)
    Column("blocks_type_params", "json", CELL, fact=True),  # type -> parameters of the blocks' matrices (prefill)
    Column("n_rows_blocks", "int", CELL),  # rows of the blocks' matrices (predict's prefill)
    Column("base_note", "text", CELL, fact=True),
    Column("model_source", "json", CELL, fact=True),
    Column("imatrix", "json", CELL, fact=True),
    Column("build_commit", "text", CELL, match=True),
    Column("build_flags", "json", CELL, fact=True),
    Column("build_key", "text", CELL, match=True),
    Column("device_facts", "json", CELL, fact=True),
    Column("device_mem_bytes", "int", CELL, "B"),
    Column("lab_host", "text", CELL, match=True),
    Column("ram_budget_bytes", "int", CELL, "B"),
    Column("ram_budget_source", "text", CELL, fact=True),
    Column("battery_wh", "real", CELL, "Wh"),
    Column("battery_source", "text", CELL, fact=True),
    Column("temp_start_c", "real", CELL, "degC"),
    Column("temp_end_c", "real", CELL, "degC"),
    Column("throttled", "bool", CELL),
    Column("energy_calibration", "json", CELL, fact=True),
    Column("host_activity", "json", CELL, fact=True),
    Column("host_busy_cpus", "real", CELL, "CPU"),
    # a recipe with `rounds:` measures each cell once a round, its device's cells in a seeded random order each round
    Column("round", "int", CELL, match=True),
    Column("round_position", "int", CELL),  # the cell's place in its device's round (1 = first)
    Column("round_seed", "int", CELL),
    Column("recorded_at", "text", CELL),
)
COLUMN: dict[str, Column] = {c.name: c for c in COLUMNS}
ROW_COLUMNS = [c.name for c in COLUMNS]


def columns(*, type: str | tuple[str, ...] | None = None, part: str | None = None, **flags: bool) -> tuple[str, ...]:
    """The names of the declared columns of `type` (one or several), `part`, and flags (fact=True, match=True)."""
    types = (type,) if isinstance(type, str) else type
    return tuple(
        c.name
        for c in COLUMNS
        if (types is None or c.type in types)
        and (part is None or c.part == part)
        and all(getattr(c, k) == v for k, v in flags.items())
    )


NUMERIC_COLUMNS = columns(type=("int", "real"))
JSON_CONTEXT = columns(type="json", part=CELL)  # what a cell hands a row as an object, stored as JSON text


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
    gpu_device: str | None = None  # the GPU device that did the work, as the tool named it
    n_gpu_layers: int | None = None
    flash_attn: str | None = None
    context: dict[str, Any] = field(default_factory=dict)  # cell-level columns filled by the executor

    def __post_init__(self) -> None:
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
        d: dict[str, Any] = {c: None for c in ROW_COLUMNS}
        d.update(self.context)
        base = asdict(self)
        base.pop("context")
        for k in ("gpu_device", "n_gpu_layers", "flash_attn"):  # the cell's, unless the row knows better
            if base[k] is None and self.context.get(k) is not None:
                base.pop(k)
        d.update(base)
        d["unit"] = self.unit
        d["samples"] = json.dumps(self.samples) if self.samples is not None else None
        for k in JSON_CONTEXT:
            if d.get(k) is not None and not isinstance(d[k], str):
                d[k] = json.dumps(d[k], sort_keys=True)
        d.setdefault("recorded_at", None)
        d["recorded_at"] = d["recorded_at"] or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return d


def missing(metric: str, reason: str, **kw: Any) -> Row:
    return Row(metric=metric, value=float("nan"), missing_reason=reason, **kw)
