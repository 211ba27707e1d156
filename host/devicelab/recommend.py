"""Recommendation per device: the quant that fits RAM (weights + KV cache at the recipe's context +
measured runtime overhead), meets the quality bar, the speed target and the energy budget — with the
reason every other candidate lost. Works from the ledger or from an exported table alone.

A candidate is first measured (`Figures.of` finds every candidate's figures in one grouped pass over the rows per
figure, `measure` makes one candidate of them), then judged (`judge`: CHECKS, one small function per constraint,
each returning the reasons it lost). What the CLI and the report show of the result is
made once, in tables.recommendation_views."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise

import pandas as pd

from . import budget as budgetmod
from .models.gguf_info import kv_scale
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
    ram_need: int | None
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


@dataclass(kw_only=True)
class DeviceRecommendation:
    device: str
    pick: Candidate | None
    candidates: list[Candidate]
    spec: dict
    quality_axis: str = "kld_mean"
    knees: dict = field(default_factory=dict)  # model -> {"bpw": …, "from": quant, "to": quant, "jump": ×}
    per_task: dict = field(default_factory=dict)  # task -> {"pick", "accuracy", "base_accuracy", "candidates"}
    min_ram: list = field(default_factory=list)  # per model and quant: the smallest phone and laptop it fits
    backends: list = field(default_factory=list)  # per model and quant measured on several backends: who won, why
    # no quality measured on this device (bench only): the picks on what was measured ("fastest", "smallest" ->
    # the candidate), each within the RAM budget and the speed target
    unjudged: dict = field(default_factory=dict)

    @property
    def frontier(self) -> list[Candidate]:
        return [c for c in self.candidates if c.on_frontier]

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "pick": asdict(self.pick) if self.pick else None,
            "candidates": [asdict(c) for c in self.candidates],
            "constraints": self.spec,
            "quality_axis": self.quality_axis,
            "frontier": [c.label for c in self.frontier],
            "bpw_knee": self.knees,
            "per_task": self.per_task,
            "min_ram": self.min_ram,
            "backends": self.backends,
            "no_quality_measured": {k: c.label for k, c in self.unjudged.items()} or None,
        }


def _num(x):
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


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
    "ram_budget_bytes",
    "ram_budget_source",
    "device_mem_bytes",
    "battery_wh",
    "battery_source",
    "energy_calibration",
)
FIRST = ("model_bytes", "bpw", "kv_bytes_per_token", "ram_budget_bytes", "ram_budget_source", "device_mem_bytes")
FIRST += ("battery_wh", "battery_source")
# (figure, metric, max or min, phase): the best value of each over a candidate's rows (the first of equals)
BEST = (
    ("decode_tps", "decode_tps", "max", None),
    ("prefill_tps", "prefill_tps", "max", None),
    ("kld_mean", "kld_mean", "max", None),
    ("ppl_ratio", "ppl_ratio", "max", None),
    ("devhost_kld", "devhost_kld_mean", "max", None),
    ("energy_per_token", "energy_per_token", "min", "decode"),
)


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
        o = max(0.0, float(r) - int(f["model_bytes"]) - (_num(f["kv_bytes_per_token"]) or 0) * float(n))
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
    same = [t is not None and pd.notna(x) and x == t for x, t in zip(e["threads"], at, strict=True)]
    same = pd.Series(same, index=e.index, dtype=bool)
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
    out = {}
    for k in dict.fromkeys([*_keys(e), *_keys(pw)]):
        notes = []

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
        n_p = spec.prompt_tokens or _num(tokens["prefill"].get(k))
        n_g = spec.gen_tokens or _num(tokens["decode"].get(k))
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
        cap = _num(first[k]["battery_wh"])
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
    best: dict[str, dict[Key, tuple[float, object]]]
    overhead: dict[Key, int]
    energy: dict[Key, dict]
    accs: dict[Key, dict[str, float]]

    @classmethod
    def of(cls, rows: pd.DataFrame, spec: RecommendSpec) -> Figures:
        rows = rows[[c for c in READ if c in rows.columns]]
        rows = rows.assign(**{c: None for c in READ if c not in rows.columns})
        rows = rows.assign(_backend=rows["backend"].fillna(""))
        rows = rows.dropna(subset=["device", "model", "quant"]).reset_index(drop=True)  # as a groupby drops them
        heads = rows.drop_duplicates(KEY)
        facts = zip(*(heads[c] for c in FIRST), strict=True)
        first = {k: dict(zip(FIRST, v, strict=True)) for k, v in zip(_keys(heads), facts, strict=True)}
        best = {name: _best(rows, metric, how, phase) for name, metric, how, phase in BEST}
        keys = list(first)
        return cls(
            keys, first, best, _overheads(rows, first), _energies(rows, first, best, spec), _accuracies(rows, keys)
        )


def _mib(b) -> str:
    return f"{b / 1024**2:.0f} MiB"


def _ram_budget(first: dict, spec: RecommendSpec) -> tuple[int | None, str | None]:
    """The device's memory budget as its rows recorded it, and where it came from."""
    budget, source = _num(first["ram_budget_bytes"]), first["ram_budget_source"]
    if budget is None:  # rows recorded before devices reported their own budget
        raw = _num(first["device_mem_bytes"])
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
    kvpt = _num(first["kv_bytes_per_token"])
    # kv_bytes_per_token is for F16 (2 bytes per element); quantized KV scales by ggml's block sizes
    kv = int(kvpt * spec.context * kv_scale(spec.kv_cache_type)) if kvpt else None
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
        verdict="" if overhead is not None else f"runtime overhead not measured: assumed {_mib(DEFAULT_OVERHEAD)}",
        **f.energy.get(key, {}),
    )


# ---------------------------------------------------------------- judging: the constraints, one check each
# A check takes the candidate, the recipe's constraints and the tasks it is judged on, and returns the reasons
# it lost (none: it passes that check). CHECKS runs them in the order their reasons are listed.


def fits_ram(c: Candidate, spec: RecommendSpec, tasks) -> list[str]:
    if c.ram_budget is None:
        return ["device RAM unknown: set ram_budget_bytes in the lab file"]
    if c.ram_need <= c.ram_budget:
        return []
    runtime = c.overhead_bytes if c.overhead_bytes is not None else DEFAULT_OVERHEAD
    return [
        f"needs {_mib(c.ram_need)} (weights {_mib(c.model_bytes)} + {spec.kv_cache_type} KV@{spec.context} "
        f"{_mib(c.kv_bytes or 0)} + runtime {_mib(runtime)}) > budget {_mib(c.ram_budget)} "
        f"({c.ram_budget_source})"
    ]


NO_KLD = "no KLD measured"


def kld_bar(c: Candidate, spec: RecommendSpec, tasks) -> list[str]:
    if c.kld_mean is None:
        return [NO_KLD]
    return [f"mean KLD {c.kld_mean:.4f} > {spec.max_kld_mean}"] if c.kld_mean > spec.max_kld_mean else []


def ppl_bar(c: Candidate, spec: RecommendSpec, tasks) -> list[str]:
    if c.ppl_ratio is not None and c.ppl_ratio > spec.max_ppl_ratio:
        return [f"PPL ratio {c.ppl_ratio:.4f} > {spec.max_ppl_ratio}"]
    return []


def speed_target(c: Candidate, spec: RecommendSpec, tasks) -> list[str]:
    if c.decode_tps is None:
        return ["no decode speed measured"]
    return [f"decode {c.decode_tps:.1f} tok/s < {spec.min_decode_tps}"] if c.decode_tps < spec.min_decode_tps else []


def same_as_host(c: Candidate, spec: RecommendSpec, tasks) -> list[str]:
    if c.devhost_kld is not None and c.devhost_kld > spec.max_devhost_kld:
        return [
            f"the device's logits differ from the host's for this very file (KLD {c.devhost_kld:.4f} > "
            f"{spec.max_devhost_kld}): a backend bug or a silent fallback on the device"
        ]
    return []


def accuracy_bar(c: Candidate, spec: RecommendSpec, tasks) -> list[str]:
    """The absolute bar, on the mean over the tasks (one task's, for a per-task pick)."""
    if spec.min_accuracy is None:
        return []
    if c.accuracy is None:
        return ["no task accuracy measured"]
    return [f"accuracy {c.accuracy:.1%} < {spec.min_accuracy:.1%}"] if c.accuracy < spec.min_accuracy else []


def accuracy_drop(c: Candidate, spec: RecommendSpec, tasks) -> list[str]:
    """The relative bar, task by task: at most max_accuracy_drop points below the model's unquantized base."""
    if spec.max_accuracy_drop is None or c.quant in FLOAT_QUANTS:
        return []
    out = []
    for task in tasks:
        acc, base = c.task_accuracy.get(task), c.base_accuracy.get(task)
        if acc is None:
            out.append(f"not judged on {task}: no accuracy measured for this quant")
        elif base is None:
            out.append(
                f"not judged on {task}: the unquantized base ({'/'.join(FLOAT_QUANTS)}) was never "
                "measured on this task on this device: add f16 to the recipe's quants"
            )
        elif (base - acc) * 100 > spec.max_accuracy_drop:
            out.append(
                f"{task}: accuracy {acc:.1%} is {(base - acc) * 100:.1f} points below the base's "
                f"{base:.1%} (> {spec.max_accuracy_drop:g})"
            )
    return out


def energy_budget(c: Candidate, spec: RecommendSpec, tasks) -> list[str]:
    if spec.max_energy_per_token is None:
        return []
    if c.energy_per_token is None:
        return ["energy per token not measurable on this device (no power source)"]
    if c.energy_per_token > spec.max_energy_per_token:
        return [f"decode energy {c.energy_per_token:.4g} J/tok > {spec.max_energy_per_token}"]
    return []


Check = Callable[[Candidate, RecommendSpec, Sequence[str]], list[str]]
CHECKS: tuple[Check, ...] = (
    fits_ram,
    kld_bar,
    ppl_bar,
    speed_target,
    same_as_host,
    accuracy_bar,
    accuracy_drop,
    energy_budget,
)


def judge(c: Candidate, spec: RecommendSpec, tasks: Sequence[str], checks: Sequence[Check] = CHECKS) -> list[str]:
    """Every reason the candidate lost, check by check (empty: it passes)."""
    return [reason for check in checks for reason in check(c, spec, tasks)]


def candidates(rows: pd.DataFrame, spec: RecommendSpec, task: str | None = None) -> list[Candidate]:
    """Every (device, model, quant, backend) measured, then judged. With `task`, its accuracy is that task's
    alone and only that task's bars apply (a per-task pick)."""
    rows = rows[rows["model_bytes"].notna()]  # device-level rows (membw) are not candidates
    if rows.empty:
        return []
    f = Figures.of(rows, spec)
    tasks: dict[tuple, set] = {}  # (device, model, backend) -> every task measured there
    for (d, m, _, b), a in f.accs.items():
        tasks.setdefault((d, m, b), set()).update(a)
    out = []
    for key in f.keys:
        c = measure(key, f, spec, task)
        c.failures = judge(c, spec, [task] if task is not None else sorted(tasks[key[0], key[1], key[3]]))
        out.append(c)
    return out


def _rank_key(prefer: str, axis: str = "kld_mean"):
    if prefer == "fastest":
        return lambda c: (-(c.decode_tps or 0), c.model_bytes)
    if prefer == "best_quality" and axis == "accuracy":
        return lambda c: (-(c.accuracy or 0), c.kld_mean if c.kld_mean is not None else math.inf, c.model_bytes)
    if prefer == "best_quality":
        return lambda c: (c.kld_mean if c.kld_mean is not None else math.inf, c.model_bytes)
    return lambda c: (c.model_bytes, c.kld_mean if c.kld_mean is not None else math.inf)


def _objectives(c: Candidate, axis: str) -> tuple:
    """Smaller is better on every objective (missing energy is neutral)."""
    q = -(c.accuracy or 0.0) if axis == "accuracy" else (c.kld_mean if c.kld_mean is not None else math.inf)
    e = c.energy_per_token if c.energy_per_token is not None else 0.0
    return (q, c.model_bytes, -(c.decode_tps or 0.0), e)


def dominates(a: Candidate, b: Candidate, axis: str) -> bool:
    oa, ob = _objectives(a, axis), _objectives(b, axis)
    return all(x <= y for x, y in zip(oa, ob, strict=True)) and any(x < y for x, y in zip(oa, ob, strict=True))


def knee(cs: list[Candidate]) -> dict | None:
    """The bits-per-weight step where mean KLD jumps the most (going down the ladder)."""
    k = sorted((c for c in cs if c.kld_mean and c.kld_mean > 0), key=lambda c: -c.bpw)
    if len(k) < 3:
        return None
    jumps = [(b.kld_mean / a.kld_mean, a, b) for a, b in pairwise(k)]
    j, a, b = max(jumps, key=lambda x: x[0])
    return {"bpw": round(b.bpw, 3), "from": a.quant, "to": b.quant, "jump": round(j, 2)}


def _choose(cs: list[Candidate], spec: RecommendSpec, axis: str) -> tuple[Candidate | None, int]:
    """Mark the frontier, pick from the passing candidates that no other passing candidate dominates, and say
    for every candidate why it was or was not picked."""
    same = lambda o, c: axis == "accuracy" or o.model == c.model  # noqa: E731  KLD compares within a model
    for c in cs:
        c.on_frontier = not any(dominates(o, c, axis) for o in cs if o is not c and same(o, c))
    ok = [c for c in cs if c.passes]
    ok = [c for c in ok if not any(dominates(o, c, axis) for o in ok if o is not c and same(o, c))]
    ok = sorted(ok, key=_rank_key(spec.prefer, axis))
    pick = ok[0] if ok else None
    for c in cs:
        if c is pick:
            c.verdict = f"picked: {spec.prefer} of {len(ok)} passing" + (f"; {c.verdict}" if c.verdict else "")
        elif c.passes and not any(c is o for o in ok):
            dom = next(o for o in cs if o.passes and dominates(o, c, axis) and same(o, c))
            c.verdict = f"passes, but {dom.label} is better on every axis"
        elif c.passes:
            c.verdict = {
                "smallest": f"passes, but larger ({c.model_bytes / 1024**2:.0f} MiB vs "
                f"{pick.model_bytes / 1024**2:.0f} MiB)",
                "fastest": f"passes, but slower ({c.decode_tps:.1f} vs {pick.decode_tps:.1f} tok/s)",
                "best_quality": (
                    (
                        f"passes, but less accurate ({c.accuracy:.1%} vs {pick.accuracy:.1%})"
                        if c.accuracy != pick.accuracy
                        else f"passes, same accuracy but higher KLD ({c.kld_mean:.4f} vs {pick.kld_mean:.4f})"
                    )
                    if axis == "accuracy"
                    else f"passes, but higher KLD ({c.kld_mean:.4f} vs {pick.kld_mean:.4f})"
                ),
            }[spec.prefer]
        else:
            c.verdict = "; ".join(c.failures)
    return pick, len(ok)


def backend_lines(cs: list[Candidate]) -> list[str]:
    """Per model and quant measured on several backends: the winner (passing, then fastest decode) and each
    loser's reasons in numbers ("vulkan: q4_0 decode 0.12× cpu; KLD vs host 0.02 > 0.01")."""
    out = []
    groups: dict = {}
    for c in cs:
        groups.setdefault((c.model, c.quant), []).append(c)
    for (model, quant), g in groups.items():
        if len({c.backend for c in g}) < 2:
            continue
        best = sorted(g, key=lambda c: (not c.passes, -(c.decode_tps or 0)))[0]
        out.append(
            f"{model} {quant}: {best.backend} wins"
            + ("" if best.passes else " (though it fails: " + "; ".join(best.failures) + ")")
        )
        for c in g:
            if c is best:
                continue
            why = []
            if c.decode_tps and best.decode_tps:
                why.append(f"decode {c.decode_tps / best.decode_tps:.2f}× {best.backend}")
            if c.energy_per_token and best.energy_per_token:
                why.append(f"energy/token {c.energy_per_token / best.energy_per_token:.2f}× {best.backend}")
            why += c.failures
            out.append(f"  {c.backend}: {quant} " + "; ".join(why or ["no faster"]))
    return out


def min_ram_table(cs: list[Candidate], spec: RecommendSpec) -> list[dict]:
    """Per model and quant, the smallest phone and laptop it fits on at the recipe's context: its need
    (weights + KV + the runtime overhead measured on this device) against budget.phone_rule and
    ram_fraction × a laptop's RAM."""
    out = []
    for c in sorted(cs, key=lambda c: (c.model, -c.bpw)):
        phone = next((g for g in budgetmod.TABLE_PHONES_GB if budgetmod.phone_rule(g) >= c.ram_need), None)
        laptop = next(
            (g for g in budgetmod.TABLE_LAPTOPS_GB if budgetmod.laptop_rule(g, spec.ram_fraction) >= c.ram_need), None
        )
        if any((m["model"], m["quant"]) == (c.model, c.quant) for m in out):
            continue  # one line per file, whatever the backends
        out.append(
            {
                "model": c.model,
                "quant": c.quant,
                "need_bytes": c.ram_need,
                "overhead_measured": c.overhead_measured,
                "phone_gb": phone,
                "laptop_gb": laptop,
            }
        )
    return out


def _per_task(rows: pd.DataFrame, spec: RecommendSpec, tasks: list[str], multi: bool) -> dict:
    """Several tasks: a pick per task as well (an easy task can ship a smaller file)."""
    per_task = {}
    for task in tasks:
        tcs = [c for c in candidates(rows, spec, task) if c.accuracy is not None]
        for c in tcs:
            c.multi_backend = multi
        tpick, n_ok = _choose(tcs, spec, "accuracy")
        per_task[task] = {
            "pick": tpick.label if tpick else None,
            "accuracy": tpick.accuracy if tpick else None,
            "base_accuracy": tpick.base_accuracy.get(task) if tpick else None,
            "passing": n_ok,
            "candidates": [
                {
                    "model": c.model,
                    "quant": c.quant,
                    "accuracy": c.accuracy,
                    "base_accuracy": c.base_accuracy.get(task),
                    "verdict": c.verdict,
                }
                for c in sorted(tcs, key=lambda c: (c.model, -c.bpw))
            ],
        }
    return per_task


def unjudged_picks(cs: list[Candidate]) -> dict[str, Candidate]:
    """Where no candidate has any quality measured (a bench-only recipe): the fastest and the smallest of those
    that fail nothing but the quality bar — the speed and memory picks that were measured."""
    if any(c.kld_mean is not None or c.accuracy is not None for c in cs):
        return {}
    ok = [c for c in cs if all(f == NO_KLD for f in c.failures) and c.decode_tps is not None]
    if not ok:
        return {}
    return {
        "fastest": max(ok, key=lambda c: (c.decode_tps, -c.model_bytes)),
        "smallest": min(ok, key=lambda c: (c.model_bytes, -(c.decode_tps or 0))),
    }


def _device(device: str, cs: list[Candidate], rows: pd.DataFrame, spec: RecommendSpec) -> DeviceRecommendation:
    multi = len({c.backend for c in cs}) > 1
    for c in cs:
        c.multi_backend = multi
    # across models KLD is not comparable (each is relative to its own base): use task accuracy when every
    # candidate has it, else KLD (and say which)
    models = {c.model for c in cs}
    axis = "accuracy" if all(c.accuracy is not None for c in cs) and len(models) > 1 else "kld_mean"
    pick, _ = _choose(cs, spec, axis)
    tasks = sorted({t for c in cs for t in c.task_accuracy})
    per_task = _per_task(rows[rows["device"] == device], spec, tasks, multi) if len(tasks) > 1 else {}
    knees = {m: knee([c for c in cs if c.model == m]) for m in models}
    return DeviceRecommendation(
        device=device,
        pick=pick,
        candidates=sorted(cs, key=lambda c: (c.model, -c.bpw)),
        spec=spec.model_dump(),
        quality_axis=axis,
        knees={m: k for m, k in knees.items() if k},
        per_task=per_task,
        min_ram=min_ram_table(cs, spec),
        backends=backend_lines(cs),
        unjudged=unjudged_picks(cs),
    )


def recommend(rows: pd.DataFrame, spec: RecommendSpec) -> list[DeviceRecommendation]:
    cands = candidates(rows, spec)
    return [
        _device(device, [c for c in cands if c.device == device], rows, spec)
        for device in dict.fromkeys(c.device for c in cands)
    ]
