"""Task evals. Route 'device-mc': llama-perplexity's --hellaswag / --winogrande / --multiple-choice on the
device, with a data file in llama.cpp's formats. (lm-eval through llama-server is for generation tasks
only: llama-server's completions return no prompt logprobs, so log-likelihood tasks scored that way sit at
chance — that combination is refused.)"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import DevicelabError
from ..schema import Row, missing

FLAGS = {"hellaswag": ("--hellaswag", "--hellaswag-tasks"), "winogrande": ("--winogrande", "--winogrande-tasks"),
         "multiple-choice": ("--multiple-choice", "--multiple-choice-tasks")}


def resolve_data(spec: str) -> Path:
    p = Path(spec).expanduser()
    if not p.exists():
        raise DevicelabError(f"eval data {spec} not found; give a task file in llama.cpp's format")
    return p


def device_mc_argv(tool: str, model: str, data: str, P: dict, threads: int) -> list[str]:
    flag, count = FLAGS[P["task"]]
    a = [tool, "-m", model, "-f", data, flag, "-c", str(P["ctx"]), "-t", str(threads), "-b", str(max(512, P["ctx"]))]
    if P.get("tasks"):
        a += [count, str(P["tasks"])]
    return a


_HS = re.compile(r"^(\d+)\t([\d.]+)%\t\[", re.M)
_WG = re.compile(r"Final Winogrande score\((\d+) tasks\): ([\d.]+) \+/- ([\d.]+)")
_MC = re.compile(r"Final result: ([\d.]+) \+/- ([\d.]+)")


def parse_device_mc(text: str, P: dict) -> list[Row]:
    kw = dict(test=f"{P['task']}:{Path(P['data']).name}", phase="eval", ctx=P["ctx"])
    if P["task"] == "hellaswag":
        m = _HS.findall(text)
        if not m:
            return [missing("accuracy", "llama-perplexity printed no hellaswag score", **kw)]
        n, acc = m[-1]
        return [Row(metric="accuracy", value=float(acc) / 100, n=int(n), **kw)]
    rx = _WG if P["task"] == "winogrande" else _MC
    m = rx.search(text)
    if not m:
        return [missing("accuracy", f"llama-perplexity printed no {P['task']} score", **kw)]
    if P["task"] == "winogrande":
        return [Row(metric="accuracy", value=float(m.group(2)) / 100, stddev=float(m.group(3)) / 100,
                    n=int(m.group(1)), **kw)]
    return [Row(metric="accuracy", value=float(m.group(1)) / 100, stddev=float(m.group(2)) / 100, **kw)]
