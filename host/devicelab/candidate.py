"""A recommendation's candidate — one (device, model, quant, backend) — and how it is measured from the rows:
`Figures.of` finds every candidate's figures in one grouped pass over the rows per figure (so measuring costs what
the rows do, not rows × candidates), `measure` makes one candidate of them. Judging and choosing are recommend.py's."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .models.gguf_info import kv_cells, kv_scale
from .recipes import RecommendSpec
from .schema import TOKEN_PHASES

DEFAULT_OVERHEAD = 64 * 1024**2  # used only when no peak RSS was measured for the model (and said so)
FLOAT_QUANTS = ("f32", "bf16", "f16")  # a model's unquantized files: the base of the relative quality bar


@dataclass(kw_only=True)
class Candidate:
    """One (device, model, quant, backend): what was measured of it (`measure`), then the reasons it lost
    (`judge`: empty, it passes)."""

    device: str
    model: str
    quant: str
    model_bytes: int
    bpw: float
    kv_bytes: int | None
    overhead_bytes: int | None
    overhead_measured: bool
    ram_need: int  # weights + KV at the recipe's context + the runtime overhead (measured, else the default)
    ram_budget: int | None
    decode_tps: float | None
    decode_threads: int | None
    prefill_tps: float | None
    kld_mean: float | None
    ppl_ratio: float | None
    energy_per_token: float | None
    accuracy: float | None = None
    devhost_kld: float | None = None
    ram_budget_source: str | None = None
    backend: str = ""  # the llama.cpp backend it ran on ("" = not recorded)
    multi_backend: bool = False  # its device was measured on several backends
    task_accuracy: dict = field(default_factory=dict)  # task -> accuracy (mean over its routes)
    base_accuracy: dict = field(default_factory=dict)  # task -> the unquantized base's, same device
    wh_per_prompt: float | None = None
    prompt_shape: str | None = None  # "pp512+tg128": the prompt wh_per_prompt is for
    battery_per_1000: float | None = None  # share of a full battery per 1,000 such prompts
    energy_source: str | None = None  # the power source and calibration, the capacity
    failures: list[str] = field(default_factory=list)
    verdict: str = ""
    on_frontier: bool = False

    @property
    def passes(self) -> bool:
        return not self.failures

    @property
    def label(self) -> str:
        return f"{self.model} {self.quant}" + (f" ({self.backend})" if self.multi_backend else "")


def num(x):
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def kv_at(per_token, n_ctx: float, n_layer=None, n_swa=None, swa_layers=None) -> float:
    """KV bytes at n_ctx of a model whose layers hold `per_token` bytes a token between them (a row's
    kv_bytes_per_token), its sliding layers at most their window's cells where the row knows them
    (gguf_info.kv_cells)."""
    layers, window, slide = num(n_layer), num(n_swa), num(swa_layers)
    if not layers or not window or not slide:
        return float(per_token) * float(n_ctx)
    return float(per_token) / layers * kv_cells(int(n_ctx), int(layers), int(window), int(slide))


# ---------------------------------------------------------------- measuring: every candidate's figures from its rows
# Each figure is found for every candidate at once (one grouped pass over the frame per figure), so measuring costs
# what the rows do, not rows × candidates.

Key = tuple[str, str, str, str]  # device, model, quant, backend
KEY = ["device", "model", "quant", "_backend"]
# what a candidate is measured from: the recommendation reads no other column
READ = (
    "device",
    "model",
    "quant",
    "backend",
    "cell_id",
    "metric",
    "value",
    "phase",
    "test",
    "threads",
    "n_prompt",
    "n_gen",
    "n_depth",
    "model_bytes",
    "bpw",
    "kv_bytes_per_token",
    "n_layer",
    "n_swa",
    "swa_layers",
    "ram_budget_bytes",
    "ram_budget_source",
    "device_mem_bytes",
    "battery_wh",
    "battery_source",
    "energy_calibration",
)
FIRST: tuple[str, ...] = ("model_bytes", "bpw", "kv_bytes_per_token", "ram_budget_bytes", "ram_budget_source")
FIRST += ("device_mem_bytes", "battery_wh", "battery_source", "n_layer", "n_swa", "swa_layers")
# (figure, metric, max or min, phase): the best value of each over a candidate's rows (the first of equals)
BEST = (
    ("decode_tps", "decode_tps", "max", None),
    ("prefill_tps", "prefill_tps", "max", None),
    ("kld_mean", "kld_mean", "max", None),
    ("ppl_ratio", "ppl_ratio", "max", None),
    ("devhost_kld", "devhost_kld_mean", "max", None),
    ("energy_per_token", "energy_per_token", "min", "decode"),
)


# the decode speed a recommendation holds to min_decode_tps: a bench's (burst: a short run on a cool chip) or a
# sustained run's last quarter (recommend.speed: sustained)
SPEED_METRIC = {"burst": "decode_tps", "sustained": "sustained_tps"}


def _keys(df: pd.DataFrame) -> list[Key]:
    return list(zip(*(df[c] for c in KEY), strict=True))


def _by_key(s: pd.Series) -> dict:
    """A grouped figure (indexed by KEY, perhaps a level more) as {key tuple: value}."""
    return dict(zip(s.index, s.to_numpy(), strict=True))


def _best(rows: pd.DataFrame, metric: str, how: str, phase: str | None) -> dict[Key, tuple[float, object]]:
    """Per candidate: the largest (smallest) value of a metric and that row's threads."""
    d = rows[(rows["metric"] == metric) & rows["value"].notna()]
    if phase:
        d = d[d["phase"] == phase]
    if d.empty:
        return {}
    g = d.groupby(KEY, sort=False)["value"]
    at = g.idxmax() if how == "max" else g.idxmin()
    values, threads = d["value"].loc[at.to_numpy()].to_numpy(), d["threads"].loc[at.to_numpy()].to_numpy()
    return {k: (float(v), t) for k, v, t in zip(at.index, values, threads, strict=True)}


def _overheads(rows: pd.DataFrame, first: dict) -> dict[Key, int]:
    """Runtime overhead from the cells that ran prompts/generations (their token counts give the context): peak
    RSS − weights − KV at that context; the largest over a candidate's cells, none where no peak RSS was
    measured."""
    cell = [*KEY, "cell_id"]
    timed = rows["phase"].isin(TOKEN_PHASES).groupby([rows[c] for c in cell], sort=False).any()
    nctx = (rows["n_prompt"].fillna(0) + rows["n_gen"].fillna(0) + rows["n_depth"].fillna(0)).astype(float)
    nctx = nctx.groupby([rows[c] for c in cell], sort=False).max()
    rss = rows["value"].where((rows["metric"] == "peak_rss") & rows["value"].notna())
    rss = rss.groupby([rows[c] for c in cell], sort=False).max()
    out: dict[Key, float] = {}
    for (*key, _), t, n, r in zip(timed.index, timed.to_numpy(), nctx.to_numpy(), rss.to_numpy(), strict=True):
        if not t or math.isnan(r):
            continue
        f = first[tuple(key)]
        kv = kv_at(num(f["kv_bytes_per_token"]) or 0, float(n), f["n_layer"], f["n_swa"], f["swa_layers"])
        o = max(0.0, float(r) - int(f["model_bytes"]) - kv)
        out[tuple(key)] = max(out.get(tuple(key), o), o)
    return {k: int(v) for k, v in out.items()}


def _calibration(v) -> dict | None:
    try:
        return json.loads(v) if isinstance(v, str) else dict(v)
    except (TypeError, ValueError):
        return None


def _energies(rows: pd.DataFrame, first: dict, best: dict, spec: RecommendSpec) -> dict[Key, dict]:
    """Energy of one prompt of the recipe's shape per candidate: prompt tokens × prefill J/token + generated
    tokens × decode J/token (the median over its cells at its decode threads), in Wh; and its share of the
    device's full battery per 1,000 prompts. Where the figures came from, in words."""
    e = rows[(rows["metric"] == "energy_per_token") & rows["value"].notna()]
    pw = rows[(rows["metric"] == "power_mean") & (rows["phase"] == "cell") & rows["value"].notna()]
    if e.empty and pw.empty:
        return {}
    threads = {k: int(t) for k, (_, t) in best["decode_tps"].items() if pd.notna(t)}
    at = [threads.get(k) for k in _keys(e)]
    same = pd.Series(
        [t is not None and pd.notna(x) and x == t for x, t in zip(e["threads"], at, strict=True)],
        index=e.index,
        dtype=bool,
    )
    some = same.groupby([e[c] for c in KEY], sort=False).transform("any") if len(e) else same
    e = e[~some | same]  # at the decode threads where the candidate has energy rows there, else every one
    per_phase = _by_key(e.groupby([*KEY, "phase"], sort=False)["value"].median())
    power = _by_key(pw.groupby(KEY, sort=False)["value"].median())
    tokens = {
        phase: _by_key(pd.to_numeric(r[col]).groupby([r[c] for c in KEY], sort=False).max())
        for phase, col in (("prefill", "n_prompt"), ("decode", "n_gen"))
        for r in [rows[rows["phase"] == phase]]
    }
    cal_rows = rows[rows["metric"].isin(["energy_per_token", "power_mean"]) & rows["energy_calibration"].notna()]
    cals: dict[Key, dict] = {}
    for k, v in zip(_keys(cal_rows), cal_rows["energy_calibration"], strict=True):
        if k not in cals and (c := _calibration(v)) is not None:
            cals[k] = c
    out: dict[Key, dict[str, Any]] = {}
    for k in dict.fromkeys([*_keys(e), *_keys(pw)]):
        notes: list[str] = []

        def per_token(phase: str, speed: str, k=k, notes=notes) -> float | None:
            """J/token of a phase; a phase shorter than one sample has none: then the mean power of the cells
            over the phase's measured speed."""
            if (k + (phase,)) in per_phase:
                return float(per_phase[k + (phase,)])
            tps = best[speed].get(k, (None,))[0]
            if k not in power or not tps:
                return None
            notes.append(f"{phase} from the cells' mean power over {phase} t/s (a phase shorter than one sample)")
            return float(power[k]) / tps

        pre, dec = per_token("prefill", "prefill_tps"), per_token("decode", "decode_tps")
        n_p = spec.prompt_tokens or num(tokens["prefill"].get(k))
        n_g = spec.gen_tokens or num(tokens["decode"].get(k))
        if pre is None or dec is None or not n_p or not n_g:
            continue
        n_p, n_g = int(n_p), int(n_g)
        wh = (n_p * pre + n_g * dec) / 3600
        how = ", ".join(
            f"{a} {b}"
            for a, b in cals.get(k, {}).items()
            if a in ("source", "current_unit", "current_sign", "energy_from", "calibrated_by")
        )
        out[k] = {
            "wh_per_prompt": wh,
            "prompt_shape": f"pp{n_p}+tg{n_g}",
            "energy_source": "; ".join([how or "power source unnamed", *notes]),
        }
        cap = num(first[k]["battery_wh"])
        if cap:
            out[k]["battery_per_1000"] = 1000 * wh / cap
            out[k]["energy_source"] += f"; battery {cap:.1f} Wh ({first[k]['battery_source']})"
    return out


def _accuracies(rows: pd.DataFrame, keys: list[Key]) -> dict[Key, dict[str, float]]:
    """Each candidate's accuracy per task (one `test` each; the mean over the routes that ran it)."""
    d = rows[(rows["metric"] == "accuracy") & rows["value"].notna()]
    out: dict[Key, dict[str, float]] = {k: {} for k in keys}
    for (*k, t), v in _by_key(d.groupby([*KEY, "test"])["value"].mean()).items():
        out[tuple(k)][str(t)] = float(v)
    return out


@dataclass
class Figures:
    """What every candidate's rows hold: its first row's facts, the best of each metric, the runtime overhead, the
    energy per prompt and the task accuracies — each found for all candidates at once."""

    keys: list[Key]
    first: dict[Key, dict]
    best: dict[str, dict[Key, tuple[float, Any]]]  # metric -> candidate -> (best value, its threads)
    overhead: dict[Key, int]
    energy: dict[Key, dict]
    accs: dict[Key, dict[str, float]]

    @classmethod
    def of(cls, rows: pd.DataFrame, spec: RecommendSpec) -> Figures:
        from .compare import over_rounds

        rows = over_rounds(rows)  # a figure measured in rounds: the mean of its rounds, not its luckiest
        rows = rows[[c for c in READ if c in rows.columns]]
        rows = rows.assign(**{c: None for c in READ if c not in rows.columns})
        rows = rows.assign(_backend=rows["backend"].fillna(""))
        rows = rows.dropna(subset=["device", "model", "quant"]).reset_index(drop=True)  # as a groupby drops them
        heads = rows.drop_duplicates(KEY)
        facts = zip(*(heads[c] for c in FIRST), strict=True)
        first = {k: dict(zip(FIRST, v, strict=True)) for k, v in zip(_keys(heads), facts, strict=True)}
        metrics = {name: SPEED_METRIC[spec.speed] if name == "decode_tps" else m for name, m, _, _ in BEST}
        best = {name: _best(rows, metrics[name], how, phase) for name, _, how, phase in BEST}
        keys = list(first)
        return cls(
            keys, first, best, _overheads(rows, first), _energies(rows, first, best, spec), _accuracies(rows, keys)
        )


def mib(b) -> str:
    return f"{b / 1024**2:.0f} MiB"


def _ram_budget(first: dict, spec: RecommendSpec) -> tuple[int | None, str | None]:
    """The device's memory budget as its rows recorded it, and where it came from."""
    budget, source = num(first["ram_budget_bytes"]), first["ram_budget_source"]
    if budget is None:  # rows recorded before devices reported their own budget
        raw = num(first["device_mem_bytes"])
        budget = raw * spec.ram_fraction if raw else None
        source = f"{spec.ram_fraction:.0%} of the device's RAM (rows recorded before memory budgets)"
    return (int(budget) if budget is not None else None), source


def _base_accuracy(key: Key, accs: dict) -> dict:
    """The model's unquantized base's accuracy per task, same device and backend."""
    device, model, _, backend = key
    return next(
        (
            accs[(device, model, q, backend)]
            for q in FLOAT_QUANTS
            if (device, model, q, backend) in accs and accs[(device, model, q, backend)]
        ),
        {},
    )


def measure(key: Key, f: Figures, spec: RecommendSpec, task: str | None = None) -> Candidate:
    """A candidate's needs and measured figures. With `task`, its accuracy is that task's alone."""
    device, model, quant, backend = key
    first = f.first[key]
    mbytes = int(first["model_bytes"])
    kvpt = num(first["kv_bytes_per_token"])
    # kv_bytes_per_token is for F16 (2 bytes per element); quantized KV scales by ggml's block sizes; sliding layers
    # hold their window
    swa = (first["n_layer"], first["n_swa"], first["swa_layers"])
    kv = int(kv_at(kvpt, spec.context, *swa) * kv_scale(spec.kv_cache_type)) if kvpt else None
    overhead = f.overhead.get(key)
    budget, bsource = _ram_budget(first, spec)
    best = {name: f.best[name].get(key, (None, None)) for name in f.best}
    dec, threads = best["decode_tps"]
    tacc = f.accs[key]
    if task is not None:
        tacc = {task: tacc[task]} if task in tacc else {}
    return Candidate(
        device=device,
        model=model,
        quant=quant,
        model_bytes=mbytes,
        bpw=float(first["bpw"]),
        kv_bytes=kv,
        overhead_bytes=overhead,
        overhead_measured=overhead is not None,
        ram_need=mbytes + (kv or 0) + (overhead if overhead is not None else DEFAULT_OVERHEAD),
        ram_budget=budget,
        decode_tps=dec,
        decode_threads=int(threads) if dec is not None and pd.notna(threads) else None,
        prefill_tps=best["prefill_tps"][0],
        kld_mean=best["kld_mean"][0],
        ppl_ratio=best["ppl_ratio"][0],
        energy_per_token=best["energy_per_token"][0],
        accuracy=sum(tacc.values()) / len(tacc) if tacc else None,
        devhost_kld=best["devhost_kld"][0],
        ram_budget_source=bsource,
        backend=backend,
        task_accuracy=tacc,
        base_accuracy=_base_accuracy(key, f.accs),
        verdict="" if overhead is not None else f"runtime overhead not measured: assumed {mib(DEFAULT_OVERHEAD)}",
        **f.energy.get(key, {}),
    )
