"""A cell's rows, derived from its stored artifacts alone: the live run and `devicelab reparse` call the
same function, so every row in the ledger can always be re-derived with today's parsers.

The folder (labdata/artifacts/<cell>/attempt-N/) holds what the device printed (stdout.tsv, stderr.txt,
clock, telemetry.csv, the files telemetry sources wrote beside it, snapshot texts; a second run's in a
subfolder named after it), the JSON documents a served or host cell produced, and cell.json: the cell's
params and the provenance known when it ran (build, device facts, model file, conditions, cooldown,
calibration prior)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .. import kinds
from ..kinds.base import Artifacts, RunOutput
from ..schema import Row
from ..telemetry import normalize, sampler_csv, snapshots, sources

CELL_JSON = "cell.json"


def _read(p: Path) -> str:
    return p.read_text(errors="replace") if p.is_file() else ""


def window(clock_text: str) -> tuple[float, float] | None:
    clock = dict(line.split("=", 1) for line in clock_text.splitlines() if "=" in line)
    try:
        return float(clock["start_s"]), float(clock["end_s"])
    except (KeyError, ValueError):
        return None


def run_dir(base: Path, name: str) -> Path:
    return base if name == "main" else base / name


def read_run(base: Path, name: str) -> RunOutput:
    d = run_dir(base, name)
    try:
        argv = json.loads(_read(d / "argv.json") or "{}").get("argv") or []
    except ValueError:
        argv = []
    return RunOutput(_read(d / "stdout.tsv"), _read(d / "stderr.txt"), window(_read(d / "clock")), argv)


def row_dict(r: Row) -> dict:
    d = asdict(r)
    d.pop("context")
    return d


def write_meta(base: Path, meta: dict) -> None:
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / (CELL_JSON + ".part")
    tmp.write_text(json.dumps(meta, default=str, sort_keys=True))
    tmp.rename(base / CELL_JSON)


def load(base: Path) -> tuple[dict, Artifacts]:
    meta = json.loads((base / CELL_JSON).read_text())
    runs = {}
    for name in meta.get("runs", []):
        runs[name] = read_run(base, name)
    data = {k: json.loads((base / f"{k}.json").read_text()) for k in meta.get("data", [])}
    return meta, Artifacts(params=meta["params"], runs=runs, data=data, facts=meta.get("facts") or {})


def derive(base: Path) -> tuple[list[Row], dict]:
    """(rows, energy calibration) of the cell whose artifacts are in `base`."""
    meta, a = load(base)
    parsed = kinds.get(meta["payload"]).parse(a)
    rows = list(parsed.rows)
    ctx = dict(meta["context"])
    ctx.update(parsed.context)
    calibration: dict = {}
    if meta.get("telemetry"):
        more, calibration = _telemetry_rows(base, meta, parsed.phases, a.main.window, ctx)
        rows += more
    ctx["recorded_at"] = meta.get("recorded_at")
    for r in rows:
        r.context = ctx
    return rows, calibration


def _telemetry_rows(
    base: Path, meta: dict, phases: list, cell_window: tuple[float, float] | None, ctx: dict
) -> tuple[list[Row], dict]:
    """The rows of what was measured around the payload: the sampler's trace and the files sources pulled beside
    it, the snapshots before and after, the cooldown and baseline; the context they add goes into `ctx`."""
    trace = sampler_csv.parse(_read(base / "telemetry.csv"))
    summ = normalize.summarize(
        trace, phases, cell_window, sources.read_pulled(base), prior_calibration=meta.get("prior_calibration")
    )
    snap_start_rows, snap_start = snapshots.from_artifacts(base, "start")
    snap_end_rows, snap_end = snapshots.from_artifacts(base, "end")
    rows = summ.rows + snap_start_rows + snap_end_rows
    if sources.thermal_rose(snap_start, snap_end):
        summ.throttled = True  # the device's own thermal status rose during the cell
    if cell_window:
        rows.append(Row(metric="wall_seconds", value=cell_window[1] - cell_window[0], phase="cell"))
    if meta.get("cooldown"):
        rows.append(Row(**meta["cooldown"]))
    if meta.get("baseline") is not None:
        rows.append(Row(metric="temp_baseline", value=meta["baseline"], phase="cell"))
    ctx.update(
        temp_start_c=summ.temp_start_c,
        temp_end_c=summ.temp_end_c,
        throttled=summ.throttled,
        energy_calibration=summ.calibration or None,
    )
    return rows, summ.calibration


def reparse(led, recipe: str | None = None) -> tuple[int, int, list[str]]:
    """Rebuild every done cell's rows from its stored artifacts with today's parsers. A cell that cannot be
    re-derived keeps the rows it has, and says why. Returns (cells re-derived, rows, problems)."""
    n_cells = n_rows = 0
    problems: list[str] = []
    for c in led.done_cells(recipe):
        base = led.artifacts_dir / c["cell_id"] / f"attempt-{c['attempts']}"
        if not (base / CELL_JSON).is_file():
            if c["run_id"] != "import":
                problems.append(
                    f"{c['cell_id']} ({c['device']} {c['model']} {c['quant']} {c['payload']}): no "
                    f"{CELL_JSON} in {base} (recorded by an older devicelab); its rows are kept"
                )
            continue
        try:
            rows, _ = derive(base)
        except Exception as e:  # one cell's garbage is that cell's: its rows are kept
            problems.append(
                f"{c['cell_id']} ({c['device']} {c['model']} {c['quant']} {c['payload']}): "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; its rows are kept"
            )
            continue
        led.replace_rows(c["cell_id"], rows)
        n_cells += 1
        n_rows += len(rows)
    return n_cells, n_rows, problems
