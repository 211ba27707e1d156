"""Parse what device_payloads/sampler.sh wrote: '# ' meta lines, a header, one row per tick."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class SamplerTrace:
    frame: pd.DataFrame  # columns: tick, t_s (device clock, s) + one per source path
    meta: dict = field(default_factory=dict)  # source path -> {k: v} (its kind, type, counter range, …)
    interval_s: float = 0.1
    clock: str = "proc"
    pace: str = ""  # "readt" (no process per tick) or "sleep"; "" = not recorded
    pace_via: str = ""  # the shell the sampler moved itself to for `read -t` ("" = the one started)
    reader: str = ""  # who read the files: "awk" (one long-lived process) or "sh"

    def columns(self, pattern: str) -> list[str]:
        rx = re.compile(pattern)
        return [c for c in self.frame.columns if rx.fullmatch(c)]


def parse(text: str) -> SamplerTrace:
    meta: dict[str, dict] = {}
    interval, clock, pace, via, reader = 0.1, "proc", "", "", ""
    body = []
    for line in text.splitlines():
        if line.startswith("# "):
            parts = line[2:].split()
            if not parts:
                continue
            if parts[0].startswith("devicelab-sampler"):
                for p in parts[1:]:
                    if p.startswith("interval_ms="):
                        interval = int(p.split("=")[1]) / 1000
            elif parts[0] == "clock" and len(parts) > 1:
                clock = parts[1]
            elif parts[0] == "pace" and len(parts) > 1:
                pace = parts[1]
                kv = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
                via, reader = kv.get("via", ""), kv.get("reader", "")
            elif len(parts) >= 2:
                kv = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
                kv["kind"] = parts[0]
                # a label line for a file, or a description of a folder
                meta.setdefault(parts[1], {}).update(kv)
        elif line.strip():
            body.append(line)
    if not body:
        return SamplerTrace(pd.DataFrame(columns=["tick", "t_s"]), meta, interval, clock, pace, via, reader)
    # a tick line may be cut short if the device was killed mid-write: drop rows of the wrong width
    ncol = body[0].count(",")
    body = [body[0]] + [l for l in body[1:] if l.count(",") == ncol]
    df = pd.read_csv(io.StringIO("\n".join(body)), dtype=str, keep_default_na=False)
    out = pd.DataFrame({"tick": pd.to_numeric(df["tick"], errors="coerce")})
    t = pd.to_numeric(df["t_s"], errors="coerce")
    if t.isna().all():  # no sub-second clock on this device: reconstruct from the tick count
        t = out["tick"] * interval
    out["t_s"] = t
    for c in df.columns[2:]:
        col = df[c]
        num = pd.to_numeric(col, errors="coerce")
        out[c] = num if num.notna().sum() >= (col != "").sum() * 0.5 else col
    return SamplerTrace(out, meta, interval, clock, pace, via, reader)
