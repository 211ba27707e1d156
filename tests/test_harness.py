"""The devicelab harness (device_payloads/harness/), Linux build, for real: one executable carrying llama.cpp's
tools from the pinned tree, built here once per session (ccache shares the host build's objects), run on SmolLM2.
Its `run` gives what run_payload.sh gives around the plain tool, and both parse with the kinds' own parsers to the
same rows and through the same normalizer. Its file services (sha256, commit, fs) and exit statuses are checked
against their contract. The iOS parts (the app's main, UIKit's battery, ProcessInfo's thermal state, the Xcode
build) cannot run here: the iOS columns of its sampler CSV are checked with a CSV written the way the iOS build
writes it, and the Mac's command lines as data."""

from __future__ import annotations

import hashlib
import json
import math
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devicelab import paths
from devicelab.build import harness
from devicelab.kinds import bench, kld
from devicelab.telemetry import normalize, sampler_csv, sources
from devicelab.telemetry.normalize import Phase
from devicelab.telemetry.sources import harness as harness_source

pytestmark = pytest.mark.e2e


def hrun(hb, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(hb.path), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


def run_plain(out: Path, argv: list[str]) -> int:
    """The plain tool under device_payloads/run_payload.sh, as on every device with a shell."""
    runner = paths.device_payloads_dir() / "run_payload.sh"
    r = subprocess.run(["sh", str(runner), str(out), "100", "/", "--", *argv], capture_output=True, timeout=600)
    return r.returncode


def run_harness(hb, out: Path, argv: list[str]) -> subprocess.CompletedProcess:
    return hrun(hb, "run", out, 100, "/", "--", *argv)


def clock(out: Path) -> dict[str, float]:
    return {k: float(v) for k, v in (line.split("=", 1) for line in (out / "clock").read_text().split())}


def row_keys(rows) -> set[tuple]:
    return {(r.metric, r.test, r.phase, r.threads, r.n_prompt, r.n_gen, r.n_depth, r.ctx, r.n) for r in rows}


def test_build_is_cached_and_carries_the_tools(harness_build, source):
    again = harness.ensure_linux(source)
    assert again == harness_build  # a hit: same binary, same manifest (built_at unchanged)
    assert hashlib.sha256(harness_build.path.read_bytes()).hexdigest() == harness_build.sha256
    r = hrun(harness_build, "tools")
    assert r.returncode == 0 and r.stdout.split() == list(harness.TOOLS) == harness_build.manifest["tools"]
    facts = dict(line.split("=", 1) for line in hrun(harness_build, "facts", "wd").stdout.splitlines())
    assert facts["harness.version"] == harness.sources_hash() == harness_build.manifest["harness_sources"]
    assert facts["harness.tools"] == ",".join(harness.TOOLS)
    assert int(facts["cpu.count"]) >= 1 and int(facts["mem.total_kB"]) > 0 and int(facts["storage.free_kB"]) > 0
    assert facts["arch"] and facts["uname"].startswith("Linux") and facts["os"]
    assert "mem.app_available_bytes" not in facts  # iOS only: os_proc_available_memory()


def test_bench_through_the_harness_parses_to_the_plain_tools_rows(harness_build, host_build, smol_path, tmp_path):
    p = bench.BenchParams(prompt=(16,), gen=(8,), repetitions=2, threads=1)
    mine, plain = tmp_path / "harness", tmp_path / "plain"
    r = run_harness(harness_build, mine, bench.argv("llama-bench", str(smol_path), p))
    assert r.returncode == 0, r.stderr[-2000:]
    assert run_plain(plain, bench.argv(str(host_build.tool("llama-bench")), str(smol_path), p)) == 0
    for f in ("stdout.tsv", "stderr.txt", "telemetry.csv", "clock", "pids", "exit_code"):
        assert (mine / f).is_file(), f
    assert (mine / "exit_code").read_text().strip() == "0"
    # runner, payload and sampler are all the harness itself
    assert len(set((mine / "pids").read_text().replace("=", " ").split()[1::2])) == 1

    tests = {name: bench.parse((d / "stdout.tsv").read_text()) for name, d in (("mine", mine), ("plain", plain))}
    rows = {name: bench.rows(t) for name, t in tests.items()}
    assert row_keys(rows["mine"]) == row_keys(rows["plain"])
    assert {r.metric for r in rows["mine"]} == {"prefill_tps", "decode_tps", "test_seconds"}
    assert all(r.value > 0 for r in rows["mine"])
    # the console got the tool's stdout too, unchanged
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("{")] == [
        ln.split("\t", 1)[1] for ln in (mine / "stdout.tsv").read_text().splitlines() if "\t{" in ln
    ]

    # one clock: each result line arrived inside the run, and the sampler ticked over the same span
    c = clock(mine)
    tr = sampler_csv.parse((mine / "telemetry.csv").read_text())
    assert tr.clock == "monotonic" and tr.interval_s == 0.1
    for bt in tests["mine"]:
        assert c["start_s"] <= bt.window()[0] <= bt.t_end <= c["end_s"]
    assert tr.frame["t_s"].iloc[0] <= tests["mine"][0].t_end <= tr.frame["t_s"].iloc[-1]
    assert tr.frame["t_s"].iloc[-1] >= tests["mine"][-1].t_end  # the last tick is after the tool returned

    peaks = {}
    for name, d in (("mine", mine), ("plain", plain)):
        trace = sampler_csv.parse((d / "telemetry.csv").read_text())
        phases = [Phase(bt.name, bt.kind, *bt.window()) for bt in tests[name]]
        summ = normalize.summarize(trace, phases, None, sources.read_pulled(d))
        got = {x.metric: x for x in summ.rows if x.phase == "cell"}
        peaks[name] = got["peak_rss"].value
        assert not any(x.metric == "thermal_status" for x in summ.rows)  # Linux: no thermal state from the harness
    assert peaks["mine"] > 50e6 and peaks["mine"] == pytest.approx(peaks["plain"], rel=0.3), peaks


def test_kld_through_the_harness_parses_to_the_plain_tools_rows(harness_build, host_build, smol_path, source, tmp_path):
    p = kld.KLDParams(ctx=128, chunks=2, threads=2)
    text = source.path / "docs" / "build.md"
    base = tmp_path / "base.kld"
    subprocess.run(
        kld.base_argv(str(host_build.tool("llama-perplexity")), str(smol_path), str(text), str(base), p),
        check=True,
        capture_output=True,
        timeout=600,
    )
    mine, plain = tmp_path / "harness", tmp_path / "plain"
    r = run_harness(harness_build, mine, kld.kld_argv("llama-perplexity", str(smol_path), str(base), p))
    assert r.returncode == 0, r.stderr[-2000:]
    assert run_plain(plain, kld.kld_argv(str(host_build.tool("llama-perplexity")), str(smol_path), str(base), p)) == 0
    rows = {}
    for name, d in (("mine", mine), ("plain", plain)):
        text_out = (d / "stdout.tsv").read_text() + "\n" + (d / "stderr.txt").read_text()
        rows[name] = {x.metric: x for x in kld.parse_kld(text_out, p)}
    assert row_keys(rows["mine"].values()) == row_keys(rows["plain"].values())
    assert {m for m, x in rows["mine"].items() if math.isnan(x.value)} == {
        m for m, x in rows["plain"].items() if math.isnan(x.value)
    }
    # the same file against its own logits, on the same CPU with the same code: the same answers
    assert rows["mine"]["kld_mean"].value < 1e-3 and rows["mine"]["same_top_p"].value > 0.99
    assert rows["mine"]["ppl"].value == pytest.approx(rows["plain"]["ppl"].value, rel=1e-3)
    assert "KL divergence statistics" in (mine / "stdout.tsv").read_text() + (mine / "stderr.txt").read_text()


def test_exit_status_reaches_exit_code_however_the_tool_ends(harness_build, host_build, tmp_path):
    # llama-bench calls exit(1) itself on a bad argument: the harness still finishes the run
    out = tmp_path / "bad"
    r = run_harness(harness_build, out, ["llama-bench", "--no-such-flag"])
    plain = subprocess.run([str(host_build.tool("llama-bench")), "--no-such-flag"], capture_output=True, timeout=60)
    assert r.returncode == plain.returncode == 1
    assert (out / "exit_code").read_text() == "1\n"
    assert "invalid parameter for argument: --no-such-flag" in (out / "stderr.txt").read_text()
    assert "--no-such-flag" in r.stderr  # and on the console
    assert "end_s" in clock(out) and len(sampler_csv.parse((out / "telemetry.csv").read_text()).frame) >= 1
    # direct dispatch: the tool's own status
    assert hrun(harness_build, "llama-bench", "--no-such-flag").returncode == 1
    # a tool it does not carry, given as a path
    out = tmp_path / "unknown"
    r = run_harness(harness_build, out, ["/usr/bin/llama-nothing", "-x"])
    assert r.returncode == 127 and (out / "exit_code").read_text() == "127\n"
    assert "unknown tool /usr/bin/llama-nothing; carried: llama-bench" in (out / "stderr.txt").read_text()
    assert hrun(harness_build, "no-such-command").returncode == 2


def _wait_for(what: str, ok, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Wait on a state (polled), failing at once when the harness has exited instead."""
    deadline = time.monotonic() + timeout
    while not ok():
        assert proc.poll() is None, f"the harness exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.05)


def _ticks(out: Path) -> int:
    f = out / "telemetry.csv"
    return len(sampler_csv.parse(f.read_text()).frame) if f.exists() else 0


def test_a_stopped_tool_ends_its_run_with_128_plus_the_signal(harness_build, smol_path, tmp_path):
    """SIGTERM to a tool with no handler of its own (what a timeout sends): the run's files are complete and
    exit_code says 143, as run_payload.sh writes for a payload it saw killed."""
    out = tmp_path / "stopped"
    argv = bench.argv("llama-bench", str(smol_path), bench.BenchParams(prompt=(512,), gen=(256,), repetitions=50))
    proc = subprocess.Popen([str(harness_build.path), "run", str(out), "50", "/", "--", *argv])
    _wait_for("two sampler ticks", lambda: _ticks(out) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert (out / "exit_code").read_text() == "143\n" and "end_s" in clock(out)


def test_llama_server_through_the_harness(harness_build, smol_path, tmp_path):
    port = _free_port()
    out = tmp_path / "server"
    argv = ["llama-server", "-m", str(smol_path), "--port", str(port), "-t", "1", "-c", "256"]
    proc = subprocess.Popen(
        [str(harness_build.path), "run", str(out), "200", "/", "--", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for("a healthy server", lambda: _status(f"http://127.0.0.1:{port}/health") == 200, proc)
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/completion", data=json.dumps({"prompt": "Hello", "n_predict": 4}).encode()
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert json.loads(resp.read())["tokens_predicted"] == 4
    finally:
        proc.send_signal(signal.SIGTERM)  # the server's own handler: a clean stop
        rc = proc.wait(timeout=120)
    assert rc == 0 and (out / "exit_code").read_text() == "0\n"
    assert "cleaning up before exit" in (out / "stderr.txt").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def test_sha256_commit_and_fs(harness_build, tmp_path):
    data = b"devicelab" * 100_000
    f = tmp_path / "blob.tmp"
    f.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    r = hrun(harness_build, "sha256", f)
    assert r.returncode == 0 and r.stdout == f"{sha}  {f}\n"
    assert hrun(harness_build, "sha256", tmp_path / "absent").returncode == 1
    (tmp_path / "empty").write_bytes(b"")
    assert hrun(harness_build, "sha256", tmp_path / "empty").stdout.startswith(hashlib.sha256(b"").hexdigest())

    # commit with a wrong sha: exit 3, TMP kept, nothing at DST
    dst, marker = tmp_path / "models" / "m.gguf", tmp_path / "models" / "m.gguf.ok"
    r = hrun(harness_build, "commit", f, "0" * 64, dst, marker)
    assert r.returncode == 3 and f.exists() and not dst.exists() and not marker.exists()
    # with the right one (relative paths: relative to the working folder): moved, parent made, empty marker
    r = hrun(harness_build, "commit", "blob.tmp", sha.upper(), "models/m.gguf", "models/m.gguf.ok", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not f.exists() and dst.read_bytes() == data and marker.read_bytes() == b""

    d = tmp_path / "a" / "b"
    assert hrun(harness_build, "fs", "exists", d).returncode == 1
    assert hrun(harness_build, "fs", "mkdir", d).returncode == 0 and d.is_dir()
    assert hrun(harness_build, "fs", "exists", d).returncode == 0
    assert hrun(harness_build, "fs", "touch", d / "t" / "x").returncode == 0 and (d / "t" / "x").is_file()
    assert hrun(harness_build, "fs", "cp", dst, d / "c" / "copy").returncode == 0
    assert (d / "c" / "copy").read_bytes() == data
    r = hrun(harness_build, "fs", "cat", d / "c" / "copy")
    assert r.returncode == 0 and r.stdout.encode() == data
    assert hrun(harness_build, "fs", "cat", d / "none").returncode == 1
    assert hrun(harness_build, "fs", "rm", tmp_path / "a").returncode == 0 and not (tmp_path / "a").exists()
    assert hrun(harness_build, "fs", "rm", tmp_path / "a").returncode == 0  # already gone: rm -f
    assert hrun(harness_build, "fs", "frobnicate", d).returncode == 2


# ---------------------------------------------------------------- what only an iPhone gives (no iPhone here)
IOS_CSV = """\
# devicelab-sampler v1 interval_ms=500 slow_interval_ms=1000 root=/ pid=412
# harness devicelab-harness platform=ios
# clock monotonic
tick,t_s,harness/thermal_state,harness/battery_level_pct,harness/battery_state,harness/cpu_time_s,proc/412/VmRSS_kB,proc/412/VmHWM_kB
0,100.0,nominal,80,{state},0.01,20000,20000
1,100.5,fair,80,{state},0.50,300000,300000
2,101.0,serious,79,{state},1.00,310000,310000
3,101.5,fair,78,{state},1.40,120000,310000
"""


def _ios_cell(tmp_path: Path, state: str = "unplugged") -> Path:
    d = tmp_path / f"ios-{state}"
    d.mkdir()
    (d / "telemetry.csv").write_text(IOS_CSV.format(state=state))
    return d


def test_ios_columns_give_the_worst_thermal_state_and_the_battery_drop(tmp_path):
    """A sampler CSV written the way the iOS build writes it (its values made up: no iPhone here)."""
    d = _ios_cell(tmp_path)
    tr = sampler_csv.parse((d / "telemetry.csv").read_text())
    beside = sources.read_pulled(d)
    assert harness_source.thermal_state_max(beside["harness"]) == "serious"
    summ = normalize.summarize(tr, [Phase("pp16", "prefill", 100.2, 100.9, 16, 1)], (100.0, 101.5), beside)
    rows = {(x.metric, x.phase): x for x in summ.rows}
    ts = rows[("thermal_status", "cell")]
    assert ts.value == 2 and ts.test == "harness thermal_state serious" and summ.throttled is True
    drop = rows[("battery_drop", "cell")]
    assert drop.value == pytest.approx(0.02) and "1 % steps" in drop.test and drop.samples == [0.8, 0.78]
    for key in (("energy", "cell"), ("energy", "prefill"), ("energy_per_token", "prefill")):
        assert math.isnan(rows[key].value) and "only the level in 1 % steps" in rows[key].missing_reason
    assert summ.calibration["resolution_pct"] == 1 and summ.calibration["battery_state"] == "unplugged"
    assert rows[("peak_rss", "cell")].value == 310000 * 1024  # phys_footprint's peak, as jetsam counts it


def test_ios_charging_says_why_there_is_no_drop(tmp_path):
    beside = sources.read_pulled(_ios_cell(tmp_path, "charging"))
    rows, _ = harness_source.SOURCE.cell_energy(beside["harness"], [])
    energy = next(x for x in rows if x.metric == "energy")
    assert energy.missing_reason.startswith("the device was charging: no battery drop to read")


def test_ios_build_command_lines(source):
    target = harness.ios_deployment_target(source.path)
    assert target == "16.4"  # IOS_MIN_OS_VERSION in the pinned tree's build-xcframework.sh
    argv = harness.ios_cmake_argv(
        "/mac/llama.cpp", "/mac/b", "org.example.dl", "TEAM123", True, target, harness_dir="/mac/harness"
    )
    assert argv[:7] == ["cmake", "-S", "/mac/harness", "-B", "/mac/b", "-G", "Xcode"]
    for flag in (
        "-DDEVICELAB_LLAMA_SRC=/mac/llama.cpp",
        "-DCMAKE_SYSTEM_NAME=iOS",
        "-DCMAKE_OSX_ARCHITECTURES=arm64",
        "-DCMAKE_OSX_DEPLOYMENT_TARGET=16.4",
        "-DDEVICELAB_BUNDLE_ID=org.example.dl",
        "-DDEVICELAB_TEAM_ID=TEAM123",
        "-DGGML_METAL=ON",
        "-DGGML_METAL_EMBED_LIBRARY=ON",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ):
        assert flag in argv, flag
    cpu = harness.ios_cmake_argv("/s", "/b", "x", "T", False, target, harness_dir="/h")
    assert "-DGGML_METAL=OFF" in cpu
    assert harness.ios_build_argv("/mac/b") == [
        "cmake",
        "--build",
        "/mac/b",
        "--config",
        "Release",
        "--",
        "-allowProvisioningUpdates",
    ]
    assert harness.ios_app_path("/mac/b") == "/mac/b/Release-iphoneos/devicelab-harness.app"
    assert {p.name for p in harness.source_files()} >= {"CMakeLists.txt", "harness.cpp", "ios_main.mm", "Info.plist.in"}
