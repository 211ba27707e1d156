"""Roofline payload: streaming-read bandwidth and an FMA compute peak (device_payloads/membw.c, built per
target). A property of the device: one cell per device, not per model."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import ConfigDict, Field

from ..errors import DevicelabError
from ..schema import Row
from .base import FILE, Artifacts, CellParams, Kind, Parsed, Prepared, Spec, host_op, register, timed_lines

EXE = "membw-exe"


@host_op(EXE, FILE, mode=0o755)
def membw_exe(host, manifest: dict):
    """device_payloads/membw.c built for a build's target (its manifest), on the host."""
    from ..build import payloads

    return payloads.ensure_c_payload("membw", manifest, "bandwidth")


class MembwCell(CellParams):
    """A membw cell's parameters (the payload sweeps nothing: its spec's fields)."""

    mib: int = Field(default=512, ge=16)
    threads: int | None = Field(default=None, ge=1)
    repetitions: int = Field(default=5, ge=1)


class MembwSpec(Spec, MembwCell):
    model_config = ConfigDict(extra="forbid", frozen=False)
    kind: Literal["membw"]


def membw_rows(stdout: str) -> list[Row]:
    for _, line in timed_lines(stdout):
        line = line.strip()
        if line.startswith("{"):
            try:
                r = json.loads(line)
                kw = dict(
                    test=f"read {int(r['buffer_bytes']) >> 20} MiB", phase="roofline", threads=r["threads"], n=r["reps"]
                )
                return [
                    Row(metric="mem_bandwidth", value=float(r["read_bytes_per_s"]), **kw),
                    Row(metric="peak_flops", value=float(r["fma_flops_per_s"]), **kw),
                ]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise DevicelabError(f"membw printed a line devicelab cannot read ({type(e).__name__}: {e})") from None
    raise DevicelabError("membw printed no result")


@register
class Membw(Kind[MembwCell]):
    name = "membw"
    key_properties = (*Kind.key_properties, "threads")
    spec = MembwSpec
    cell = MembwCell
    per_model = False

    def prepare(self, cx, cell):
        c = self.typed(cell.params)
        exe = cx.push(cx.host_op(EXE, cx.build.manifest), mode="755", name="membw")
        threads = c.threads or cx.facts.get("cpu_count") or 1
        return Prepared([("main", [exe, "-m", str(c.mib), "-r", str(c.repetitions), "-t", str(threads)])])

    def parse(self, a: Artifacts) -> Parsed:
        return Parsed(membw_rows(a.main.stdout))
