"""One lab across several USB hosts, on a real multi-node Ray cluster: two lab hosts, each a network namespace
with its own address, its own sshd board (reachable only from inside it) and its own Ray node joined by
`devicelab worker`; the head (`devicelab head`, the ledger, the host-side work) outside them on a bridge this
test creates; Ray's TLS on between them (the lab's CA and a certificate per host), and a capture of the lab's
network showing nothing of the cluster's gRPC in clear. A recipe across both hosts' devices; one host killed
mid-cell; a second run waiting for a held device; the host back and the recipe finished; the head killed mid-run
and restarted without losing a cell."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cluster_peer import Capture, LabNet, wait_for
from conftest import ctrl_c_able, devicelab
from sshd_peer import SSHD

from devicelab.ledger import ledger_path

ray = pytest.importorskip("ray", reason="the cluster tests need the [cluster] extra (ray)")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not shutil.which(SSHD), reason="needs openssh-server")]

BENCH = "  - {kind: bench, prompt: [8], gen: [4], threads: [1], repetitions: 1}\n"


def recipe(path, name, devices, quants, bench=BENCH):
    path.write_text(
        f"name: {name}\ndevices: [{', '.join(devices)}]\nmodels: [{{name: smollm2-135m}}]\n"
        f"quants: [{', '.join(quants)}]\npayloads:\n{bench}"
        "recommend: {context: 512, min_decode_tps: 0.1}\n"
    )
    return path


def cells(db, recipe_name):
    con = sqlite3.connect(db)
    return {
        r[0]: dict(zip(("device", "status", "error", "attempts"), r[1:], strict=True))
        for r in con.execute(
            "SELECT cell_id, device, status, error, attempts FROM cells WHERE recipe=?", (recipe_name,)
        )
    }


def running(db, device) -> bool:
    try:
        return (
            sqlite3.connect(db)
            .execute("SELECT count(*) FROM cells WHERE status='running' AND device=?", (device,))
            .fetchone()[0]
            > 0
        )
    except sqlite3.Error:
        return False


def on(host, *args, timeout=300):
    """The CLI on a lab host (inside its namespace)."""
    return subprocess.run(
        [*host.prefix(), sys.executable, "-m", "devicelab.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=host.net.env(),
    )


def start_run(net, r, lab, lab_dir, log):
    """`devicelab run --cluster` on the head (in its namespace)."""
    return subprocess.Popen(
        [
            *net.prefix(),
            sys.executable,
            "-m",
            "devicelab.cli",
            "run",
            str(r),
            "--lab",
            str(lab),
            "--lab-dir",
            str(lab_dir),
            "--cluster",
            net.address,
        ],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env={**net.env(), "DEVICELAB_CLUSTER_WAIT_NOTE_S": "1", "COLUMNS": "200"},
        preexec_fn=ctrl_c_able,
    )


def one_error_line(p) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), p.stdout + p.stderr
    return lines[0]


@pytest.fixture
def net(tmp_path):
    n = LabNet(["w1", "w2"], tls=tmp_path / "tls")
    if not n.create():
        pytest.skip("cannot create network namespaces and a bridge here (needs root)")
    yield n
    n.delete()


def test_a_recipe_across_two_lab_hosts(tmp_path, net, host_build, smol_path):
    w1, w2 = net.hosts
    w1.start_board(tmp_path / "board1")
    w2.start_board(tmp_path / "board2")
    lab = tmp_path / "lab.yaml"
    # board1 on w1, board2 on w2, `here` (this machine, no lab_host) on the head, ghost on a host that has it not
    lab.write_text(
        "devices:\n"
        + w1.lab_entry("board1")
        + w2.lab_entry("board2")
        + f"  - {{name: here, workdir: {tmp_path}/here}}\n"
        + "  - {name: ghost, transport: ssh, host: 127.0.0.1, port: 9, lab_host: w3}\n"
    )
    net.start_head(lab, tmp_path / "head.log")

    # a worker is refused in one line: a device of it missing, no device for it, another devicelab than the head's
    from devicelab.cluster import tls

    for name in ("w3", "nobody"):  # (each with a certificate of the lab: what refuses them is devicelab's own check)
        tls.issue(net.tls, name, [w1.ip])
    ghost = on(w1, "worker", "--address", net.address, "--lab", lab, "--host", "w3")
    assert "device ghost is not reachable from lab host w3" in one_error_line(ghost)
    nobody = on(w1, "worker", "--address", net.address, "--lab", lab, "--host", "nobody")
    assert "places no device on lab host nobody" in one_error_line(nobody)
    real = net.identity()
    net.set_identity({**real, "code": "0" * 16})  # the head now says it runs another devicelab
    other = on(w1, "worker", "--address", net.address, "--lab", lab, "--host", "w1")
    assert "lab host w1 refused: this host's devicelab" in one_error_line(other)
    net.set_identity(real)

    cap = Capture(net.prefix(), tmp_path / "lab-network.raw")
    for h in (w1, w2):
        h.join(lab, tmp_path / f"cache-{h.name}", tmp_path / f"{h.name}.log")
    wait_for(
        lambda: net.advertised() == {"board1": "w1", "board2": "w2", "here": "head"},
        180,
        "both lab hosts to join",
        every=1,
    )
    assert "TLS on between lab hosts" in (tmp_path / "w1.log").read_text()
    # what crossed the lab's network while two hosts joined: TLS records, and neither gRPC's plaintext HTTP/2
    # preface (test_cluster_net.py sees it without TLS) nor the cluster's token
    seen = cap.stop()
    token = (Path.home() / ".ray" / "auth_token").read_bytes().strip()
    assert len(seen) > 10_000 and b"\x16\x03\x01" in seen and b"\x17\x03\x03" in seen
    assert b"PRI * HTTP/2.0" not in seen and token not in seen
    # Ray listens on every address of a namespace: these are only loopback and the test's own; none on this
    # machine's own namespace (where its outward address is), none in another
    listening = net.listening()
    assert set(listening) <= {"head", "w1", "w2"} and listening.get("head"), listening

    # the recipe across both hosts; a second run needing board2 waits for it; w1 is killed mid-cell
    lab_dir = tmp_path / "lab"
    db = ledger_path(lab_dir)
    ra = recipe(tmp_path / "a.yaml", "across", ["board1", "board2", "here"], ["q8_0", "q4_0", "q4_1"])
    a = start_run(net, ra, lab, lab_dir, tmp_path / "a.log")
    stop_sampling, here_holders = threading.Event(), set()
    sampler = threading.Thread(target=sample_holders, args=("here", stop_sampling, here_holders), daemon=True)
    sampler.start()
    # run a holds board2 until run b has found it held, and board1 until w1 is killed: both boards' processes are
    # stopped (SIGSTOP) meanwhile, so a busy machine cannot let run a finish their cells first (beside a busy loop
    # run a finished board1's three cells while b started)
    board1, board2 = (f"{h.board.d}/device-workdir" for h in (w1, w2))
    held: set[str] = set()

    def hold() -> bool:  # each board's processes stopped while one of its cells runs
        for name, board in (("board1", board1), ("board2", board2)):
            if board in held or not running(db, name):
                continue
            if subprocess.run(["pkill", "-STOP", "-f", board]).returncode == 0:
                held.add(board)
        return len(held) == 2 or a.poll() is not None

    wait_for(hold, 600, "a process of run a on each board")
    try:
        b = start_run(
            net, recipe(tmp_path / "b.yaml", "second", ["board2"], ["q8_0"]), lab, lab_dir, tmp_path / "b.log"
        )
        wait_for(
            lambda: "board2 is held by run" in (tmp_path / "b.log").read_text() or b.poll() is not None,
            600,
            "run b to find board2 held by run a",
        )
    finally:
        subprocess.run(["pkill", "-CONT", "-f", board2])
    try:
        w1.kill_node()  # board1's cell still stopped mid-run
    finally:
        subprocess.run(["pkill", "-CONT", "-f", board1])
    assert a.wait(600) == 1, (tmp_path / "a.log").read_text()[-4000:]
    out_a = (tmp_path / "a.log").read_text()
    first = cells(db, "across")
    on1 = [c for c in first.values() if c["device"] == "board1"]
    assert all(c["status"] == "done" for c in first.values() if c["device"] != "board1"), first
    assert any(c["status"] == "failed-retryable" and "lab host w1 went away" in c["error"] for c in on1), on1
    assert "lab host w1 went away" in out_a
    assert b.wait(600) == 0, (tmp_path / "b.log").read_text()[-4000:]
    run_a = sqlite3.connect(db).execute("SELECT run_id FROM runs WHERE recipe='across'").fetchone()[0]
    assert f"board2 is held by run {run_a} of recipe across" in (tmp_path / "b.log").read_text()

    rows = pd_rows(db)
    assert set(rows[rows.device == "board2"].lab_host) == {"w2"}
    assert set(rows[rows.device == "here"].lab_host) == {"head"}
    # the head's own device was driven by the process that Ray gave its resource to (a lane actor, as on any other
    # host), not by the head's actor beside a separate holder of the resource
    stop_sampling.set()
    sampler.join()
    assert here_holders and all(t.startswith("ray::LaneActor") for t in here_holders), here_holders
    # the model and the build reached w2 once, by content hash, into its own cache
    assert list((tmp_path / "cache-w2" / "blobs").rglob("*.gguf.verified"))

    # w1 back; the run again: the head is killed once a board1 cell is done, and restarted; nothing finished is lost
    w1.join(lab, tmp_path / "cache-w1", tmp_path / "w1.log")
    wait_for(lambda: net.advertised().get("board1") == "w1", 180, "w1 to join again", every=1)
    a2 = start_run(net, ra, lab, lab_dir, tmp_path / "a2.log")
    wait_for(
        lambda: (
            any(c["device"] == "board1" and c["status"] == "done" for c in cells(db, "across").values())
            or a2.poll() is not None
        ),
        600,
        "a board1 cell to finish",
    )
    done_before = {k for k, c in cells(db, "across").items() if c["status"] == "done"}
    a2.kill()
    a2.wait(30)
    for h in (w1, w2):
        h.kill_node()
    net.restart_head(lab, tmp_path / "head2.log")
    assert {k for k, c in cells(db, "across").items() if c["status"] == "done"} >= done_before
    for h in (w1, w2):
        h.join(lab, tmp_path / f"cache-{h.name}", tmp_path / f"{h.name}.log")
    wait_for(
        lambda: net.advertised() == {"board1": "w1", "board2": "w2", "here": "head"},
        180,
        "both lab hosts to join again",
        every=1,
    )
    a3 = start_run(net, ra, lab, lab_dir, tmp_path / "a3.log")
    assert a3.wait(600) == 0, (tmp_path / "a3.log").read_text()[-4000:]
    final = cells(db, "across")
    assert all(c["status"] == "done" for c in final.values()), final
    assert all(final[k]["attempts"] == first[k]["attempts"] for k in first if first[k]["device"] != "board1")
    rows = pd_rows(db)
    assert set(rows[rows.device == "board1"].lab_host) == {"w1"}
    # every cell's raw artifacts are on the head, beside its one ledger: reparse re-derives the same rows
    for k in final:
        assert list((lab_dir / "artifacts" / k).glob("attempt-*/cell.json")), k
    rep = devicelab("reparse", "--lab-dir", lab_dir)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert len(pd_rows(db)) == len(rows)

    # Ctrl-C of a run across hosts: every lane stops its payload and puts its device back, the cut cells are
    # retryable, nothing is left running on the board, and the devices are free for the next run
    # cells long enough that the signal lands while they run, however loaded the machine (with cells of a
    # second, a starved test process sent its SIGINT after the run had ended)
    rc = recipe(
        tmp_path / "c.yaml",
        "cut",
        ["board1", "here"],
        ["q8_0", "q4_0"],
        bench="  - {kind: bench, prompt: [8], gen: [128], threads: [1], repetitions: 8}\n",
    )
    c = start_run(net, rc, lab, lab_dir, tmp_path / "c.log")
    wait_for(lambda: running(db, "board1") or c.poll() is not None, 600, "board1's cell in the run to cut")
    assert c.poll() is None, (tmp_path / "c.log").read_text()[-4000:]
    c.send_signal(signal.SIGINT)
    assert c.wait(300) == 130, (tmp_path / "c.log").read_text()[-4000:]
    cut = cells(db, "cut")
    assert not [k for k, v in cut.items() if v["status"] == "running"], cut
    assert any(v["status"] == "failed-retryable" and "interrupted" in v["error"] for v in cut.values()), cut
    left = subprocess.run(["pgrep", "-af", f"{w1.board.d}/device-workdir"], capture_output=True, text=True).stdout
    assert not left.strip(), left
    c2 = start_run(net, rc, lab, lab_dir, tmp_path / "c2.log")
    assert c2.wait(600) == 0, (tmp_path / "c2.log").read_text()[-4000:]


def sample_holders(device: str, stop: threading.Event, seen: set) -> None:
    """The process titles of whoever holds the device's lock file (devices/NAME/run.lock names its pid), sampled
    until `stop`."""
    from devicelab import paths

    lock = paths.sub("devices") / device / "run.lock"
    while not stop.is_set():
        try:
            pid = (json.loads(lock.read_text() or "{}") or {}).get("pid")
            if pid:
                seen.add(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode())
        except (OSError, ValueError):
            pass
        stop.wait(0.05)


def pd_rows(db):
    from devicelab.ledger import Ledger

    return Ledger(db).rows_frame()


def test_run_names_a_missing_head_in_one_line(tmp_path):
    r = recipe(tmp_path / "r.yaml", "nohead", ["local"], ["q8_0"])
    t0 = time.time()
    p = devicelab("run", r, "--lab-dir", tmp_path / "lab", "--cluster", "127.0.0.1:9", timeout=300)
    assert "no Ray head answers at 127.0.0.1:9" in one_error_line(p), time.time() - t0


def test_a_node_cache_takes_a_file_once_and_only_whole(tmp_path, monkeypatch):
    """blobs.fetch: streamed in chunks, verified by sha256 before use, kept; a cut or corrupt transfer leaves
    nothing usable and is retryable."""
    import hashlib

    from devicelab.cluster import blobs
    from devicelab.errors import RetryableError

    monkeypatch.setenv("DEVICELAB_NODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(blobs, "CHUNK", 1000)
    data = os.urandom(4500)
    sha = hashlib.sha256(data).hexdigest()
    reads = []

    def read(off, n):
        reads.append((off, n))
        return data[off : off + n]

    p = blobs.fetch(sha, "m.gguf", len(data), read)
    assert p.read_bytes() == data and len(reads) == 5
    assert blobs.fetch(sha, "m.gguf", len(data), read) == p and len(reads) == 5  # kept: not read again
    bad = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(RetryableError, match="arrived with sha256"):
        blobs.fetch(bad, "x.gguf", len(data), read)
    assert not list((tmp_path / "cache").rglob("x.gguf*"))
    with pytest.raises(RetryableError):  # the head stopped answering half way
        blobs.fetch(sha[::-1], "y.gguf", len(data), lambda off, n: data[off : off + n] if off < 2000 else b"")
    assert not list((tmp_path / "cache").rglob("y.gguf*"))


def test_cluster_settings_in_the_lab_file_are_checked(tmp_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text("cluster: not-an-address\ndevices:\n  - {name: local}\n")
    r = recipe(tmp_path / "r.yaml", "x", ["local"], ["q8_0"])
    assert "cluster" in one_error_line(devicelab("run", r, "--lab", lab, "--lab-dir", tmp_path / "lab"))
    lab.write_text("devices:\n  - {name: local, lab_host: 'desk 2; rm -rf /'}\n")
    assert "lab_host" in one_error_line(devicelab("run", r, "--lab", lab, "--lab-dir", tmp_path / "lab"))
    lab.write_text("devices:\n  - {name: local, lab_host: desk-2}\n")
    assert "--address HEAD:PORT" in one_error_line(devicelab("worker", "--lab", lab, "--host", "desk-2"))
