"""Ctrl-C inside a device session, piece by piece: the payload that is slow to say its pids is still stopped (a
loaded machine's runner may take seconds to write them), and the cooldown before a cell ends its wait. Real local
processes and files; the lanes' whole Ctrl-C path is test_lanes.py's."""

import subprocess
import threading
from types import SimpleNamespace

from devicelab.recipes import TelemetrySpec
from devicelab.runner.session import DeviceConditions, DeviceSession, Link
from devicelab.transports.local import LocalTransport


def session_on(tmp_path) -> DeviceSession:
    """A session of the local device with only what interrupt() uses: the link, the running payload's folder."""
    s = DeviceSession.__new__(DeviceSession)
    s.link = Link(SimpleNamespace(name="local"), None)
    s.link.t = LocalTransport(root=str(tmp_path / "wd"))
    s.conditions = SimpleNamespace(stopping=threading.Event())
    s.current_remote = None
    return s


def test_a_payload_slow_to_write_its_pids_is_still_stopped(tmp_path):
    s = session_on(tmp_path)
    remote = tmp_path / "cells" / "c1" / "attempt-1"
    remote.mkdir(parents=True)
    s.current_remote = str(remote)
    stopper = threading.Thread(target=s.interrupt, kwargs={"patience_s": 120}, daemon=True)
    stopper.start()
    # the runner has not written its pids yet: interrupt() keeps looking (before, it gave up after 5 s and the
    # payload ran to its end)
    stopper.join(1.0)
    assert s.interrupted and stopper.is_alive()
    payload = subprocess.Popen(["sleep", "300"])
    try:
        (remote / "pids").write_text(f"runner={payload.pid}\n")
        stopper.join(60)
        assert not stopper.is_alive()
        assert payload.wait(timeout=30) == -15, "stopped with SIGTERM"
    finally:
        payload.kill()
        payload.wait()


def test_interrupt_stops_looking_once_the_payload_is_no_longer_the_running_one(tmp_path):
    s = session_on(tmp_path)
    s.current_remote = str(tmp_path / "never-started")
    stopper = threading.Thread(target=s.interrupt, kwargs={"patience_s": 120}, daemon=True)
    stopper.start()
    stopper.join(1.0)
    assert stopper.is_alive()
    s.current_remote = None  # the cell saw the flag and did not start it
    stopper.join(30)
    assert not stopper.is_alive()


def test_interrupt_with_no_payload_running_returns_at_once(tmp_path):
    s = session_on(tmp_path)
    assert not s.interrupted
    stopper = threading.Thread(target=s.interrupt, kwargs={"patience_s": 120}, daemon=True)
    stopper.start()
    stopper.join(30)
    assert not stopper.is_alive() and s.interrupted, "the flag alone: the cell sees it before it starts a payload"


def test_the_cooldown_ends_its_wait_at_ctrl_c():
    stages: list[str] = []
    c = DeviceConditions(SimpleNamespace(name="board"), None, SimpleNamespace(stage=stages.append), TelemetrySpec())
    c.baseline = 40.0
    c.hottest = lambda: 60.0  # hot and staying hot: without Ctrl-C the wait lasts cooldown_timeout_s (120 s)
    rows: list = []
    waiter = threading.Thread(target=lambda: rows.append(c.cooldown()), daemon=True)
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive()
    c.stopping.set()
    waiter.join(30)
    assert not waiter.is_alive()
    (row,) = rows
    assert row.metric == "cooldown_wait" and row.test == "cut by Ctrl-C" and row.value < 30
    assert not stages, "no 'measuring warm' warning for a cell that is cut"
