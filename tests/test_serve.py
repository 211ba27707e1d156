"""`devicelab serve` without a build: a ledger written through the Ledger's own API while the real server (uvicorn,
in another process) reads it — the page, its JSON, and the server-sent events that carry each change."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

from conftest import REPO

from devicelab import serve
from devicelab.ledger import Ledger, ledger_path
from devicelab.plan import Cell


def _cells():
    return [
        Cell("r", dev, "m", q, "bench", {"threads": 1}, f"{dev}-{q}")
        for dev in ("a", "b")
        for q in ("q8_0", "q4_0", "q2_k")
    ]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_state_of_a_lab_folder_as_cells_go(tmp_path):
    led = Ledger(ledger_path(tmp_path))
    led.register(_cells())
    run = led.start_run("r", "sha", 6)
    live = serve.LiveStatus(tmp_path, "r", {"context": 512})
    led.begin_cell("a-q8_0", run)
    led.finish_cell("a-q8_0", [])
    led.begin_cell("a-q4_0", run)
    live.lane("a", "m q4_0 bench t=1")
    led.begin_cell("b-q8_0", run)
    led.fail_cell("b-q8_0", "b: the device went away", retryable=True)
    st = serve.state(tmp_path)
    lanes = {ln["device"]: ln for ln in st["lanes"]}
    assert (lanes["a"]["done"], lanes["a"]["failed"], lanes["a"]["total"]) == (1, 0, 3)
    assert lanes["a"]["running"]["cell_id"] == "a-q4_0" and lanes["a"]["step"] == "m q4_0 bench t=1"
    assert lanes["a"]["seconds_left"] is not None  # from the finished cell's time
    assert lanes["b"]["failed"] == 1 and [c["cell_id"] for c in st["failures"]] == ["b-q8_0"]
    html = serve.fragment(st)
    assert "1 done, 0 failed of 3" in html and "b: the device went away" in html and "failed-retryable" in html
    assert "open the finished run" not in html
    led.finish_run(run, "failed", 1, 0)
    assert "open the finished run's explorer" in serve.fragment(serve.state(tmp_path))


def test_the_server_pushes_each_change(tmp_path):
    led = Ledger(ledger_path(tmp_path))
    led.register(_cells())
    run = led.start_run("r", "sha", 6)
    port = _port()
    srv = subprocess.Popen(
        [sys.executable, "-m", "devicelab.cli", "serve", "--lab-dir", str(tmp_path), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                page = urllib.request.urlopen(base + "/", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.05)
        assert "0 done, 0 failed of 3" in page and "EventSource('events')" in page
        st = json.loads(urllib.request.urlopen(base + "/state.json", timeout=5).read())
        assert st["run"]["run_id"] == run and len(st["lanes"]) == 2
        events = urllib.request.urlopen(base + "/events", timeout=20)
        first = _event(events)
        assert "0 done, 0 failed of 3" in first
        led.begin_cell("a-q8_0", run)
        led.finish_cell("a-q8_0", [])
        assert "1 done, 0 failed of 3" in _event(events)
        led.begin_cell("b-q8_0", run)
        led.fail_cell("b-q8_0", "b: garbage", retryable=False)
        assert "b: garbage" in _event(events)
        # read-only: nothing but GET
        req = urllib.request.Request(base + "/state.json", method="POST")
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("a POST was answered")
        except urllib.error.HTTPError as e:
            assert e.code == 405
    finally:
        srv.terminate()
        srv.wait(timeout=20)


def _event(stream) -> str:
    """The data of the next `state` event."""
    data, name = [], None
    while True:
        line = stream.readline().decode().rstrip("\r\n")
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            if name == "state":
                return "\n".join(data)
            data, name = [], None
