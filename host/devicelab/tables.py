"""Views over normalized rows, what the CLI and the report both render: the wide per-(device, model, quant)
summary, and the recommendation as view rows (column headers and cell texts, the pick, the reasons)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .candidate import kv_at
from .errors import DevicelabError
from .models.gguf_info import kv_scale
from .recipes import RecommendSpec
from .recommend import DeviceRecommendation, recommend
from .schema import NUMERIC_COLUMNS

# what a table of rows must have for results, recommend and report to read it
NEEDED = ("device", "model", "quant", "metric", "value", "phase", "bpw", "model_bytes")
NUMERIC = NUMERIC_COLUMNS


def load(path: Path, recipe: str | None = None) -> pd.DataFrame:
    """An exported results table (.parquet or .csv, from `devicelab results --export`), checked: one line
    for a file that is not such a table, lacks its columns or holds non-numbers where numbers go."""
    p = Path(path)
    if not p.exists():
        raise DevicelabError(f"{p} does not exist; export one with `devicelab results --export {p.name}`")
    if p.is_dir():
        raise DevicelabError(f"{p} is a folder; give an exported .parquet or .csv file")
    try:
        if p.suffix == ".parquet":
            df = pd.read_parquet(p)
        elif p.suffix == ".csv":
            df = pd.read_csv(p, encoding="utf-8", low_memory=False)
        else:
            raise DevicelabError(f"{p}: give a .parquet or .csv file exported by `devicelab results --export`")
    except DevicelabError:
        raise
    except UnicodeDecodeError as e:
        raise DevicelabError(f"{p}: not UTF-8 text; give the CSV as `devicelab results --export` wrote it") from e
    except Exception as e:  # pyarrow/pandas parse errors of every kind: one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DevicelabError(f"{p}: not a readable {p.suffix[1:]} table ({msg[:200]})") from e
    missing = [c for c in NEEDED if c not in df.columns]
    if missing:
        raise DevicelabError(
            f"{p}: not a devicelab results table (no column {', '.join(missing)}); export one with "
            "`devicelab results --export FILE`"
        )
    for c in NUMERIC:
        if c in df.columns:
            num = pd.to_numeric(df[c], errors="coerce")
            bad = num.isna() & df[c].notna() & (df[c].astype(str).str.strip() != "")
            if bad.any():
                i = int(bad.to_numpy().argmax())  # the first bad row's position
                raise DevicelabError(
                    f"{p}: column {c} holds {str(df[c].iloc[i])[:40]!r} at row {i + 2}, not a "
                    "number; fix or re-export the table"
                )
            df[c] = num
    if "throttled" in df.columns:
        df["throttled"] = df["throttled"].map({"1": True, "0": False, 1: True, 0: False, "True": True, "False": False})
    return df[df["recipe"] == recipe] if recipe and "recipe" in df.columns else df


def wide(rows: pd.DataFrame) -> pd.DataFrame:
    from .compare import over_rounds

    rows = over_rounds(rows[rows["model_bytes"].notna()])  # a figure in rounds: the mean of its rounds
    if rows.empty:
        return pd.DataFrame()
    keys = ["device", "model", "quant"]
    base = rows.groupby(keys, sort=False).agg(bpw=("bpw", "first"), model_bytes=("model_bytes", "first")).reset_index()

    def best(metric, how="max", name=None):
        d = rows[(rows["metric"] == metric) & rows["value"].notna()]
        if d.empty:
            return pd.DataFrame(columns=keys + [name or metric])
        g = d.groupby(keys)["value"]
        return (g.max() if how == "max" else g.min()).rename(name or metric).reset_index()

    out = base
    for metric, how, name in (
        ("prefill_tps", "max", None),
        ("decode_tps", "max", None),
        ("kld_mean", "min", None),
        ("ppl_ratio", "min", None),
        ("same_top_p", "max", None),
        ("peak_rss", "max", None),
        ("temp_max", "max", None),
    ):
        out = out.merge(best(metric, how, name), on=keys, how="left")
    e = rows[(rows["metric"] == "energy_per_token") & (rows["phase"] == "decode") & rows["value"].notna()]
    if not e.empty:
        out = out.merge(e.groupby(keys)["value"].min().rename("decode_j_per_tok").reset_index(), on=keys, how="left")
    else:
        out["decode_j_per_tok"] = float("nan")
    return out.sort_values(["device", "model", "bpw"], ascending=[True, True, False]).reset_index(drop=True)


# ---------------------------------------------------------------- the recommendation as view rows
# What `devicelab recommend` (and `run`) print and what the report shows, made once: each renderer picks its
# columns and wraps the texts in its own markup.

NONE = "—"  # a missing value's cell
NO_PICK = "no quant meets the constraints"
NO_QUALITY = "no quality measured: the speed and memory picks alone"
ADD_QUALITY = (
    "no quality was measured on this device (the recipe has no kld or eval payload), so no quant can be "
    "judged against the quality bar: add `- kind: kld` (KL divergence against the model's F16 base, "
    "made once on the host) or an eval payload to the recipe's payloads"
)


def text(v, fmt: str | Callable | None = None) -> str:
    """A cell's text: NONE for a missing value, else the value through `fmt` (a format string or a function)."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return NONE
    if fmt is None:
        return str(v)
    return fmt.format(v) if isinstance(fmt, str) else fmt(v)


@dataclass(frozen=True, kw_only=True)
class Table:
    """Column headers and each row's cell texts."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    @classmethod
    def of(
        cls,
        records: Sequence[dict] | Sequence[pd.Series],
        fmt: dict | None = None,
        columns: Sequence[str] | None = None,
    ) -> Table:
        """From records ({header: value}) or a frame's rows (with `columns`); `fmt`: header -> format string or
        function."""
        fmt = fmt or {}
        cols = tuple(columns if columns is not None else (records[0] if records else {}))
        return cls(columns=cols, rows=tuple(tuple(text(r.get(c), fmt.get(c)) for c in cols) for r in records))

    @classmethod
    def of_frame(cls, df: pd.DataFrame, columns: Sequence[str], fmt: dict | None = None) -> Table:
        return cls.of([r for _, r in df.iterrows()], fmt, columns)


@dataclass(frozen=True, kw_only=True)
class Pick:
    label: str  # "m q4_0", "(vulkan)" added where the device ran several backends
    bpw: str
    mib: str
    decode: str
    kld: str


@dataclass(frozen=True, kw_only=True)
class MinRam:
    model: str
    quant: str
    need_mib: str
    measured: bool  # the runtime overhead was measured for this file (else the default is assumed)
    phone: str  # "6 GB", "> 16 GB"
    laptop: str


@dataclass(frozen=True, kw_only=True)
class Knee:
    model: str
    bpw: str
    from_quant: str
    to_quant: str
    jump: str  # mean KLD ×jump across the step


@dataclass(frozen=True, kw_only=True)
class RecommendationView:
    """One device's recommendation: the pick, every candidate (a table row and a one-line listing), the reasons
    (RAM line, energy per prompt, backends, per-task picks), per-task, minimum-RAM and KV tables, the knees."""

    device: str
    pick: Pick | None
    candidates: Table
    listing: tuple[str, ...]
    reasons: tuple[str, ...]
    per_task: Table | None
    min_ram: tuple[MinRam, ...]
    kv: Table | None
    knees: tuple[Knee, ...]
    quality_axis: str
    spec: dict
    constraints: str
    sentences: tuple[str, ...] = ()  # the constraints in sentences
    no_pick: str = NO_PICK  # the headline where nothing is picked


CANDIDATE_FMT = {
    "bits/w": "{:.2f}",
    "MiB": "{:.0f}",
    "decode t/s": "{:.1f}",
    "mean KLD": "{:.4f}",
    "accuracy": "{:.1%}",
    "RAM need MiB": "{:.0f}",
    "mWh/prompt": "{:.3g}",
    "battery/1k prompts": "{:.1%}",
}


def _candidates(r: DeviceRecommendation) -> Table:
    return Table.of(
        [
            {
                "model": c.model,
                "quant": c.quant,
                "backend": c.backend,
                "bits/w": c.bpw,
                "MiB": c.model_bytes / 1024**2,
                "decode t/s": c.decode_tps,
                "mean KLD": c.kld_mean,
                "accuracy": c.accuracy,
                "RAM need MiB": (c.ram_need or 0) / 1024**2,
                "mWh/prompt": c.wh_per_prompt * 1000 if c.wh_per_prompt is not None else None,
                "battery/1k prompts": c.battery_per_1000,
                "frontier": "◆" if c.on_frontier else "",
                "verdict": ("→ " if c is r.pick else "") + c.verdict,
            }
            for c in r.candidates
        ],
        CANDIDATE_FMT,
    )


def _listing(r: DeviceRecommendation) -> tuple[str, ...]:
    out = []
    for c in r.candidates:
        mark = "→" if c is r.pick else ("✓" if c.passes else "✗")
        front = "◆" if c.on_frontier else " "
        acc = f" acc {c.accuracy:.1%}" if c.accuracy is not None else ""
        be = f" {c.backend}" if c.multi_backend else ""
        out.append(f"{mark}{front} {c.model} {c.quant:7s}{be} {c.bpw:5.2f} b/w{acc}  {c.verdict}")
    return tuple(out)


def reasons(r: DeviceRecommendation) -> tuple[str, ...]:
    """The pick's RAM line (budget, its source, the need), its energy per prompt, the per-task picks."""
    out, c = [], r.pick or r.unjudged.get("smallest") or (r.candidates[0] if r.candidates else None)
    if c is None:
        return ()
    mib = lambda b: f"{b / 1024**2:.0f} MiB"
    if c.ram_budget is not None:
        out.append(
            f"RAM: {c.model} {c.quant} needs {mib(c.ram_need)} (weights {mib(c.model_bytes)} + KV "
            f"{mib(c.kv_bytes or 0)} + runtime {mib(c.ram_need - c.model_bytes - (c.kv_bytes or 0))}"
            f"{'' if c.overhead_measured else ', assumed'}) of a budget of {mib(c.ram_budget)} "
            f"({c.ram_budget_source})"
        )
    if c.wh_per_prompt is not None:
        share = f", {c.battery_per_1000:.1%} of the battery per 1,000 prompts" if c.battery_per_1000 else ""
        out.append(f"energy: {c.wh_per_prompt * 1000:.3g} mWh per prompt ({c.prompt_shape}){share} [{c.energy_source}]")
    else:
        out.append("energy: not measurable on this device (no power source)")
    if r.unjudged:
        out.insert(0, ADD_QUALITY)
        out[1:1] = [
            f"on speed and memory alone ({'measured' if k == 'fastest' else 'file size'}): the {k} is "
            f"{u.label} ({u.decode_tps:.1f} tok/s decode, {u.model_bytes / 1024**2:.0f} MiB), within the RAM "
            "budget and the speed target"
            for k, u in r.unjudged.items()
        ]
    out += [f"backends: {x}" if not x.startswith(" ") else x for x in r.backends]
    for task, t in r.per_task.items():
        if t["pick"]:
            base = f", base {t['base_accuracy']:.1%}" if t["base_accuracy"] is not None else ""
            out.append(f"for {task} ship {t['pick']} (accuracy {t['accuracy']:.1%}{base})")
        else:
            out.append(f"for {task}: {NO_PICK}")
    return tuple(out)


def _per_task(r: DeviceRecommendation) -> Table | None:
    if not r.per_task:
        return None
    return Table.of(
        [
            {
                "task": t,
                "ship": v["pick"] or "nothing passes",
                "accuracy": v["accuracy"],
                "base accuracy": v["base_accuracy"],
                "passing": v["passing"],
            }
            for t, v in r.per_task.items()
        ],
        {"accuracy": "{:.1%}", "base accuracy": "{:.1%}"},
    )


def _min_ram(r: DeviceRecommendation) -> tuple[MinRam, ...]:
    return tuple(
        MinRam(
            model=m["model"],
            quant=m["quant"],
            need_mib=f"{m['need_bytes'] / 1024**2:.0f}",
            measured=m["overhead_measured"],
            phone=f"{m['phone_gb']} GB" if m["phone_gb"] else "> 16 GB",
            laptop=f"{m['laptop_gb']} GB" if m["laptop_gb"] else "> 64 GB",
        )
        for m in r.min_ram
    )


def _kv(r: DeviceRecommendation, rows: pd.DataFrame) -> Table | None:
    """The KV cache of each candidate model at a few contexts and the recipe's, at each cache type."""
    kvrows = []
    for m in dict.fromkeys(c.model for c in r.candidates):
        g = rows[(rows.model == m) & rows.kv_bytes_per_token.notna()]
        if g.empty:
            continue
        per = float(g.kv_bytes_per_token.iloc[0])
        swa = tuple(g[c].iloc[0] if c in g.columns else None for c in ("n_layer", "n_swa", "swa_layers"))
        for ctx_len in sorted({2048, 8192, 32768, int(r.spec["context"])}):
            kvrows.append(
                {
                    "model": m,
                    "context": ctx_len,
                    **{
                        f"{t.upper() if t == 'f16' else t} KV MiB": kv_at(per, ctx_len, *swa) * kv_scale(t) / 1024**2
                        for t in ("f16", "q8_0", "q4_0")
                    },
                }
            )
    return Table.of(kvrows, {c: "{:.0f}" for c in kvrows[0] if "MiB" in c}) if kvrows else None


def constraints_line(spec: RecommendSpec) -> str:
    drop = f", ≤ {spec.max_accuracy_drop:g} points below the base per task" if spec.max_accuracy_drop else ""
    return (
        f"constraints: context {spec.context}, mean KLD ≤ {spec.max_kld_mean}, PPL ratio ≤ "
        f"{spec.max_ppl_ratio}, {spec.decode_label} ≥ {spec.min_decode_tps} tok/s, RAM within the device's budget, "
        f"energy ≤ {spec.max_energy_per_token or NONE} J/tok{drop}; prefer {spec.prefer}"
    )


def constraints_sentences(spec: RecommendSpec) -> tuple[str, ...]:
    """The constraints as a person would say them, one sentence each."""
    out = [
        f"A quant must fit the device's RAM budget for one app at a {spec.context:,}-token context: its weights, "
        f"a {spec.kv_cache_type.upper() if spec.kv_cache_type == 'f16' else spec.kv_cache_type} KV cache and the "
        "runtime overhead measured on the device.",
        f"Its mean KL divergence from the base must be at most {spec.max_kld_mean:g} nats, and its perplexity at "
        f"most {spec.max_ppl_ratio:g}× the base's.",
        (
            f"It must decode at least {spec.min_decode_tps:g} tokens per second."
            if spec.min_decode_tps
            else "There is no speed target."
        ),
        (
            f"Decoding must cost at most {spec.max_energy_per_token:g} J per token."
            if spec.max_energy_per_token
            else "There is no energy budget."
        ),
    ]
    if spec.min_accuracy is not None:
        out.append(f"Its task accuracy must be at least {spec.min_accuracy:.0%}.")
    if spec.max_accuracy_drop is not None:
        out.append(
            f"On each task it may be at most {spec.max_accuracy_drop:g} accuracy points below the unquantized model."
        )
    out.append(
        f"On every device its logits may differ from the host's for the same file by a KLD of at most "
        f"{spec.max_devhost_kld:g}."
    )
    out.append(
        {
            "smallest": "Of the quants that pass, the smallest file is picked.",
            "fastest": "Of the quants that pass, the fastest decoder is picked.",
            "best_quality": "Of the quants that pass, the one closest to the base is picked.",
        }[spec.prefer]
    )
    return tuple(out)


def recommendation_view(r: DeviceRecommendation, rows: pd.DataFrame, spec: RecommendSpec) -> RecommendationView:
    p = r.pick
    pick = (
        Pick(
            label=p.label,
            bpw=f"{p.bpw:.2f}",
            mib=f"{p.model_bytes / 1024**2:.0f}",
            decode=text(p.decode_tps, "{:.1f}"),
            kld=text(p.kld_mean, "{:.4f}"),
        )
        if p
        else None
    )
    knees = tuple(
        Knee(model=m, bpw=f"{k['bpw']:.2f}", from_quant=k["from"], to_quant=k["to"], jump=f"{k['jump']:.1f}")
        for m, k in r.knees.items()
    )
    return RecommendationView(
        device=r.device,
        pick=pick,
        candidates=_candidates(r),
        listing=_listing(r),
        reasons=reasons(r),
        per_task=_per_task(r),
        min_ram=_min_ram(r),
        kv=_kv(r, rows),
        knees=knees,
        quality_axis=r.quality_axis,
        spec=r.spec,
        constraints=constraints_line(spec),
        sentences=constraints_sentences(spec),
        no_pick=NO_QUALITY if r.unjudged else NO_PICK,
    )


def recommendation_views(
    rows: pd.DataFrame, spec: RecommendSpec
) -> tuple[list[DeviceRecommendation], list[RecommendationView]]:
    """The recommendation per device, and its view rows."""
    recs = recommend(rows, spec)
    return recs, [recommendation_view(r, rows, spec) for r in recs]
