"""A lab of several devices: every device runs in its own lane, at once; one device's failure (its setup,
a parser meeting garbage, the device lost mid-cell) is that device's alone; nothing is left running."""

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import Hold, ctrl_c_able, devicelab
from sshd_peer import SSHD, Sshd

from devicelab.ledger import ledger_path
from devicelab.runner.host import HostCPUs

BENCH = "  - {kind: bench, prompt: [8], gen: [4], threads: [1], repetitions: 1}\n"


def recipe(tmp_path, devices, quants="[q8_0]", payloads=BENCH, name="lanes"):
    r = tmp_path / "r.yaml"
    r.write_text(
        f"name: {name}\ndevices: [{', '.join(devices)}]\nmodels: [{{name: smollm2-135m}}]\n"
        f"quants: {quants}\npayloads:\n{payloads}recommend: {{context: 512, min_decode_tps: 0.1}}\n"
    )
    return r


def cells(db):
    con = sqlite3.connect(db)
    return [
        dict(zip(("device", "quant", "status", "error"), r, strict=True))
        for r in con.execute("SELECT device, quant, status, error FROM cells ORDER BY device, quant")
    ]


def start_run(r, lab, lab_dir):
    return subprocess.Popen(
        [sys.executable, "-m", "devicelab.cli", "run", str(r), "--lab", str(lab), "--lab-dir", str(lab_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_able,
    )


def wait_running(db, proc, n, where="1=1", limit=600):
    """Until n cells (matching `where`) are running in the run `proc` drives."""
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            running = (
                sqlite3.connect(db)
                .execute(f"SELECT count(*) FROM cells WHERE status='running' AND {where}")
                .fetchone()[0]
            )
        except sqlite3.Error:
            running = 0
        if running >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("never saw the cells running")


def run_status(db):
    return sqlite3.connect(db).execute("SELECT status FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()[0]


@pytest.mark.e2e
def test_a_device_whose_setup_fails_beside_one_that_works(tmp_path, host_build, smol_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the broken device's work folder should go\n")
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        f"devices:\n  - {{name: broken, transport: local, workdir: '{blocker}/wd'}}\n"
        f"  - {{name: good, transport: local, workdir: '{tmp_path}/good-wd'}}\n"
    )
    p = devicelab(
        "run", recipe(tmp_path, ["broken", "good"], "[q8_0, q4_0]"), "--lab", lab, "--lab-dir", tmp_path / "lab"
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    db = ledger_path(tmp_path / "lab")
    st = cells(db)
    assert [c["status"] for c in st if c["device"] == "good"] == ["done", "done"]
    broken = [c for c in st if c["device"] == "broken"]
    assert [c["status"] for c in broken] == ["failed", "failed"]
    # one line naming the device and the reason
    assert all(
        c["error"].startswith("broken: ") and "not-a-folder" in c["error"] and "\n" not in c["error"] for c in broken
    ), broken
    assert run_status(db) == "failed"
    assert "good: " in p.stdout and "broken: " not in p.stdout  # good's results and recommendation only


@pytest.mark.e2e
def test_a_parser_that_meets_garbage_fails_that_cell_only(tmp_path, host_build, smol_path):
    """A device whose payloads print a garbage result line for one model file (a wrapper stands in for a
    broken build): that cell fails with one line; the device's other cell and the other device finish."""
    wrap = tmp_path / "garbage-wrapper"
    wrap.write_text(
        '#!/bin/sh\n"$@"; rc=$?\ncase "$*" in *q4_0*) echo \'{"avg_ts": 1, "samples_ts": 5}\';; esac\nexit $rc\n'
    )
    wrap.chmod(0o755)
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        f"devices:\n  - {{name: odd, transport: local, workdir: '{tmp_path}/odd-wd', "
        f"exec_prefix: ['{wrap}']}}\n  - {{name: fine, transport: local, workdir: '{tmp_path}/fine-wd'}}\n"
    )
    p = devicelab("run", recipe(tmp_path, ["odd", "fine"], "[q8_0, q4_0]"), "--lab", lab, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    st = {(c["device"], c["quant"]): c for c in cells(ledger_path(tmp_path / "lab"))}
    assert st[("odd", "q4_0")]["status"] == "failed"
    assert "cannot read" in st[("odd", "q4_0")]["error"] and st[("odd", "q4_0")]["error"].startswith("odd: ")
    assert st[("odd", "q8_0")]["status"] == st[("fine", "q8_0")]["status"] == st[("fine", "q4_0")]["status"] == "done"


@pytest.mark.e2e
def test_lanes_run_at_once_and_say_what_else_ran(tmp_path, host_build, smol_path):
    """Two devices that do not measure on this host's CPUs (host_cpus: false) run at the same time: each
    row says what else the lab ran on the host during its cell; the local device's cells never overlap a
    host-side step (they measure alone on the host's CPUs)."""
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "".join(
            ["devices:\n"]
            + [
                f"  - {{name: {n}, transport: local, workdir: '{tmp_path}/{n}-wd', host_cpus: false}}\n"
                for n in ("a", "b")
            ]
        )
    )
    slow = "  - {kind: bench, prompt: [8], gen: [32], threads: [1], repetitions: 2}\n"
    p = devicelab(
        "run", recipe(tmp_path, ["a", "b"], "[q8_0, q4_0]", payloads=slow), "--lab", lab, "--lab-dir", tmp_path / "lab"
    )
    assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame()
    acts = rows.drop_duplicates("cell_id").set_index("device").host_activity.dropna()
    assert acts.loc["a"].str.contains("b cell").any() and acts.loc["b"].str.contains("a cell").any(), acts


def test_host_cpus_a_measurement_never_overlaps_host_work():
    """The readers/writer rule itself, with real threads: host-side steps run together, never while a
    measurement holds the host's CPUs, and a waiting measurement is not starved by new work."""
    cpu = HostCPUs()
    log, lock = [], threading.Lock()

    def note(what):
        with lock:
            log.append((time.monotonic(), what))

    def worker(i):
        for _ in range(5):
            with cpu.work(f"w{i}"):
                note(f"+w{i}")
                time.sleep(0.01)
                note(f"-w{i}")

    def measurer():
        for _ in range(5):
            with cpu.measure("m"):
                note("+m")
                time.sleep(0.02)
                note("-m")

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(3)] + [threading.Thread(target=measurer)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    active_w, measuring = 0, False
    for _, what in sorted(log):
        if what == "+m":
            assert active_w == 0 and not measuring
            measuring = True
        elif what == "-m":
            measuring = False
        elif what.startswith("+w"):
            assert not measuring
            active_w += 1
        else:
            active_w -= 1
    assert sum(1 for _, w in log if w == "+m") == 5
    assert "m" in cpu.during(0, time.time() + 1) and "w0" in cpu.during(0, time.time() + 1, exclude="m")


LOST = """name: lost
devices: [board, local]
models: [{name: smollm2-135m}]
quants: [q8_0, q4_0]
payloads:
  - {kind: bench, prompt: [16], gen: [16], threads: [1], repetitions: 2}
recommend: {context: 512, min_decode_tps: 0.1}
"""


@pytest.mark.e2e
@pytest.mark.skipif(not Path(SSHD).exists(), reason="needs openssh-server")
def test_a_device_lost_mid_cell_beside_one_that_is_not(tmp_path, host_build, smol_path):
    sshd = Sshd(tmp_path / "sshd").start()
    hold = Hold(tmp_path / "hold")  # the board's payload held until it is lost
    lab = tmp_path / "lab.yaml"
    lab.write_text(sshd.lab_yaml("board", f"    exec_prefix: ['{hold.script}']\n"))
    r = tmp_path / "r.yaml"
    r.write_text(LOST)
    db = ledger_path(tmp_path / "lab")
    proc = start_run(r, lab, tmp_path / "lab")
    wait_running(db, proc, 1, "device='board'")
    hold.wait_held(1, proc)
    sshd.kill()  # the board goes away mid-cell
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in err
    st = cells(db)
    assert [c["status"] for c in st if c["device"] == "local"] == ["done", "done"], st
    board = [c for c in st if c["device"] == "board"]
    assert {c["status"] for c in board} == {"failed-retryable"}, board
    assert all(c["error"].startswith("board: ") for c in board)
    assert run_status(db) == "failed"
    sshd.start()  # back: the run again finishes the board alone
    hold.release()
    p = devicelab("run", r, "--lab", lab, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "4 cells, 2 already done, 2 ran, 0 failed" in p.stdout
    assert {c["status"] for c in cells(db)} == {"done"}
    sshd.kill()


@pytest.mark.e2e
def test_ctrl_c_stops_every_lane_and_puts_every_device_back(tmp_path, host_build, smol_path):
    """SIGINT (Ctrl-C) mid-run: every lane stops, each device's pinned governors are put back (fixture
    cpufreq trees), the cut cells are failed-retryable, none is left running, and the run says it was
    interrupted; the next run finishes what was cut."""
    from test_governor import cpufreq_tree, govs

    roots = {n: cpufreq_tree(tmp_path / f"root-{n}") for n in ("a", "b")}
    # each device's payload held until the signal has landed, so it lands while both cells run however loaded the
    # machine is (cells made long for that instead once lost the race to a test process starved for seconds)
    hold = Hold(tmp_path / "hold")
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "devices:\n"
        + "".join(
            f"  - {{name: {n}, transport: local, workdir: '{tmp_path}/{n}-wd', host_cpus: false, "
            f"governor: performance, telemetry_root: '{roots[n]}', exec_prefix: ['{hold.script}']}}\n"
            for n in roots
        )
    )
    r = recipe(
        tmp_path,
        ["a", "b"],
        "[q8_0, q4_0]",
        payloads="  - {kind: bench, prompt: [16], gen: [16], threads: [1], repetitions: 2}\n",
        name="cut",
    )
    db = ledger_path(tmp_path / "lab")
    import signal

    proc = start_run(r, lab, tmp_path / "lab")
    wait_running(db, proc, 2)
    hold.wait_held(2, proc)
    assert all(govs(root) == ["performance"] * 3 for root in roots.values()), "pinned while the cells run"
    assert proc.poll() is None and len([c for c in cells(db) if c["status"] == "running"]) == 2
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "interrupted" in err
    st = cells(db)
    assert not [c for c in st if c["status"] == "running"], st
    cut = [c for c in st if c["status"] == "failed-retryable"]
    assert len(cut) == 4 and all("interrupted by the user" in c["error"] for c in cut), st
    assert run_status(db) == "interrupted"
    assert all(govs(root) == ["schedutil"] * 3 for root in roots.values()), "every device put back"
    hold.release()
    p = devicelab("run", r, "--lab", lab, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 0, p.stdout + p.stderr
    assert {c["status"] for c in cells(db)} == {"done"}
