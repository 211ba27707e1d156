"""`devicelab serve`: a read-only live page of a lab folder, for the hours a run takes on several phones.

Everything the page shows is read on the server from the lab folder, by another process than the run's: the
ledger (runs, every cell's status, start and end, error, and the rows of the cells that finished) and `live.json`,
which `devicelab run` writes beside it as its lanes go (each device's current step, the stages, failures as they
happen, the recipe's recommend constraints). The browser keeps no state of its own: it opens a server-sent event
stream and shows the HTML fragments the server renders; a reload shows the same page. When the run has ended,
the finished run's explorer (devicelab report's page) is served at /report."""

from __future__ import annotations

import calendar
import html
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

LIVE_FILE = "live.json"
KEEP_STAGES = 30
E = html.escape


def _now() -> float:
    return time.time()


class LiveStatus:
    """What the CLI's event sink writes into the lab folder while a run goes (atomically: a reader never sees half
    a file): each lane's current step and since when, the last stages, failures as they happen."""

    def __init__(self, lab_dir: Path, recipe: str = "", recommend: dict | None = None):
        self.path = Path(lab_dir) / LIVE_FILE
        self._lock = threading.Lock()
        self.doc: dict[str, Any] = {
            "pid": os.getpid(),
            "recipe": recipe,
            "recommend": recommend or {},
            "started_at": _now(),
            "updated_at": _now(),
            "lanes": {},
            "stages": [],
            "failures": [],
            "progress": {},
        }
        self._write()

    def _write(self) -> None:
        self.doc["updated_at"] = _now()
        tmp = self.path.with_name(f".{LIVE_FILE}.{os.getpid()}.part")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.doc, default=str))
            tmp.replace(self.path)
        except OSError:
            pass  # the live page is a view: never fail a run for it

    def lane(self, device: str, text: str, cell_id: str | None = None) -> None:
        with self._lock:
            old = self.doc["lanes"].get(device, {})
            self.doc["lanes"][device] = {"text": text, "since": _now(), "cell": cell_id or old.get("cell")}
            self._write()

    def stage(self, text: str) -> None:
        with self._lock:
            self.doc["stages"] = [*self.doc["stages"], {"at": _now(), "text": text}][-KEEP_STAGES:]
            self._write()

    def progress(self, what: str, pct: float) -> None:
        with self._lock:
            if pct >= 100:
                self.doc["progress"].pop(what, None)
            else:
                self.doc["progress"][what] = round(pct, 1)
            self._write()

    def failed(self, device: str, label: str, cell_id: str, note: str) -> None:
        with self._lock:
            self.doc["failures"] = [
                *self.doc["failures"],
                {"at": _now(), "device": device, "label": label, "cell": cell_id, "note": note},
            ][-200:]
            self._write()

    def ended(self, text: str) -> None:
        with self._lock:
            self.doc["ended"] = {"at": _now(), "text": text}
            self._write()


# ---------------------------------------------------------------- reading the lab folder (another process)
def _ro(path: Path) -> sqlite3.Connection | None:
    if not path.is_file():
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5, check_same_thread=False)
    db.row_factory = sqlite3.Row
    return db


def _epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return float(calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _telemetry(db: sqlite3.Connection, cell_id: str) -> dict:
    """The last finished cell's telemetry: its peak temperature, mean power, peak RSS (or why missing)."""
    out = {}
    for r in db.execute(
        "SELECT metric, value, missing_reason FROM rows WHERE cell_id=? AND phase='cell' AND "
        "metric IN ('temp_max','power_mean','peak_rss')",
        (cell_id,),
    ):
        out[r["metric"]] = {"value": r["value"], "why": r["missing_reason"]}
    return out


def _lane(dev: str, cells: list[dict], run_id: str, live: dict, db: sqlite3.Connection) -> dict:
    done = [c for c in cells if c["status"] in ("done", "skipped")]
    failed = [c for c in cells if c["status"] in ("failed", "failed-retryable")]
    running = [c for c in cells if c["status"] == "running"]
    left = [c for c in cells if c["status"] in ("pending", "running")]
    took = [
        e - s
        for c in done
        if c["run_id"] == run_id
        for s, e in [(_epoch(c["started_at"]), _epoch(c["finished_at"]))]
        if s and e
    ] or [e - s for c in done for s, e in [(_epoch(c["started_at"]), _epoch(c["finished_at"]))] if s and e]
    per = sum(took) / len(took) if took else None
    cur = running[0] if running else None
    eta = 0.0 if not left else None
    if per is not None and left:
        eta = per * len(left)
        started = _epoch(cur["started_at"]) if cur else None
        if started:
            eta = max(eta - min(_now() - started, per), 0)
    last = max((c for c in done if c["finished_at"]), key=lambda c: c["finished_at"], default=None)
    lane_live = live.get("lanes", {}).get(dev, {})
    return {
        "device": dev,
        "total": len(cells),
        "done": len(done),
        "failed": len(failed),
        "running": cur,
        "step": lane_live.get("text", ""),
        "step_since": lane_live.get("since"),
        "seconds_left": eta,
        "per_cell_s": per,
        "last_cell": last,
        "telemetry": _telemetry(db, last["cell_id"]) if last else {},
    }


def state(lab_dir: Path) -> dict:
    """Everything the live page shows, read now from the lab folder."""
    lab_dir = Path(lab_dir)
    live = {}
    try:
        live = json.loads((lab_dir / LIVE_FILE).read_text())
    except (OSError, ValueError):
        pass
    db = _ro(lab_dir / "ledger.sqlite")
    if db is None:
        return {"lab_dir": str(lab_dir), "run": None, "lanes": [], "failures": [], "live": live, "at": _now()}
    try:
        run = db.execute("SELECT * FROM runs ORDER BY started_at DESC, rowid DESC LIMIT 1").fetchone()
        run = dict(run) if run else None
        cells = [
            dict(c)
            for c in db.execute(
                "SELECT cell_id, device, model, quant, payload, params, status, "
                "attempts, run_id, started_at, finished_at, error FROM cells WHERE "
                "recipe=? ORDER BY rowid",
                (run["recipe"] if run else "",),
            )
        ]
        if run:  # this run's cells: those it ran or has yet to run (not an older recipe version's leftovers)
            since = run["started_at"] or ""
            mine = [
                c
                for c in cells
                if c["run_id"] == run["run_id"]
                or c["status"] in ("pending", "running")
                or (c["finished_at"] or "") >= since
            ]
            cells = mine or cells
        by_dev: dict[str, list[dict]] = {}
        for c in cells:
            by_dev.setdefault(c["device"], []).append(c)
        lanes = [_lane(d, cs, run["run_id"] if run else "", live, db) for d, cs in by_dev.items()]
        failures = [c for c in cells if c["status"] in ("failed", "failed-retryable")]
        return {"lab_dir": str(lab_dir), "run": run, "lanes": lanes, "failures": failures, "live": live, "at": _now()}
    except sqlite3.DatabaseError as e:
        return {
            "lab_dir": str(lab_dir),
            "run": None,
            "lanes": [],
            "failures": [],
            "live": live,
            "at": _now(),
            "error": f"the ledger cannot be read now ({e})",
        }
    finally:
        db.close()


# ---------------------------------------------------------------- rendering (on the server)
def _dur(s: float | None) -> str:
    if s is None:
        return "unknown"
    s = int(round(s))
    return (
        f"{s // 3600} h {s % 3600 // 60:02d} min"
        if s >= 3600
        else (f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s")
    )


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) if t else "—"


def _tele(t: dict) -> str:
    def one(metric: str, label: str, fmt) -> str:
        v = t.get(metric)
        if not v:
            return f"{label} —"
        return f"{label} {fmt(v['value'])}" if v["value"] is not None else f"{label} — ({E(v['why'] or 'missing')})"

    return " · ".join(
        (
            one("temp_max", "peak temperature", lambda x: f"{x:.1f} °C"),
            one("power_mean", "mean power", lambda x: f"{x:.2f} W"),
            one("peak_rss", "peak RSS", lambda x: f"{x / 1024**2:.0f} MiB"),
        )
    )


def _lane_html(ln: dict) -> str:
    pct = 100 * (ln["done"] + ln["failed"]) / max(ln["total"], 1)
    cur = ln["running"]
    now = (
        f"<b>{E(cur['model'])} {E(cur['quant'])} {E(cur['payload'])}</b> (cell {E(cur['cell_id'])}, since "
        f"{_clock(_epoch(cur['started_at']))})"
        if cur
        else "no cell running"
    )
    last = ln["last_cell"]
    tele = (
        f"last finished cell {E(last['model'])} {E(last['quant'])} {E(last['payload'])} at "
        f"{_clock(_epoch(last['finished_at']))}: {_tele(ln['telemetry'])}"
        if last
        else "no cell finished yet"
    )
    return (
        f"<div class='lane' data-device='{E(ln['device'])}'><h3>{E(ln['device'])}</h3>"
        f"<progress max='{ln['total']}' value='{ln['done'] + ln['failed']}'></progress> "
        f"<span class='count'>{ln['done']} done, {ln['failed']} failed of {ln['total']} ({pct:.0f} %)</span>"
        f"<p class='step'>now: {E(ln['step'] or '—')}</p><p class='current'>{now}</p>"
        f"<p>time left: <span class='eta'>{_dur(ln['seconds_left'])}</span> (at {_dur(ln['per_cell_s'])} a "
        f"cell)</p><p class='telemetry'>{tele}</p></div>"
    )


def fragment(st: dict) -> str:
    """The live part of the page, rendered from `state`."""
    run, live = st["run"], st["live"]
    if run is None:
        head = f"<p>No run in {E(st['lab_dir'])} yet{': ' + E(st['error']) if st.get('error') else ''}.</p>"
    else:
        ended = run["status"] != "running"
        head = (
            f"<p class='run' data-status='{E(run['status'])}'>run <b>{E(run['run_id'])}</b> of recipe "
            f"<b>{E(run['recipe'])}</b>: {E(run['status'])} (started {E(run['started_at'] or '—')}"
            f"{', finished ' + E(run['finished_at']) if run['finished_at'] else ''})"
            + (" — <a href='report'>open the finished run's explorer</a>" if ended else "")
            + "</p>"
        )
    prog = "".join(f"<li>{E(k)}: {v:.0f} %</li>" for k, v in live.get("progress", {}).items())
    fails = "".join(
        f"<li class='failure' data-cell='{E(c['cell_id'])}'><b>{E(c['device'])} {E(c['model'])} "
        f"{E(c['quant'])} {E(c['payload'])}</b> ({E(c['status'])}): {E(c['error'] or '')}</li>"
        for c in st["failures"]
    )
    stages = "".join(f"<li>{_clock(s['at'])} {E(s['text'])}</li>" for s in live.get("stages", [])[-8:])
    return (
        head
        + "".join(_lane_html(ln) for ln in st["lanes"])
        + (f"<h3>Host work</h3><ul>{prog}</ul>" if prog else "")
        + f"<h3>Failures</h3><ul id='failures'>{fails or '<li>none</li>'}</ul>"
        + (f"<h3>Recent steps</h3><ul class='stages'>{stages}</ul>" if stages else "")
        + f"<p class='note'>read from {E(st['lab_dir'])} at {_clock(st['at'])} UTC</p>"
    )


PAGE = """<!doctype html><html lang='en'><head><meta charset='utf-8'><title>devicelab: {lab}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222}}
.lane{{border-left:3px solid #7a7;padding:.2em .8em;margin:.8em 0}}.lane h3{{margin:.2em 0}}
progress{{width:20em}}.failure{{color:#a33}}.note{{font-size:12px;color:#666}}p{{margin:.3em 0}}</style></head>
<body><h1>devicelab: {lab}</h1><div id='live'>{body}</div>
<script>
/* the server renders every state; this only shows the latest fragment it sends */
const es = new EventSource('events');
es.addEventListener('state', (e) => {{ document.getElementById('live').innerHTML = e.data; }});
</script></body></html>"""


def app(lab_dir: Path, interval: float = 0.5):
    """The Starlette application: / (the live page), /events (server-sent events: the page's fragment whenever
    it changes), /state.json, /report (the latest run's explorer)."""
    import asyncio

    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    lab_dir = Path(lab_dir)

    async def index(request):
        st = await asyncio.to_thread(state, lab_dir)
        return HTMLResponse(PAGE.format(lab=E(str(lab_dir)), body=fragment(st)))

    async def events(request):
        async def gen():
            last = None
            while not await request.is_disconnected():
                body = fragment(await asyncio.to_thread(state, lab_dir))
                core = body.rsplit("<p class='note'>", 1)[0]  # not the clock line: only real changes
                if core != last:
                    last = core
                    yield {"event": "state", "data": body}
                await asyncio.sleep(interval)

        return EventSourceResponse(gen(), ping=15)

    async def state_json(request):
        return JSONResponse(json.loads(json.dumps(await asyncio.to_thread(state, lab_dir), default=str)))

    async def report(request):
        return HTMLResponse(await asyncio.to_thread(explorer, lab_dir))

    async def favicon(request):
        return Response(status_code=204)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/events", events),
            Route("/state.json", state_json),
            Route("/report", report),
            Route("/favicon.ico", favicon),
        ]
    )


def explorer(lab_dir: Path) -> str:
    """The latest run's explorer (devicelab report's page), with the constraints its recipe gave."""
    from .ledger import ledger_path
    from .ledger_query import Selection, frame
    from .ledger_schema import connect
    from .recipes import RecommendSpec
    from .report import page

    st = state(lab_dir)
    if st["run"] is None:
        return "<!doctype html><p>No run in this lab folder yet.</p>"
    recipe = st["run"]["recipe"]
    live = st["live"]
    spec = (
        RecommendSpec(**live["recommend"])
        if live.get("recipe") == recipe and live.get("recommend")
        else RecommendSpec()
    )
    db = connect(ledger_path(lab_dir), readonly=True)
    try:
        rows = frame(db, Selection(recipe=recipe))
    finally:
        db.close()
    return page(rows, spec, Path(lab_dir) / "artifacts", title=f"devicelab report: {recipe}")


def serve(lab_dir: Path, host: str = "127.0.0.1", port: int = 8765, say=print) -> None:
    import uvicorn

    say(f"serving {lab_dir} read-only at http://{host}:{port}/ (Ctrl-C stops)")
    uvicorn.run(app(lab_dir), host=host, port=port, log_level="warning")
