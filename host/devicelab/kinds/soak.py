"""Sustained speed (kind: soak, a soak test): generation for `duration_s` without a pause, as a phone runs a long
chat — llama-bench's one generation test queued many times over (one model load; each test prints its JSONL line as
it ends, so each repetition has its own time on the device clock), stopped by run_payload.sh at the duration
(DEVICELAB_LIMIT_S).

Rows: t/s in each of WINDOWS equal slices of the run (fewer where fewer repetitions ran; each with its energy
and hottest zone from the telemetry);
burst (the first `burst_s`), sustained (the last quarter), stability = sustained ÷ burst (3DMark's stress-test
figure), and the time to the first throttle: the start of the first slice whose speed fell below
THROTTLE × burst (missing, with the reason, where none did)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ..errors import DevicelabError
from ..schema import Row, missing
from ..telemetry.normalize import Phase
from . import bench
from .base import Artifacts, CellParams, Kind, Parsed, Prepared, Spec, register

WINDOWS = 20  # slices of the run a speed and a temperature are given for
THROTTLE = 0.9  # a slice below this share of the burst speed has throttled
SUSTAINED_METRICS = ("burst_tps", "sustained_tps", "stability", "time_to_throttle", "sustained_seconds")
MAX_TPS = 2000  # a ceiling on decode speed: the tests queued are enough to last duration_s at this speed


class SoakCell(CellParams):
    gen: int = Field(default=128, ge=1)  # tokens a repetition generates
    duration_s: float = Field(default=600, gt=0)
    burst_s: float = Field(default=60, gt=0)
    threads: int | Literal["auto"] = "auto"


class SoakSpec(Spec, SoakCell):
    model_config = ConfigDict(extra="forbid", frozen=False)
    kind: Literal["soak"]

    @model_validator(mode="after")
    def _burst_inside(self):
        if self.burst_s > self.duration_s / 2:
            raise ValueError(
                f"burst_s {self.burst_s:g} is over half of duration_s {self.duration_s:g}: the burst is the run's "
                "first minute or so, the sustained speed its last quarter"
            )
        return self


def repetitions(tests: list[bench.BenchTest], start: float) -> list[tuple[float, float, float, int]]:
    """(start, end, tok/s, tokens) of each repetition (bench.parse's tests), on the run's clock from its start (its
    line's arrival time less its own duration)."""
    out = []
    for bt in tests:
        w = bt.window()
        if w is None or bt.kind != "decode":
            continue
        out.append((w[0] - start, w[1] - start, float(bt.record["avg_ts"]), int(bt.record["n_gen"])))
    return out


def summary(reps: list[tuple[float, float, float, int]], c: SoakCell) -> tuple[list[Row], list[Phase]]:
    """The rows and the telemetry windows (on the run's clock) of a run's repetitions. Pure."""
    if not reps:
        raise DevicelabError("the soak run printed no generation result; see the cell's stderr.txt")
    end = max(r[1] for r in reps)
    test = f"tg{c.gen}"
    kw: dict[str, Any] = dict(test=test, phase="sustained", n_gen=c.gen)

    def speed(sel: list) -> float:  # tokens over the time they took: a slow repetition weighs its length
        return sum(r[3] for r in sel) / sum(r[1] - r[0] for r in sel)

    rows, phases = [], []
    n = min(WINDOWS, len(reps))  # no more slices than repetitions (a slow device's short run)
    width = end / n
    digits = 0 if width >= 5 else 1 if width >= 0.5 else 2  # slice names stay apart however short the run
    for i in range(n):
        a, b = i * width, (i + 1) * width
        sel = [r for r in reps if a <= r[1] < b or (i == n - 1 and r[1] == b)]
        name = f"{test}@{a:.{digits}f}-{b:.{digits}f}s"
        if sel:
            one: dict[str, Any] = dict(test=name, phase="window", n_gen=c.gen, n=len(sel), samples=[r[2] for r in sel])
            rows.append(Row(metric="window_tps", value=speed(sel), **one))
        else:
            rows.append(missing("window_tps", "no repetition ended in this slice", test=name, phase="window"))
        phases.append(Phase(name, "window", a, b, sum(r[3] for r in sel), len(sel), temperature=True))
    burst = [r for r in reps if r[1] <= c.burst_s] or reps[:1]
    last = [r for r in reps if r[0] >= end * 0.75] or reps[-1:]
    b, s = speed(burst), speed(last)
    rows += [
        Row(metric="burst_tps", value=b, n=len(burst), samples=[r[2] for r in burst], **kw),
        Row(metric="sustained_tps", value=s, n=len(last), samples=[r[2] for r in last], **kw),
        Row(metric="stability", value=s / b, **kw),
        Row(metric="sustained_seconds", value=end, n=len(reps), **kw),
    ]
    slow = next(
        (r for r in rows if r.metric == "window_tps" and r.value < THROTTLE * b and _start(r.test) >= c.burst_s), None
    )
    if slow is None:
        rows.append(
            missing("time_to_throttle", f"no slice fell below {THROTTLE:.0%} of the burst speed in {end:.0f} s", **kw)
        )
    else:
        rows.append(Row(metric="time_to_throttle", value=_start(slow.test), **kw))
    phases.append(Phase(test, "sustained", 0.0, end, sum(r[3] for r in reps), len(reps)))
    return rows, phases


def _start(window_test: str) -> float:
    return float(window_test.rsplit("@", 1)[1].split("-")[0])


@register
class Soak(Kind[SoakCell]):
    name = "soak"
    cell = SoakCell
    spec = SoakSpec
    key_properties = (*Kind.key_properties, "threads", "n_gen")
    shape_properties = (*Kind.shape_properties, "n_gen")

    def tools(self, params):
        return ("llama-bench",)

    def label(self, params):
        c = self.typed(params)
        return f"tg{c.gen} for {c.duration_s:g} s t={c.threads}"

    def prepare(self, cx, cell):
        c = self.typed(cell.params)
        threads = c.threads if c.threads != "auto" else int(cx.facts.get("cpu_count") or 1)
        queued = min(20_000, math.ceil(c.duration_s * MAX_TPS / c.gen) + 1)
        p = bench.BenchParams(prompt=(), gen=(c.gen,) * queued, threads=threads, repetitions=1)
        return Prepared(
            [("main", bench.argv(cx.tool("llama-bench"), cx.model(), p))],
            env={"DEVICELAB_LIMIT_S": str(math.ceil(c.duration_s))},
        )

    def parse(self, a: Artifacts) -> Parsed:
        c = self.typed(a.params)
        win = a.main.window
        if win is None:
            raise DevicelabError("the soak run kept no clock (run_payload.sh's clock file); it cannot be timed")
        tests = bench.parse(a.main.stdout)
        rows, phases = summary(repetitions(tests, win[0]), c)
        for p in phases:  # the telemetry's clock is the device's
            p.start, p.end = p.start + win[0], p.end + win[0]
        # one -t for every queued test: the threads the first record says
        threads = next((int(t.record["n_threads"]) for t in tests if t.record.get("n_threads") is not None), None)
        for r in rows:
            r.threads = threads
        return Parsed(rows, phases)
