"""What the CLI prints: rich tables and the run's live events.

The commands in cli.py parse their arguments, call one function and hand what it returns to a printer here: the
results, recommendation, roofline, cells and plan tables, the comparison, doctor's check lines, and the live
display of a run (one line per device's lane, the cells bar, the compile bar) with its stage and failure lines.
`console` is stdout, `err` is stderr (progress and warnings). Heavy modules (pandas, the views) are imported
inside the printers that need them, so that `devicelab --help` stays quick.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .runner.lane import Events

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .bisection import Step
    from .compare import Comparison
    from .doctor import Check
    from .errors import DevicelabError
    from .lab import Device
    from .models.gguf_info import ModelInfo
    from .models.ladder import QuantFile
    from .plan import Cell
    from .preview import Preview
    from .recipes import RecommendSpec
    from .runner.placement import RunReport
    from .serve import LiveStatus
    from .tables import RecommendationView


def make_console(**kw: Any) -> Console:
    c = Console(highlight=False, **kw)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(highlight=False, width=180, **kw)  # logs and pipes: don't squeeze tables to 80 columns
    return c


console = make_console()
err = make_console(stderr=True)


def print_error(e: DevicelabError) -> None:
    """A DevicelabError: one red line, then its detail (dim) unless DEVICELAB_QUIET_DETAIL=1."""
    err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
    if e.detail and os.environ.get("DEVICELAB_QUIET_DETAIL") != "1":
        err.print(e.detail, markup=False, style="dim")


# ---------------------------------------------------------------- live events
def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        # off a terminal (a log, a pipe) there is nothing to animate, and a stopped live display leaves a blank
        # line before whatever comes next (an error:); the stage and failure lines still print
        disable=not err.is_terminal,
    )


class RichEvents(Events):
    """One live line per device (its lane's current step), an overall cells bar, and a compile bar."""

    def __init__(self, prog: Progress, live: LiveStatus | None = None):
        self.p = prog
        self.build_task: TaskID | None = None
        self.cell_task: TaskID | None = None
        self.lanes: dict[str | tuple[str, str], TaskID] = {}  # a device's line, or ("progress", what) a host step's
        self.live = live  # the lab folder's live.json for `devicelab serve`

    def stage(self, text: str) -> None:
        self.p.console.print(f"[cyan]•[/] {escape(text)}")
        if self.live:
            self.live.stage(text)

    def progress(self, what: str, pct: float) -> None:
        if self.live:
            self.live.progress(what, pct)
        task = self.lanes.get(("progress", what))
        if task is None:
            task = self.lanes[("progress", what)] = self.p.add_task(what, total=100)
        self.p.update(task, completed=pct)
        if pct >= 100:
            self.p.remove_task(task)
            del self.lanes[("progress", what)]

    def build_progress(self, pct: float, line: str) -> None:
        if self.build_task is None:
            self.build_task = self.p.add_task("compiling llama.cpp", total=100)
        self.p.update(self.build_task, completed=pct)
        if pct >= 100:
            self.p.remove_task(self.build_task)
            self.build_task = None

    def cells(self, total: int) -> None:
        self.cell_task = self.p.add_task("cells", total=max(total, 1))
        if total == 0:
            self.p.update(self.cell_task, completed=1, description="cells: all done already")

    def lane(self, device: str, text: str) -> None:
        if text.startswith(f"{device} "):  # a cell's label names its device: say it once
            text = text[len(device) + 1 :]
        if device not in self.lanes:
            self.lanes[device] = self.p.add_task("", total=None)
        self.p.update(self.lanes[device], description=escape(f"{device}: {text}"))
        if self.live:
            self.live.lane(device, text)

    def cell_start(self, cell: Cell) -> None:
        if self.live:
            self.live.lane(cell.device, cell.label().removeprefix(f"{cell.device} "), cell.cell_id)

    def cell_done(self, cell: Cell, ok: bool, note: str = "") -> None:
        assert self.cell_task is not None, "cells() comes first"
        self.p.advance(self.cell_task)
        if not ok:
            self.p.console.print(f"[red]✗[/] {escape(cell.label())}: {escape(note)}")
            if self.live:
                self.live.failed(cell.device, cell.label(), cell.cell_id, note)


def _print_table(columns: Sequence[str], rows: Iterable[Sequence[str]], **kw: Any) -> None:
    """A rich table of these columns and rows (each a sequence of strings); kw: Table's (title, box)."""
    t = Table(*columns, **kw)
    for r in rows:
        t.add_row(*r)
    console.print(t)


# ---------------------------------------------------------------- models
def print_model_info(info: ModelInfo) -> None:
    console.print(
        f"{info.name} ({info.arch}) {info.n_params / 1e6:.1f} M params, {info.bytes / 1024**2:.1f} MiB, "
        f"{info.bpw:.3f} bits/weight; layers {info.n_layer}, KV heads {info.n_head_kv}, ctx {info.n_ctx_train}"
    )
    _print_table(
        ("tensor type", "tensors", "params", "MiB"),
        (
            (ty, str(n), f"{info.tensor_type_params[ty] / 1e6:.2f} M", f"{info.tensor_type_bytes[ty] / 1024**2:.1f}")
            for ty, n in sorted(info.tensor_types.items(), key=lambda kv: -info.tensor_type_params[kv[0]])
        ),
    )


def print_quantizing(quant: str) -> None:
    console.print(f"[dim]quantize {quant}[/]")


def print_ladder(made: dict[str, QuantFile]) -> None:
    """The quant ladder made: {quant: its model file}."""
    _print_table(
        ("quant", "MiB", "bits/weight", "tensor types"),
        (
            (
                q,
                f"{f.manifest['bytes'] / 1024**2:.1f}",
                f"{f.manifest['bpw']:.3f}",
                ", ".join(f"{k}×{v}" for k, v in sorted(f.manifest["tensor_types"].items())),
            )
            for q, f in made.items()
        ),
    )


# ---------------------------------------------------------------- results / recommend / views
def _fmt(v: Any, f: str = "{:.2f}") -> str:
    import pandas as pd

    if v is None or pd.isna(v):
        return "—"
    return f.format(v)


# the columns of the results and roofline tables: what a row is, then its figures
_ROW_HEADERS = ("device", "model", "quant", "bits/w")
WIDE_HEADERS = (
    *_ROW_HEADERS,
    "MiB",
    "prefill t/s",
    "decode t/s",
    "mean KLD",
    "PPL ratio",
    "top-1 same",
    "peak RSS MiB",
    "J/tok decode",
)
ROOFLINE_HEADERS = (*_ROW_HEADERS, "test", "threads", "quota", "load", "t/s", "limit t/s", "efficiency", "bound")


def print_wide(rows: pd.DataFrame) -> None:
    from .tables import wide

    w = wide(rows)
    if w.empty:
        console.print("no results yet")
        return
    lines = (
        (
            r["device"],
            r["model"],
            r["quant"],
            _fmt(r["bpw"]),
            _fmt(r["model_bytes"] / 1024**2, "{:.1f}"),
            _fmt(r["prefill_tps"], "{:.1f}"),
            _fmt(r["decode_tps"], "{:.1f}"),
            _fmt(r["kld_mean"], "{:.4f}"),
            _fmt(r["ppl_ratio"], "{:.4f}"),
            _fmt(r["same_top_p"], "{:.1%}"),
            _fmt(r["peak_rss"] / 1024**2 if r["peak_rss"] == r["peak_rss"] else None, "{:.0f}"),
            _fmt(r["decode_j_per_tok"], "{:.3g}"),
        )
        for _, r in w.iterrows()
    )
    _print_table(WIDE_HEADERS, lines, title="results (best over threads)")


def print_recs(rows: pd.DataFrame, spec: RecommendSpec, as_json: bool = False, considered: list | None = None) -> None:
    """considered: models predicted, not measured (recommend --consider), listed apart under each device."""
    from .tables import recommendation_views

    recs, views = recommendation_views(rows, spec)
    considered = considered or []
    if as_json:
        out = [r.to_json() | {"considered": [c for c in considered if c["device"] == r.device]} for r in recs]
        click.echo(json.dumps(out, indent=1, default=str))
        return
    for v in views:
        _print_rec(v)
        _print_considered([c for c in considered if c["device"] == v.device])
    if not recs:
        console.print("no results to recommend from")


def _print_considered(cs: list[dict]) -> None:
    if not cs:
        return
    console.print("  [bold]considered — predicted, not measured, never picked:[/]")
    for c in cs:
        console.print(f"  {c['model']} {c['quant']}: {c['verdict']}", markup=False)
    from .predict import COVER

    console.print(
        f"  [dim]each predicted from this device's own cells of other models; the interval holds {COVER:.0%} of the "
        "lab's errors (`devicelab predict --check`). Measure it: a recipe with the model (devicelab run RECIPE)[/]"
    )


def _print_rec(v: RecommendationView) -> None:
    p = v.pick
    console.print(
        f"[bold green]{v.device}: ship {escape(p.label)}[/] ({p.bpw} bits/w, {p.mib} MiB, decode {p.decode} "
        f"tok/s, KLD {p.kld})"
        if p
        else f"[bold red]{v.device}: {escape(v.no_pick)}[/]"
    )
    console.print(f"[dim]{v.constraints}[/]")
    for line in (
        *v.reasons,
        *v.listing,
        f"◆ = Pareto frontier of quality ({v.quality_axis}) × size × decode speed × energy",
        *(
            f"bits-per-weight knee for {k.model}: {k.bpw} bpw (mean KLD ×{k.jump} from {k.from_quant} to {k.to_quant})"
            for k in v.knees
        ),
    ):
        console.print(f"  {line}", markup=False)
    _print_min_ram(v)


def _print_min_ram(v: RecommendationView) -> None:
    if not v.min_ram:
        return
    t = Table(
        title=f"{v.device}: the smallest RAM each file fits (weights + KV + runtime at the recipe's context)", box=None
    )
    for col in ("model", "quant", "needs MiB", "phone", "laptop"):
        t.add_column(col)
    for m in v.min_ram:
        t.add_row(m.model, m.quant, m.need_mib + ("" if m.measured else "*"), m.phone, m.laptop)
    console.print(t)
    if not all(m.measured for m in v.min_ram):
        console.print("  * runtime overhead not measured for this file: the default assumed", markup=False)


def print_cells(cells: Iterable[dict]) -> None:
    rows = (
        (
            c["cell_id"],
            c["recipe"],
            c["device"],
            c["model"],
            c["quant"],
            c["payload"],
            c["params"][:40],
            c["status"],
            str(c["attempts"]),
            (c["error"] or "")[:60],
        )
        for c in cells
    )
    _print_table(("cell", "recipe", "device", "model", "quant", "payload", "params", "status", "tries", "error"), rows)


def print_roofline(df: pd.DataFrame) -> None:
    import pandas as pd

    if df.empty:
        console.print("no bench rows")
        return
    rows = (
        (
            r.device,
            r.model,
            r.quant,
            _fmt(r.bpw),
            r.test,
            str(r.threads),
            _fmt(r.cpu_quota, "{:g}"),
            "0" if pd.isna(r.contention) else str(r.contention),
            _fmt(r.tps, "{:.1f}"),
            _fmt(r.limit_tps, "{:.1f}"),
            _fmt(r.efficiency, "{:.0%}"),
            r.bound,
        )
        for _, r in df.iterrows()
    )
    _print_table(ROOFLINE_HEADERS, rows, title="roofline (limits from the membw payload)")


def print_findings(fs: list[dict]) -> None:
    if not fs:
        console.print("not enough data for any finding")
    for f in fs:
        mark = {True: "[green]held[/]", False: "[red]did not hold[/]", None: "[yellow]not enough data[/]"}[f["held"]]
        console.print(f"{f['device']} {f['model']}: {f['claim']}: {mark} — {escape(f['evidence'])}")


def print_comparison(cmp: Comparison, fmt: str) -> None:
    from . import compare as cmpmod

    if fmt == "markdown":
        click.echo(cmpmod.markdown(cmp), nl=False)
        return
    if fmt == "csv":
        click.echo(cmpmod.frame(cmp).to_csv(index=False), nl=False)
        return
    if fmt == "json":
        click.echo(json.dumps(cmp.to_json(), indent=1, default=str))
        return
    headers, rows, common = cmpmod.view(cmp)
    style = {cmpmod.MARKS[cmpmod.REGRESSION]: "red", cmpmod.MARKS[cmpmod.GAIN]: "green"}
    t = Table(*headers, box=None, title=escape(cmpmod.summary(cmp)))
    for r in rows:
        t.add_row(*map(escape, r), style=style.get(r[-1]))
    console.print(t)
    if common:
        console.print("common to every pair: " + ", ".join(f"{k} = {v}" for k, v in common.items()), markup=False)
    for line in cmpmod.unpaired_lines(cmp):
        console.print(line, markup=False)


def print_bisect_step(st: Step, metric: str) -> None:
    ratio = f"{metric} ×{st.ratio:.3f} of the good end" if st.ratio is not None else ""
    p = f" (p {st.p:.2g}{f', {st.rounds} rounds' if st.rounds else ''})" if st.p is not None else ""
    colour = {"bad": "red", "good": "green"}.get(st.verdict, "yellow")
    more = ": measuring it in more rounds" if st.verdict == "undecided" else ""
    console.print(
        f"{st.candidate.commit[:12]} {escape(st.candidate.subject[:60])}: {ratio}{p} → "
        f"[{colour}]{st.verdict}[/]{more}"
        + (f" [yellow]({escape(st.note)})[/]" if st.note and st.ratio is not None else "")
    )


def print_precision(rep: RunReport, target: float | None) -> None:
    """`rounds: auto`: the rounds taken and each compared ratio with its interval; those wider than the target."""
    if rep.rounds is None:
        return
    met = len(rep.intervals) - len(rep.unmet)
    why = f", stopped by {rep.stopped}" if rep.stopped else ""
    console.print(
        f"{rep.rounds} rounds: {met} of {len(rep.intervals)} compared ratios within ±{target:g} (95 % interval){why}",
        markup=False,
    )
    wide = {id(i) for i in rep.unmet}
    for i in rep.intervals:
        console.print(f"  {'[yellow]wider than the target:[/] ' if id(i) in wide else ''}{escape(i.label())}")


# ---------------------------------------------------------------- plan / devices / doctor
def print_plan(pv: Preview) -> None:
    """`devicelab plan`: what a run would do (preview.Preview), per device its cells and time estimate."""
    console.print(f"[bold]{escape(pv.recipe)}[/]: {escape(pv.source)}")
    for line in pv.work:
        console.print(f"  • {line}", markup=False)
    console.print(
        "  • each device's own llama.cpp build is chosen at its first contact (from its facts) and reused when cached",
        markup=False,
    )
    longest = 0.0
    for dev, cells in pv.cells.items():
        secs, unknown = pv.device_seconds(dev)
        longest = max(longest, secs)
        done = sum(1 for _, st, _ in cells if st in ("done", "skipped"))
        console.print(
            f"[bold]{escape(dev)}[/]: {len(cells)} cells, {done} done, {len(cells) - done} to run (≈ "
            f"{secs / 60:.1f} min{f'; {unknown} with no history to estimate from' if unknown else ''})"
        )
        t = Table("cell", "status", "estimate", box=None)
        for c, st, s in cells:
            t.add_row(escape(c.label().removeprefix(f"{dev} ")), st, "—" if s is None else f"{s:.0f} s")
        console.print(t)
    console.print(
        f"done cells found by {pv.matched_by}; all devices run at once: ≈ {longest / 60:.1f} min of "
        "cells (the slowest device), plus what is listed above",
        markup=False,
    )


def print_probe(d: Device, res: dict[str, tuple[bool, str]]) -> None:
    """`devicelab devices probe`: a device's telemetry sources, {source: (readable, detail)}."""
    console.print(f"[bold]{d.name}[/] ({d.transport})")
    for src, (ok, detail) in res.items():
        mark = "[green]yes[/]" if ok else "[yellow]no[/] "
        console.print(f"  {mark} {src}: {detail}")


DOCTOR_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def print_device_heading(d: Device) -> None:
    console.print(f"[bold]{escape(d.name)}[/] ({escape(d.transport)})")


def say_check(c: Check) -> None:
    """One doctor check: its mark, title and detail, and its fix (or hint) below."""
    from .doctor import MARK

    style = DOCTOR_STYLE.get(c.state, "")
    console.print(f"  [{style}]{MARK[c.state]}[/] {escape(c.title)}: {escape(c.detail)}", soft_wrap=True)
    if c.fix:
        console.print(f"      [yellow]{'fix' if c.state == 'fail' else 'hint'}:[/] {escape(c.fix)}", soft_wrap=True)


def say_doctor_stage(text: str) -> None:
    err.print(f"    [dim]· {escape(text)}[/]")


# ---------------------------------------------------------------- predict
_PRED_UNITS = {"decode_tps": "tok/s", "prefill_tps": "tok/s", "peak_rss": "MiB"}


def _figure(metric: str, v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v / 2**20:.0f}" if metric == "peak_rss" else f"{v:.1f}"


def print_predictions(target: Any, preds: list, mem: dict, context: int, as_json: bool = False) -> None:
    """`devicelab predict`: per device, each quant's RAM need against the budget, then each predicted figure with
    its interval and what it rests on — marked predicted, never a measurement."""
    from .predict import COVER

    if as_json:
        click.echo(
            json.dumps(
                {
                    "model": target.name,
                    "source": target.source,
                    "context": context,
                    "ram": mem,
                    "predictions": [p.to_json() for p in preds],
                },
                indent=1,
                default=str,
            )
        )
        return
    if not preds:
        console.print(f"no device of the lab measured a model to predict {escape(target.name)} from")
        return
    console.print(f"[bold]{escape(target.name)}[/] ({escape(target.source)}) — predicted, not measured")
    for device in sorted(mem):
        for m in mem[device]:
            over = "runtime measured here" if m["overhead_measured"] else "runtime assumed: none measured here"
            need = (
                f"needs {m['need'] / 2**20:.0f} MiB (weights {m['weights'] / 2**20:.0f} from {m['weights_from']}, "
                f"KV@{context} {m['kv'] / 2**20:.0f}, {over} {m['overhead'] / 2**20:.0f})"
            )
            if m["budget"] is None:
                verdict = "[yellow]budget unknown[/]"
            elif m["fits"]:
                verdict = f"[green]fits[/] with {m['margin'] / 2**20:.0f} MiB to spare of {m['budget'] / 2**20:.0f}"
            else:
                verdict = f"[red]too large[/] by {-m['margin'] / 2**20:.0f} MiB for {m['budget'] / 2**20:.0f}"
            console.print(f"{escape(device)} {m['quant']}: {verdict}; {escape(need)}")
        t = Table(box=None, title=f"{device}: predicted from its own cells of other models")
        for c in ("quant", "metric", "test", "threads", "predicted", f"{COVER:.0%} of the lab's errors", "rests on"):
            t.add_column(c)
        for p in (p for p in preds if p.device == device):
            sh = p.shape
            test = f"pp{int(sh['n_prompt'])}" if p.metric == "prefill_tps" else f"tg{int(sh['n_gen'])}"
            if p.metric == "peak_rss":
                test = f"{int(sh['n_prompt'] + sh['n_gen'] + sh['n_depth'])} tok"
            rng = (
                f"{_figure(p.metric, p.lo)}–{_figure(p.metric, p.hi)}"
                if p.lo is not None
                else "not measured: it needs two other models measured here"
            )
            t.add_row(
                p.quant,
                p.metric,
                test,
                str(int(sh["threads"])) if sh.get("threads") else "—",
                f"{_figure(p.metric, p.value)} {_PRED_UNITS[p.metric]}",
                rng,
                escape(f"{', '.join(p.refs)}: {p.basis}"),
            )
        console.print(t)
    quants = sorted({p.quant for p in preds})
    console.print(
        "[dim]"
        + escape(
            f"to measure it for real: a recipe with this model and quants: [{', '.join(quants)}] "
            "(devicelab run RECIPE), then `devicelab predict --check` shows how far off this was"
        )
        + "[/]"
    )


def print_prediction_check(
    table: pd.DataFrame, errs: pd.DataFrame, few: list[str], notes: list[str], as_json: bool = False
) -> None:
    """`devicelab predict --check`: each model the lab measured predicted from the device's other models."""
    from .predict import COVER

    if as_json:
        click.echo(
            json.dumps(
                {"table": table.to_dict("records"), "cells": errs.to_dict("records"), "too_few": few, "notes": notes},
                indent=1,
                default=str,
            )
        )
        return
    for line in few:
        console.print(f"[yellow]{escape(line)}[/]")
    if table.empty:
        console.print("no device measured two models: nothing to check predictions against")
        return
    t = Table(box=None, title="predictions against measurements (leave one model out)")
    for c in (
        "device",
        "metric",
        "family",
        "cells",
        "models",
        "median error",
        f"{COVER:.0%} of |error| within",
        "inside",
    ):
        t.add_column(c)
    for _, r in table.iterrows():
        t.add_row(
            str(r["device"]),
            str(r["metric"]),
            str(r["family"]),
            str(r["cells"]),
            str(r["models"]),
            f"{r['median_error']:+.1%}",
            f"±{r['p90_abs_error']:.1%}",
            str(r["inside"]),
        )
    console.print(t)
    n = errs["inside"].notna().sum()
    inside = int(errs["inside"].fillna(False).sum())
    console.print(
        f"{inside} of {n} measured cells inside the interval predict gave them (each from the other models' errors)"
    )
    for line in notes:
        console.print(f"[yellow]{escape(line)}[/]")
