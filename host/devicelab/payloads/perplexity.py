"""llama-perplexity: base logits (made once on the host) and KL divergence of a quant against them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import DevicelabError
from ..schema import Row, missing


@dataclass(frozen=True)
class KLDParams:
    ctx: int = 128
    chunks: int = 8
    threads: int = 2
    batch: int | None = None


def base_argv(bin_: str, base_model: str, text: str, logits_out: str, p: KLDParams) -> list[str]:
    a = [bin_, "-m", base_model, "-f", text, "-c", str(p.ctx), "--chunks", str(p.chunks), "-t", str(p.threads),
         "--kl-divergence-base", logits_out]
    if p.batch:
        a += ["-b", str(p.batch)]
    return a


def kld_argv(bin_: str, model: str, logits: str, p: KLDParams) -> list[str]:
    a = [bin_, "-m", model, "-c", str(p.ctx), "--chunks", str(p.chunks), "-t", str(p.threads),
         "--kl-divergence-base", logits, "--kl-divergence"]
    if p.batch:
        a += ["-b", str(p.batch)]
    return a


_NUM = r"([-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf))"
PATTERNS = {
    "ppl": rf"Mean PPL\(Q\)\s*:\s*{_NUM}\s*±\s*{_NUM}",
    "ppl_base": rf"Mean PPL\(base\)\s*:\s*{_NUM}\s*±\s*{_NUM}",
    "ln_ppl_ratio": rf"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*{_NUM}\s*±\s*{_NUM}",
    "ppl_ratio": rf"Mean PPL\(Q\)/PPL\(base\)\s*:\s*{_NUM}\s*±\s*{_NUM}",
    "kld_mean": rf"Mean\s+KLD:\s*{_NUM}\s*±\s*{_NUM}",
    "kld_max": rf"Maximum KLD:\s*{_NUM}",
    "kld_p99": rf"99\.0%\s+KLD:\s*{_NUM}",
    "kld_p90": rf"90\.0%\s+KLD:\s*{_NUM}",
    "kld_median": rf"Median\s+KLD:\s*{_NUM}",
    "rms_dp": rf"RMS Δp\s*:\s*{_NUM}\s*±\s*{_NUM}\s*%",
    "same_top_p": rf"Same top p:\s*{_NUM}\s*±\s*{_NUM}\s*%",
}
PERCENT = {"rms_dp", "same_top_p"}
FINAL = re.compile(rf"Final estimate: PPL = {_NUM} \+/- {_NUM}")


def parse_kld(text: str, p: KLDParams) -> list[Row]:
    if "KL divergence statistics" not in text and "Mean    KLD" not in text:
        tail = "\n".join(text.strip().splitlines()[-3:])
        raise DevicelabError(f"llama-perplexity printed no KL divergence statistics ({tail[:200]})")
    out = []
    for metric, pat in PATTERNS.items():
        m = re.search(pat, text)
        common = dict(test=f"kld@c{p.ctx}x{p.chunks}", phase="perplexity", ctx=p.ctx, n=p.chunks, threads=p.threads)
        if not m:
            out.append(missing(metric, "not printed by llama-perplexity", **common))
            continue
        v = float(m.group(1))
        sd = float(m.group(2)) if m.lastindex and m.lastindex >= 2 else None
        if sd is not None and sd != sd:   # llama-perplexity prints '-nan' for the spread of identical logits
            sd = None
        if metric in PERCENT:
            v, sd = v / 100, (sd / 100 if sd is not None else None)
        out.append(Row(metric=metric, value=v, stddev=sd, **common))
    return out


def parse_base_ppl(text: str) -> float | None:
    m = FINAL.search(text)
    return float(m.group(1)) if m else None
