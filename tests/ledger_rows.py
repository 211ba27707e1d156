"""A small lab history written through a Ledger's own API, for the ledger tests and their version-1 fixture.

`populate(Ledger, Cell, Row, path)` takes the classes so the same history can be written by the previous
devicelab (tests/fixtures/ledger-v1.sql was made by it: `python tests/ledger_rows.py OUT.sql` with
PYTHONPATH at a checkout of the previous version) and by today's."""

from __future__ import annotations

import sys
from pathlib import Path

DEVICES = {
    "pixel-7": {"cpu": "Tensor G2", "cores": 8, "mem_total": 8 * 2**30, "kernel": "5.10.157-android13"},
    "rpi5": {"cpu": "Cortex-A76", "cores": 4, "mem_total": 8 * 2**30, "kernel": "6.6.31+rpt-rpi-2712"},
}
BUILDS = {
    "aaaa111": {"GGML_OPENMP": "OFF", "LLAMA_CURL": "OFF", "CMAKE_BUILD_TYPE": "Release"},
    "bbbb222": {"GGML_OPENMP": "OFF", "LLAMA_CURL": "OFF", "CMAKE_BUILD_TYPE": "Release", "GGML_LTO": "ON"},
}
TENSORS = {"q4_0": {"q4_0": 169, "f32": 61, "q6_K": 1}, "q8_0": {"q8_0": 169, "f32": 61}}


def _ctx(night: int, dev: str, quant: str, payload: str, commit: str, cell_id: str) -> dict:
    per_model = payload != "membw"
    return {
        "run_id": f"run-{night}",
        "cell_id": cell_id,
        "recipe": "nightly",
        "device": dev,
        "target": "aarch64-android",
        "model": "smollm2-135m" if per_model else "-",
        "quant": quant if per_model else "-",
        "payload": payload,
        "governor": "schedutil",
        "backend": "cpu",
        "cpu_quota": 0.5 if quant == "q8_0" else None,
        "contention": 0,
        "model_sha256": f"sha-{quant}" if per_model else None,
        "model_bytes": 138_000_000 if per_model else None,
        "bpw": 4.5 if quant == "q4_0" else 8.5,
        "n_params": 134_515_008,
        "kv_bytes_per_token": 30720,
        "tensor_types": TENSORS.get(quant) if per_model else None,
        "base_note": None,
        "model_source": {"hf": "HuggingFaceTB/SmolLM2-135M"},
        "build_commit": commit,
        "build_flags": BUILDS[commit],
        "build_key": f"key-{commit}",
        "device_facts": DEVICES[dev],
        "device_mem_bytes": DEVICES[dev]["mem_total"],
        "lab_host": "host-a",
        "ram_budget_bytes": 6 * 2**30,
        "ram_budget_source": "meminfo MemAvailable",
        "battery_wh": 17.3 if dev == "pixel-7" else None,
        "battery_source": "design" if dev == "pixel-7" else None,
        "temp_start_c": 31.5,
        "temp_end_c": 38.25,
        "throttled": night % 2 == 0 if dev == "pixel-7" else None,
        "energy_calibration": {"k": 1.02, "n": 3} if dev == "pixel-7" else None,
        "host_activity": {"load1": 0.1 * night},
        "recorded_at": f"2026-11-{night:02d}T02:00:00Z",
    }


def _rows(Row, payload: str, ctx: dict, night: int) -> list:
    if payload == "bench":
        out = []
        for t in (1, 4):
            out += [
                Row(
                    metric="prefill_tps",
                    value=100.0 * t + night,
                    test="pp64",
                    phase="prefill",
                    threads=t,
                    n_prompt=64,
                    n_gen=0,
                    stddev=1.25,
                    n=3,
                    samples=[99.5, 100.0 + night, 100.5],
                ),
                Row(
                    metric="decode_tps",
                    value=20.0 * t + 0.1 * night,
                    test="tg16",
                    phase="decode",
                    threads=t,
                    n_prompt=0,
                    n_gen=16,
                    stddev=0.5,
                    n=3,
                    samples=[19.0, 20.0, 21.0 + night],
                ),
            ]
        out.append(
            Row(
                metric="energy_per_token",
                value=float("nan"),
                phase="decode",
                test="tg16",
                missing_reason="no battery reading on this device",
            )
        )
        out.append(Row(metric="peak_rss", value=2.1e8, phase="cell", n_gpu_layers=0, flash_attn="auto"))
    elif payload == "kld":
        out = [
            Row(metric="kld_mean", value=0.01 * (2 if ctx["quant"] == "q4_0" else 1), ctx=128, phase="kld"),
            Row(metric="ppl_ratio", value=1.01, ctx=128, phase="kld"),
            Row(metric="same_top_p", value=0.97, ctx=128, phase="kld"),
        ]
    else:
        out = [
            Row(metric="mem_bandwidth", value=1.2e10, phase="membw", n=1),
            Row(metric="peak_flops", value=3.4e10, phase="membw"),
        ]
    for r in out:
        r.context = ctx
    return out


def populate(Ledger, Cell, Row, path: Path):
    """Two nights (two commits) on two devices; a reparsed cell; a cell whose re-run failed after it had rows."""
    led = Ledger(path)
    for night, commit in ((3, "aaaa111"), (4, "bbbb222")):
        led.start_run("nightly", f"recipe-sha-{night}", 0)
        run = f"run-{night}"  # the rows' run ids: the same whoever writes them
        for dev in DEVICES:
            for quant, payload in (
                ("q4_0", "bench"),
                ("q8_0", "bench"),
                ("q4_0", "kld"),
                ("q8_0", "kld"),
                ("-", "membw"),
            ):
                cid = f"{night}{dev[:2]}{quant[:2]}{payload[:2]}".replace("-", "x").ljust(16, "0")
                model = "-" if payload == "membw" else "smollm2-135m"
                led.register(
                    [Cell("nightly", dev, model, quant if payload != "membw" else "-", payload, {"reps": 3}, cid)]
                )
                led.begin_cell(cid, run)
                ctx = _ctx(night, dev, quant, payload, commit, cid)
                led.finish_cell(cid, _rows(Row, payload, ctx, night))
    first = led.done_cells()[0]["cell_id"]  # reparse: its rows replaced, new row ids at the end
    led.replace_rows(first, _rows(Row, "kld", _ctx(3, "pixel-7", "q4_0", "kld", "aaaa111", first), 3))
    led.register([Cell("nightly", "rpi5", "smollm2-135m", "q5_0", "bench", {"reps": 3}, "failedcell000000")])
    led.begin_cell("failedcell000000", "run-x")
    led.finish_cell(
        "failedcell000000", _rows(Row, "bench", _ctx(4, "rpi5", "q5_0", "bench", "bbbb222", "failedcell000000"), 4)
    )
    led.begin_cell("failedcell000000", "run-x")  # run again and cut: failed, its earlier rows still there
    led.fail_cell("failedcell000000", "cut", retryable=True)
    return led


if __name__ == "__main__":  # write the version-1 fixture with the devicelab on PYTHONPATH
    import sqlite3
    import tempfile

    from devicelab.ledger import Ledger
    from devicelab.plan import Cell
    from devicelab.schema import Row

    with tempfile.TemporaryDirectory() as d:
        led = populate(Ledger, Cell, Row, Path(d) / "ledger.sqlite")
        led.close()
        con = sqlite3.connect(Path(d) / "ledger.sqlite")
        Path(sys.argv[1]).write_text("\n".join(con.iterdump()) + "\n")
