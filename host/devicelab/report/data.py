"""What the explorer plots, as plain JSON-able records: every point with the fields the filters follow (device,
model, backend, quant, run) and its provenance as hover text; the frontier per device with each candidate's
verdict; the roofline; the telemetry traces of each cell on the wall clock with its phases."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import cast

import pandas as pd

from ..analysis import roofline
from ..recommend import DeviceRecommendation
from ..telemetry import normalize, sampler_csv

FILTERS = ("device", "model", "backend", "quant", "run")
SPEED = ("prefill_tps", "decode_tps")
QUALITY = ("kld_mean", "ppl_ratio")
MAX_TRACE_POINTS = 400  # per cell and series: a trace is downsampled to this many ticks


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _s(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _fmt(v, f: str = "{:.4g}") -> str:
    n = _num(v)
    return "—" if n is None else f.format(n)


# what a point's provenance, filters and figures read of its row
PROVENANCE = (
    *("run_id", "cell_id", "recorded_at", "device", "target", "lab_host", "backend", "build_commit", "build_key"),
    *("model", "quant", "bpw", "model_sha256", "payload", "test", "phase", "threads", "metric", "value", "unit"),
    *("stddev", "n", "temp_start_c", "temp_end_c", "throttled"),
)


def _provenanced(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with only the columns a point reads: each row's record is built from those alone."""
    return rows[[c for c in rows.columns if c in PROVENANCE]]


def provenance(r: pd.Series) -> str:
    """A row's provenance as hover text (HTML lines): cell, run, device, build, model file, conditions."""
    temps = f"temps {_fmt(r.get('temp_start_c'), '{:.1f}')} → {_fmt(r.get('temp_end_c'), '{:.1f}')} °C"
    said: dict[bool | None, str] = {True: "throttled", False: "not throttled"}
    throttled = said.get(_bool(r.get("throttled")), "throttle unknown")
    head = f"{r['device']} · {r['model']} {r['quant']} ({_s(r.get('payload'))} {_s(r.get('test'))})"
    lines = [
        f"{r['metric']} = {_fmt(r['value'])} {_s(r.get('unit'))} ± {_fmt(r.get('stddev'))} (n={_s(r.get('n'))})",
        f"cell {r['cell_id']} · run {_s(r.get('run_id'))}",
        f"llama.cpp {_s(r.get('build_commit'))[:12]} · build {_s(r.get('build_key'))} · {_s(r.get('target'))}",
        f"backend {_s(r.get('backend')) or '—'} · threads {_s(r.get('threads')) or '—'} · lab host "
        f"{_s(r.get('lab_host')) or '—'}",
        f"model {_fmt(r.get('bpw'), '{:.2f}')} bpw · sha256 {_s(r.get('model_sha256'))[:12]}",
        f"{temps} · {throttled}",
        f"recorded {_s(r.get('recorded_at'))}",
    ]
    return f"<b>{html.escape(head)}</b><br>" + "<br>".join(html.escape(x) for x in lines)


def _bool(v) -> bool | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return bool(v)


def _keys(r: pd.Series) -> dict:
    return {
        "device": _s(r["device"]),
        "model": _s(r["model"]),
        "backend": _s(r.get("backend")) or "—",
        "quant": _s(r["quant"]),
        "run": _s(r.get("run_id")),
    }


def points(rows: pd.DataFrame) -> list[dict]:
    """Every speed, quality and energy row that has a value, against its file's bits per weight."""
    keep = rows[
        rows["metric"].isin((*SPEED, *QUALITY, "energy_per_token")) & rows["value"].notna() & rows["bpw"].notna()
    ]
    if "cpu_quota" in keep:
        keep = keep[keep["cpu_quota"].isna() & (keep["contention"].fillna(0) == 0)]
    out = []
    for _, r in _provenanced(keep).iterrows():
        out.append(
            {
                **_keys(r),
                "metric": r["metric"],
                "phase": _s(r.get("phase")),
                "x": float(r["bpw"]),
                "y": float(r["value"]),
                "sd": _num(r.get("stddev")),
                "threads": _s(r.get("threads")),
                "cell": r["cell_id"],
                "hover": provenance(r),
            }
        )
    return out


def sustained(rows: pd.DataFrame) -> list[dict]:
    """Per sustained run (a cell of kind soak): t/s and the hottest zone in each slice of the run against its
    time from the start, with the burst, sustained and stability figures. From rows alone (an exported table too)."""
    win = rows[(rows["phase"] == "window") & rows["metric"].isin(("window_tps", "temp_max"))]
    runs = dict(tuple(rows[rows["phase"] == "sustained"].groupby("cell_id", sort=False)))
    out = []
    for cell, g in win.groupby("cell_id", sort=False):
        t = g["test"].astype(str).str.extract(r"@([\d.]+)-([\d.]+)s$").astype(float).mean(axis=1)
        g = g.assign(t=t).sort_values("t")
        tps, temp = g[(g["metric"] == "window_tps") & g["value"].notna()], g[g["metric"] == "temp_max"]
        if tps.empty:
            continue
        one = runs.get(cell, rows.iloc[0:0])
        fig = {m: _num(v) for m, v in zip(one["metric"], one["value"], strict=True)}
        why = one.loc[one["metric"] == "time_to_throttle", "missing_reason"].dropna()
        r = tps.iloc[0]
        out.append(
            {
                **_keys(r),
                "cell": cell,
                "label": f"{r['device']} {r['model']} {r['quant']} {_s(r.get('test')).split('@')[0]}",
                "t": [round(float(v), 2) for v in tps["t"]],
                "tps": [round(float(v), 3) for v in tps["value"]],
                "temp_t": [round(float(v), 2) for v in temp["t"][temp["value"].notna()]],
                "temp": [round(float(v), 2) for v in temp["value"].dropna()],
                "temp_missing": _s(temp["missing_reason"].dropna().iloc[0])
                if temp["value"].isna().all() and len(temp)
                else "",
                "burst": fig.get("burst_tps"),
                "sustained": fig.get("sustained_tps"),
                "stability": fig.get("stability"),
                "throttle_s": fig.get("time_to_throttle"),
                "throttle_missing": _s(why.iloc[0]) if len(why) else "",
                "hover": provenance(r),
            }
        )
    return out


def missing(rows: pd.DataFrame, metric: str) -> str:
    """Why a metric has no value anywhere (its rows' missing_reason), or ''."""
    m = rows[(rows["metric"] == metric) & rows["value"].isna()]
    if m.empty or "missing_reason" not in m:
        return ""
    reasons = m["missing_reason"].dropna().unique()
    return "; ".join(str(x) for x in reasons[:2])


def frontier(recs: list[DeviceRecommendation], rows: pd.DataFrame) -> list[dict]:
    """Every candidate per device: size, decode, quality, energy; the pick, the frontier and why each lost."""
    runs, cells, commits = (_distinct(rows, c) for c in ("run_id", "cell_id", "build_commit"))
    out = []
    for rec in recs:
        for c in rec.candidates:
            role = "pick" if c is rec.pick else ("frontier" if c.on_frontier else ("passes" if c.passes else "lost"))
            why = c.verdict if c is rec.pick else (c.verdict or "passes")
            hover = (
                f"<b>{html.escape(rec.device)}: {html.escape(c.label)}</b> — {role}<br>"
                f"{c.model_bytes / 1024**2:.0f} MiB · {c.bpw:.2f} bpw · decode {_fmt(c.decode_tps, '{:.1f}')} "
                f"t/s · KLD {_fmt(c.kld_mean)} · PPL ratio {_fmt(c.ppl_ratio, '{:.4f}')} · "
                f"{_fmt(c.energy_per_token)} J/tok<br>"
                + ("why it lost: " if role in ("lost", "passes", "frontier") and c is not rec.pick else "")
                + "<br>".join(html.escape(x) for x in why.split("; "))
                + "<br>"
                + html.escape(
                    _cells_line(
                        cells.get((rec.device, c.model, c.quant), []),
                        runs.get((rec.device, c.model, c.quant), []),
                        commits.get((rec.device, c.model, c.quant), []),
                    )
                )
            )
            out.append(
                {
                    "device": rec.device,
                    "model": c.model,
                    "backend": c.backend or "—",
                    "quant": c.quant,
                    "runs": runs.get((rec.device, c.model, c.quant), []),
                    "mib": c.model_bytes / 1024**2,
                    "bpw": c.bpw,
                    "decode": c.decode_tps,
                    "kld_mean": c.kld_mean,
                    "energy": c.energy_per_token,
                    "wh": c.wh_per_prompt,
                    "role": role,
                    "on_frontier": c.on_frontier,
                    "verdict": why,
                    "hover": hover,
                }
            )
    return out


def _distinct(rows: pd.DataFrame, col: str) -> dict[tuple, list]:
    """Per (device, model, quant): the distinct values of a column, sorted."""
    keys = ["device", "model", "quant"]
    d = rows[[*keys, col]].dropna().drop_duplicates()
    out: dict[tuple, list] = {}
    for dev, model, quant, v in zip(*(d[c] for c in (*keys, col)), strict=True):
        out.setdefault((dev, model, quant), []).append(v)
    return {k: sorted(v) for k, v in out.items()}


def _cells_line(cells: list, runs: list, commits: list) -> str:
    more = f" and {len(cells) - 6} more" if len(cells) > 6 else ""
    return (
        f"cells {', '.join(cells[:6])}{more} · run {', '.join(runs) or '—'} · llama.cpp "
        f"{', '.join(c[:12] for c in commits) or '—'}"
    )


def roofline_points(rows: pd.DataFrame) -> list[dict]:
    """Each bench row against its device's limit; its hover the row's own provenance."""
    rl = roofline(rows)
    if rl.empty or rl["limit_tps"].isna().all():
        return []
    key = ["device", "model", "quant", "metric", "test", "threads"]
    src = rows[rows["metric"].isin(SPEED) & rows["value"].notna()]
    prov = {(*(_s(r[k]) for k in key), round(float(r["value"]), 6)): r for _, r in _provenanced(src).iterrows()}
    out = []
    for r in rl.itertuples():
        if _num(r.limit_tps) is None:
            continue  # a device with no bandwidth measured has no roof
        # roofline()'s numeric columns (pandas' stubs type a row's fields as any scalar, text and dates too)
        tps, bpw = float(cast(float, r.tps)), float(cast(float, r.bpw))
        row = prov.get((*(_s(getattr(r, k)) for k in key), round(tps, 6)))
        head = (
            f"{r.tps:.1f} t/s of a {_fmt(r.limit_tps, '{:.1f}')} t/s limit ({_fmt(r.efficiency, '{:.0%}')}, "
            f"{r.bound}-bound)"
        )
        out.append(
            {
                "device": r.device,
                "model": r.model,
                "quant": r.quant,
                "x": bpw,
                "metric": r.metric,
                "tps": tps,
                "limit": _num(r.limit_tps),
                "eff": _num(r.efficiency),
                "threads": _s(r.threads),
                "bound": r.bound,
                **({"backend": _keys(row)["backend"], "run": _keys(row)["run"]} if row is not None else {}),
                "hover": html.escape(head) + ("<br>" + provenance(row) if row is not None else ""),
            }
        )
    return out


def _phases(base: Path) -> list[dict]:
    """The cell's phase windows (device clock) as its kind's parser finds them; [] when it cannot."""
    from .. import kinds
    from ..runner import artifacts as ra

    try:
        meta, a = ra.load(base)
        return [
            {"name": p.name, "kind": p.kind, "start": p.start, "end": p.end}
            for p in kinds.get(meta["payload"]).parse(a).phases
            if p.kind in ("prefill", "decode", "pg")
        ]
    except Exception:  # a trace without its phases is still a trace
        return []


def _clock(base: Path) -> tuple[float, float] | None:
    kv = (
        dict(x.split("=", 1) for x in (base / "clock").read_text().splitlines() if "=" in x)
        if (base / "clock").is_file()
        else {}
    )
    try:
        return float(kv["start_s"]), float(kv["start_epoch"])
    except (KeyError, ValueError):
        return None


def _series(t: pd.Series, y: pd.Series, scale: float = 1.0) -> dict | None:
    ok = y.notna()
    if not ok.any():
        return None
    t, y = t[ok], y[ok] * scale
    step = max(1, len(t) // MAX_TRACE_POINTS)
    return {"t": [round(v, 3) for v in t.iloc[::step]], "y": [round(float(v), 3) for v in y.iloc[::step]]}


def trace(cell: pd.Series, base: Path) -> dict | None:
    """One cell's telemetry on the wall clock (epoch seconds): RSS, hottest zone, CPU clock, power; its phases."""
    csv = base / "telemetry.csv"
    clock = _clock(base)
    if not csv.is_file() or clock is None:
        return None
    tr = sampler_csv.parse(csv.read_text(errors="replace"))
    df = tr.frame
    if len(df) < 2:
        return None
    off = clock[1] - clock[0]  # device clock → epoch
    t = df["t_s"] + off
    rss = tr.columns(r"proc/\d+/VmRSS_kB")
    series = {
        "rss_mib": _series(t, df[rss[0]], 1 / 1024) if rss else None,
        "temp_c": _series(t, normalize.hottest_c(tr)),
        "cpu_ghz": _series(t, normalize.cpu_freq_hz(tr), 1e-9),
    }
    phases = [{**p, "start": p["start"] + off, "end": p["end"] + off} for p in _phases(base)]
    return {
        **_keys(cell),
        "cell": cell["cell_id"],
        "payload": _s(cell.get("payload")),
        "label": f"{cell['device']} {cell['model']} {cell['quant']} {cell.get('payload')}",
        "throttled": _bool(cell.get("throttled")),
        "series": {k: v for k, v in series.items() if v},
        "phases": phases,
        "start": float(t.iloc[0]),
        "end": float(t.iloc[-1]),
        "hover": provenance(cell),
    }


def traces(rows: pd.DataFrame, artifacts: Path | None) -> list[dict]:
    if artifacts is None or not Path(artifacts).exists() or rows.empty:
        return []
    out = []
    cells = rows[rows["model_bytes"].notna()].drop_duplicates("cell_id")
    for _, c in cells.iterrows():
        tries = sorted(
            (Path(artifacts) / c["cell_id"]).glob("attempt-*/telemetry.csv"),
            key=lambda p: int(p.parent.name.split("-")[1]),
        )
        if tries:
            t = trace(c, tries[-1].parent)
            if t:
                out.append(t)
    return sorted(out, key=lambda t: t["start"])


def filter_values(rows: pd.DataFrame) -> dict:
    """The values each filter offers, in a stable order."""
    per_model = rows[rows["model_bytes"].notna()] if "model_bytes" in rows else rows
    rows = per_model if not per_model.empty else rows  # a device-level row (membw) is no model's
    if rows.empty:
        return {k: [] for k in FILTERS}
    out = {}
    for k, col in zip(FILTERS, ("device", "model", "backend", "quant", "run_id"), strict=True):
        vals = rows[col].fillna("—").astype(str) if col in rows else pd.Series(["—"])
        if k == "quant":
            order = rows.drop_duplicates("quant").sort_values("bpw", ascending=False)["quant"].astype(str)
            out[k] = list(dict.fromkeys(order))
        else:
            out[k] = sorted(set(vals) - {""})
    return out


def dumps(obj) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(obj, default=str, separators=(",", ":")).replace("</", "<\\/")
