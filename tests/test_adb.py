"""The adb transport against the real adb host server (Debian's `adb`), talking through adbutils to a
device-side peer on 127.0.0.1 that speaks the real adb transport protocol (tests/adbd_peer.py). The peer
is a protocol-faithful stand-in, not Android: no SELinux, no bionic; its commands run in this machine's sh."""

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from adbd_peer import BATTERY, PROPS, AdbdPeer, fake_dumpsys, free_port
from conftest import FIXTURES, check_forward, devicelab, echo_server

from devicelab import push
from devicelab.errors import DevicelabError, RetryableError
from devicelab.ledger import ledger_path
from devicelab.transports.adb import ADBTransport

pytestmark = [
    pytest.mark.skipif(not shutil.which("adb"), reason="needs the adb host server (Debian package adb)"),
    pytest.mark.builds("aarch64"),  # the phone peer runs the static aarch64 build under qemu
]


ANDROID_USERLAND = bool(shutil.which("mksh") and shutil.which("toybox"))


def make_peer(tmp_path, adb, authorized=True, port=None, userland="host"):
    keys = tmp_path / "adb_keys"
    keys.write_text(adb.pubkey.read_text() if authorized else "")
    return AdbdPeer(tmp_path / "peer", port or free_port(), keys, PROPS, userland=userland).start()


def transport(adb, peer, tmp_path, **kw):
    return ADBTransport("phone", f"127.0.0.1:{peer.port}", adb_port=adb.port, workdir=str(tmp_path / "dlt"), **kw)


def test_shell_v2_exit_codes_stderr_and_getprop(adb, tmp_path):
    peer = make_peer(tmp_path, adb)
    t = transport(adb, peer, tmp_path)
    t.connect()
    assert t.v2
    r = t.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.rc, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert t.run(["getprop", "ro.product.model"]).stdout.strip() == "Peer 7"
    peer.kill()


def test_pull_of_a_missing_file_fails_and_leaves_nothing(adb, tmp_path):
    """adbutils' sync.pull takes a path that does not exist for a folder and 'pulls' it as an empty one;
    the transport's get refuses it as a missing file (an optional artifact, e.g. powermetrics.plist)."""
    peer = make_peer(tmp_path, adb)
    t = transport(adb, peer, tmp_path)
    t.connect()
    with pytest.raises(OSError, match="not a file"):
        t.get(str(tmp_path / "no-such-file"), tmp_path / "got")
    assert not (tmp_path / "got").exists() and not (tmp_path / "got.part").exists()
    (tmp_path / "there").write_bytes(b"x" * 100_000)
    t.get(str(tmp_path / "there"), tmp_path / "got")
    assert (tmp_path / "got").read_bytes() == b"x" * 100_000
    peer.kill()


def test_port_forward_through_the_adb_server(adb, tmp_path):
    """adb forward tcp:L tcp:R (the llama-server eval route): the real adb server opens the peer's tcp:
    service, which connects to the port on the 'phone' (this machine's loopback); removed afterwards."""
    srv, port = echo_server()
    peer = make_peer(tmp_path, adb)
    t = transport(adb, peer, tmp_path)
    t.connect()
    try:
        lp = check_forward(t, port)
        assert not [f for f in t._d().forward_list() if f.local == f"tcp:{lp}"]
    finally:
        srv.shutdown()
        peer.kill()


def test_hostile_arguments_and_paths(adb, tmp_path):
    peer = make_peer(tmp_path, adb)
    t = transport(adb, peer, tmp_path)
    marker = tmp_path / "pwned"
    args = ["a b", "it's", 'x"y', f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", "$HOME"]
    r = t.run(["printf", "%s\\n", *args])
    assert r.stdout.split("\n")[:-1] == args and not marker.exists()
    f = tmp_path / "m.bin"
    f.write_bytes(os.urandom(300_000))
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    got = push.ensure(t, f, sha, "model; $(touch pwned) `x` 'q'.gguf")
    assert hashlib.sha256(Path(got).read_bytes()).hexdigest() == sha and not marker.exists()
    back = tmp_path / "back.bin"
    t.get(got, back)
    assert back.read_bytes() == f.read_bytes()
    peer.kill()


def test_hostile_serial_runs_nothing(adb, tmp_path):
    marker = tmp_path / "pwned"
    t = ADBTransport("phone", f"127.0.0.1:1; touch {marker}", adb_port=adb.port, reconnect_tries=0)
    with pytest.raises(RetryableError, match="not connected"):
        t.connect()
    assert not marker.exists()


def test_unauthorized_is_one_clear_line(adb, tmp_path):
    peer = make_peer(tmp_path, adb, authorized=False)
    adb.connect(f"127.0.0.1:{peer.port}")
    deadline = time.time() + 10
    while adb.state(f"127.0.0.1:{peer.port}") != "unauthorized" and time.time() < deadline:
        time.sleep(0.1)
    t = transport(adb, peer, tmp_path)
    with pytest.raises(DevicelabError, match="is unauthorized: unlock it and accept the 'Allow USB debugging"):
        t.connect()
    peer.kill()


def test_offline_then_back_reconnects(adb, tmp_path):
    peer = make_peer(tmp_path, adb)
    peer.mute = True  # answers nothing: adb shows it offline
    serial = f"127.0.0.1:{peer.port}"
    # adb's own connect waits 10 s for an answer that does not come; the server lists the phone offline at once
    threading.Thread(target=adb.connect, args=(serial,), daemon=True).start()
    deadline = time.time() + 10
    while adb.state(serial) != "offline" and time.time() < deadline:
        time.sleep(0.1)
    assert adb.state(serial) == "offline"
    # bounded: with the phone still silent, the transport gives up with a retryable error
    with pytest.raises(RetryableError, match="offline after 1 reconnect tries"):
        transport(adb, peer, tmp_path, reconnect_tries=1, reconnect_wait=0.2, connect_timeout=1).connect()
    threading.Timer(1.0, lambda: setattr(peer, "mute", False)).start()
    t = transport(adb, peer, tmp_path, reconnect_tries=6, reconnect_wait=0.5)
    t.connect()  # came back within the bounded retries
    assert t.run(["echo", "back"]).stdout == "back\n"
    peer.kill()


def test_peer_killed_mid_push_then_push_again(adb, tmp_path):
    peer = make_peer(tmp_path, adb)
    t = transport(adb, peer, tmp_path)
    t.connect()
    big = tmp_path / "big.bin"
    block = os.urandom(1 << 20)
    with open(big, "wb") as fh:
        for _ in range(150):
            fh.write(block)
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    dst = push.remote_path(t, sha, "big.bin")
    err = []
    th = threading.Thread(target=lambda: err.append(_try(lambda: push.ensure(t, big, sha, "big.bin"))))
    th.start()
    deadline = time.time() + 30
    while time.time() < deadline and not (os.path.exists(dst + ".part") and os.path.getsize(dst + ".part") > 4 << 20):
        time.sleep(0.005)
    peer.kill()
    th.join(60)
    assert isinstance(err[0], RetryableError), err
    assert not os.path.exists(dst + ".ok")
    peer2 = AdbdPeer(tmp_path / "peer", peer.port, peer.adb_keys, PROPS).start()
    t2 = transport(adb, peer2, tmp_path, reconnect_tries=8, reconnect_wait=0.5)
    got = push.ensure(t2, big, sha, "big.bin")
    assert hashlib.sha256(Path(got).read_bytes()).hexdigest() == sha
    peer2.kill()


def _try(fn):
    try:
        return fn()
    except Exception as e:
        return e


def _battery_root(tmp_path):
    ps = tmp_path / "sysfs" / "sys/class/power_supply/battery"
    ps.mkdir(parents=True)
    for k, v in BATTERY.items():
        (ps / k).write_text(v + "\n")
    z = tmp_path / "sysfs" / "sys/class/thermal/thermal_zone0"
    z.mkdir(parents=True)
    (z / "type").write_text("cpu-1-0-usr\n")
    (z / "temp").write_text("39500\n")
    return tmp_path / "sysfs"


PHONE_RECIPE = """
name: phone
devices: [phone]
models: [{name: smollm2-135m}]
quants: [q8_0, q4_0]
payloads:
  - {kind: bench, prompt: [8], gen: [4], threads: [2], repetitions: 1}
recommend: {context: 512, max_kld_mean: 1, min_decode_tps: 0.1}
"""


def _phone_lab(tmp_path, adb, peer, root):
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        f"devices:\n  - name: phone\n    transport: adb\n    serial: '127.0.0.1:{peer.port}'\n"
        f"    adb_port: {adb.port}\n    workdir: '{tmp_path}/phone-tmp'\n    telemetry_root: '{root}'\n"
        "    cpu_features: 'fp asimd asimddp'\n    exec_prefix: [qemu-aarch64-static]\n"
    )
    return lab


@pytest.mark.e2e
@pytest.mark.skipif(not shutil.which("qemu-aarch64-static"), reason="needs qemu-user-static")
def test_full_loop_on_the_phone_peer(adb, tmp_path, source, host_build, smol_path):
    # every device command in Android's userland: mksh as sh, toybox's applets (Debian's mksh and toybox)
    peer = make_peer(tmp_path, adb, userland="android" if ANDROID_USERLAND else "host")
    log = fake_dumpsys(
        peer,
        FIXTURES / "snapshots/dumpsys-battery-unplugged.txt",
        FIXTURES / "snapshots/dumpsys-thermalservice.txt",
        FIXTURES / "snapshots/dumpsys-meminfo.txt",
    )
    root = _battery_root(tmp_path)
    lab = _phone_lab(tmp_path, adb, peer, root)
    recipe = tmp_path / "r.yaml"
    # without an NDK the phone gets the static aarch64 build; its binaries run in the peer under qemu
    # (the device/host logit check under qemu is test_aarch64's: here it would only double the qemu time)
    recipe.write_text(
        PHONE_RECIPE.replace(
            "repetitions: 1}\n", "repetitions: 1}\n  - {kind: kld, ctx: 128, chunks: 2, host_check: false}\n"
        )
    )
    env = {k: "" for k in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT")}
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "phone: ship smollm2-135m" in p.stdout and "no Android NDK" in p.stderr
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame()
    assert rows.target.str.startswith("aarch64-linux-static").all()
    assert rows.device_facts.str.contains("Android 14").all() and rows.device_facts.str.contains("Peer 7").all()
    assert (rows[rows.metric == "decode_tps"].value > 0).all()
    # telemetry from the phone's (fixture) sysfs: 0.35 A × 3.912 V, sign flipped to 'discharge positive'
    pw = rows[(rows.metric == "power_mean") & (rows.phase == "cell")].value
    assert len(pw) == 4 and (pw - 0.35 * 3.912).abs().max() < 1e-6
    assert (rows[rows.metric == "temp_start"].value == 39.5).all()
    # snapshots and the charging hygiene: unplug before, reset after, every cell
    calls = log.read_text().splitlines()
    assert calls.count("battery unplug") == calls.count("battery reset") == 4
    assert rows[rows.metric == "thermal_status"].value.eq(2).all()
    # the phone's memory budget from its own `dumpsys meminfo` (free + cached), its battery's capacity
    assert (rows.ram_budget_bytes == 3_503_356 * 1024).all()
    assert rows.ram_budget_source.str.startswith("dumpsys meminfo: free RAM (free + cached) 3.34 GiB").all()
    assert rows.battery_wh.dropna().round(3).eq(round(4.41 * 3.912, 3)).all() and rows.battery_wh.notna().all()
    # energy a person can read: Wh per prompt of the lab's shape (pp8+tg4) and the battery per 1,000 prompts
    assert "mWh per prompt (pp8+tg4)" in p.stdout and "of the battery per 1,000 prompts" in p.stdout
    assert "of a budget of 3421 MiB (dumpsys meminfo: free RAM" in p.stdout
    rep = tmp_path / "report.html"
    devicelab("report", "--lab-dir", tmp_path / "lab", "--recipe", recipe, "-o", rep, check=True)
    assert "mWh per prompt (pp8+tg4)" in rep.read_text() and "battery/1k prompts" in rep.read_text()
    if ANDROID_USERLAND:  # the sampler ran in the phone's userland: mksh's read -t, no awk there
        csvs = list((tmp_path / "lab" / "artifacts").glob("*/attempt-*/telemetry.csv"))
        assert len(csvs) == 4 and all("# pace readt reader=sh" in c.read_text() for c in csvs)
    peer.kill()


PHONE_SERVER_RECIPE = """
name: phone-tools
devices: [phone]
models: [{{name: smollm2-135m}}]
quants: [q4_0]
payloads:
  - {{kind: batched, prompt: 8, gen: 4, parallel: [1, 2], threads: 2}}
  - {{kind: eval, route: server-generate, include: {tasks}, lm_tasks: [devicelab_copy], limit: 4, ctx: 256}}
recommend: {{context: 512, max_kld_mean: 1, min_decode_tps: 0.1}}
"""


@pytest.mark.e2e
@pytest.mark.skipif(not shutil.which("qemu-aarch64-static"), reason="needs qemu-user-static")
def test_batched_and_llama_server_on_the_phone_peer(adb, tmp_path, source, host_build, smol_path):
    """The phone's build carries llama-batched-bench and llama-server (the static aarch64 build without an
    NDK): a batched cell and an lm-eval generation task against llama-server on the phone, reached through
    `adb forward`, record rows — not skips."""
    pytest.importorskip("lm_eval")
    from conftest import REPO

    peer = make_peer(tmp_path, adb, userland="android" if ANDROID_USERLAND else "host")
    root = _battery_root(tmp_path)
    lab = _phone_lab(tmp_path, adb, peer, root)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(PHONE_SERVER_RECIPE.format(tasks=REPO / "recipes" / "tasks" / "lm-eval"))
    env = {k: "" for k in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT")}
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    led = Ledger(ledger_path(tmp_path / "lab"))
    assert [c["status"] for c in led.cells()] == ["done", "done"]
    rows = led.rows_frame()
    assert rows.target.str.startswith("aarch64-linux-static").all()
    agg = rows[rows.metric == "aggregate_tps"]
    assert sorted(agg.n_parallel.astype(int)) == [1, 2] and (agg.value > 0).all()
    acc = rows[(rows.metric == "accuracy") & (rows.eval_route == "server-generate")]
    assert len(acc) == 1 and int(acc.n.iloc[0]) == 4
    assert rows[rows.metric == "tokens_generated"].value.iloc[0] >= 4
    # the server ran on the phone under the sampler: its power from the phone's (fixture) battery
    assert rows[(rows.metric == "power_mean") & (rows.phase == "cell")].value.notna().all()
    peer.kill()


@pytest.mark.e2e
@pytest.mark.skipif(not shutil.which("qemu-aarch64-static"), reason="needs qemu-user-static")
def test_peer_killed_mid_cell_then_run_again(adb, tmp_path, source, host_build, smol_path):
    peer = make_peer(tmp_path, adb)
    log = fake_dumpsys(
        peer, FIXTURES / "snapshots/dumpsys-battery-unplugged.txt", FIXTURES / "snapshots/dumpsys-thermalservice.txt"
    )
    root = _battery_root(tmp_path)
    lab = _phone_lab(tmp_path, adb, peer, root)
    recipe = tmp_path / "r.yaml"
    # long enough to be cut mid-cell (model load alone takes seconds under qemu), short enough to re-run
    recipe.write_text(PHONE_RECIPE.replace("gen: [4]", "gen: [16]"))
    db = ledger_path(tmp_path / "lab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devicelab.cli",
            "run",
            str(recipe),
            "--lab",
            str(lab),
            "--lab-dir",
            str(tmp_path / "lab"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            st = dict(sqlite3.connect(db).execute("SELECT status, count(*) FROM cells GROUP BY 1").fetchall())
        except sqlite3.Error:
            st = {}
        if st.get("running", 0) == 1:
            break
        time.sleep(0.05)
    phone = tmp_path / "phone-tmp"
    while time.time() < deadline and not any("payload=" in f.read_text() for f in phone.rglob("pids")):
        time.sleep(0.05)  # the payload started on the phone (the runner wrote its pid)
    peer.kill()  # the phone is unplugged mid-cell
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    con = sqlite3.connect(db)
    st = dict(con.execute("SELECT status, count(*) FROM cells GROUP BY 1").fetchall())
    assert st.get("failed-retryable", 0) >= 1 and "running" not in st
    assert (
        con.execute("SELECT count(*) FROM rows r JOIN cells c USING(cell_id) WHERE c.status != 'done'").fetchone()[0]
        == 0
    )
    # the link went while the phone was set unplugged: no reset could reach it
    before = log.read_text().splitlines()
    assert before.count("battery unplug") == 1 and "battery reset" not in before, before
    peer2 = AdbdPeer(tmp_path / "peer", peer.port, peer.adb_keys, PROPS).start()
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 0, p.stdout + p.stderr
    assert dict(con.execute("SELECT status, count(*) FROM cells GROUP BY 1").fetchall()) == {"done": 2}
    # first contact restores the charging state before anything else is measured; every unplug is undone
    assert "phone: charging state restored (dumpsys battery reset)" in p.stderr
    calls = log.read_text().splitlines()
    after = calls[calls.index("battery unplug") + 1 :]
    assert after[: after.index("battery unplug")].count("battery reset") == 1, calls
    assert calls.count("battery unplug") == calls.count("battery reset") and calls[-1] == "battery reset"
    peer2.kill()


@pytest.mark.e2e
@pytest.mark.skipif(not shutil.which("qemu-aarch64-static"), reason="needs qemu-user-static")
def test_two_phones_by_serial_one_unplugged_the_other_goes_on(adb, tmp_path, source, host_build, smol_path):
    keys = tmp_path / "adb_keys"
    keys.write_text(adb.pubkey.read_text())
    a = AdbdPeer(tmp_path / "peer-a", free_port(), keys, {**PROPS, "ro.product.model": "Peer A"}).start()
    b = AdbdPeer(tmp_path / "peer-b", free_port(), keys, {**PROPS, "ro.product.model": "Peer B"}).start()
    root = _battery_root(tmp_path)
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "devices:\n"
        + "".join(
            f"  - name: phone-{n}\n    transport: adb\n    serial: '127.0.0.1:{p.port}'\n    adb_port: {adb.port}\n"
            f"    workdir: '{tmp_path}/phone-{n}-tmp'\n    telemetry_root: '{root}'\n"
            "    cpu_features: 'fp asimd asimddp'\n    exec_prefix: [qemu-aarch64-static]\n"
            for n, p in (("a", a), ("b", b))
        )
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        PHONE_RECIPE.replace("devices: [phone]", "devices: [phone-a, phone-b]").replace(
            "quants: [q8_0, q4_0]", "quants: [q4_0]"
        )
    )
    a.kill()  # phone A is unplugged before the run
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 1, p.stdout + p.stderr
    con = sqlite3.connect(ledger_path(tmp_path / "lab"))
    st = dict(con.execute("SELECT device, status FROM cells").fetchall())
    assert st == {"phone-a": "failed-retryable", "phone-b": "done"}, st
    err = con.execute("SELECT error FROM cells WHERE device='phone-a'").fetchone()[0]
    assert "not connected after" in err and f"127.0.0.1:{a.port}" in err
    facts = con.execute("SELECT DISTINCT device_facts FROM rows").fetchall()
    assert len(facts) == 1 and "Peer B" in facts[0][0]
    a2 = AdbdPeer(tmp_path / "peer-a", a.port, keys, {**PROPS, "ro.product.model": "Peer A"}).start()
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 0, p.stdout + p.stderr
    assert dict(con.execute("SELECT device, status FROM cells").fetchall()) == {"phone-a": "done", "phone-b": "done"}
    assert con.execute("SELECT attempts FROM cells WHERE device='phone-b'").fetchone()[0] == 1  # not re-run
    a2.kill()
    b.kill()
