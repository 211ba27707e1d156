"""Recommendation per device: the quant that fits RAM (weights + KV cache at the recipe's context +
measured runtime overhead), meets the quality bar, the speed target and the energy budget — with the
reason every other candidate lost. Works from the ledger or from an exported table alone.

A candidate is first measured (candidate.py: `Figures.of` finds every candidate's figures in one grouped pass over
the rows per figure, `measure` makes one candidate of them), then judged here (`judge`: CHECKS, one small function
per constraint, each returning the reasons it lost). What the CLI and the report show of the result is
made once, in tables.recommendation_views."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise

import pandas as pd

from . import budget as budgetmod
from .candidate import DEFAULT_OVERHEAD, FLOAT_QUANTS, Candidate, Figures, measure, mib
from .recipes import RecommendSpec


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
        f"needs {mib(c.ram_need)} (weights {mib(c.model_bytes)} + {spec.kv_cache_type} KV@{spec.context} "
        f"{mib(c.kv_bytes or 0)} + runtime {mib(runtime)}) > budget {mib(c.ram_budget)} "
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
        run = " (a payload of kind soak measures it)" if spec.speed == "sustained" else ""
        return [f"no {spec.decode_label} speed measured{run}"]
    if c.decode_tps < spec.min_decode_tps:
        return [f"{spec.decode_label} {c.decode_tps:.1f} tok/s < {spec.min_decode_tps}"]
    return []


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
    k = sorted(((c, c.kld_mean) for c in cs if c.kld_mean and c.kld_mean > 0), key=lambda x: -x[0].bpw)
    if len(k) < 3:
        return None
    jumps = [(kb / ka, a, b) for (a, ka), (b, kb) in pairwise(k)]
    j, a, b = max(jumps, key=lambda x: x[0])
    return {"bpw": round(b.bpw, 3), "from": a.quant, "to": b.quant, "jump": round(j, 2)}


def _choose(cs: list[Candidate], spec: RecommendSpec, axis: str) -> tuple[Candidate | None, int]:
    """Mark the frontier, pick from the passing candidates that no other passing candidate dominates, and say
    for every candidate why it was or was not picked."""
    same = lambda o, c: axis == "accuracy" or o.model == c.model  # KLD compares within a model
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
            assert pick is not None, "a passing candidate no other dominates: there is a pick"
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
    out: list[dict] = []
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
