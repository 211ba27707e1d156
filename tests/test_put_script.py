"""device_payloads/put.sh, the device side of every SSH push, run directly under the shells a device
may have (dash, busybox sh with only busybox's tools, bash; mksh where installed), fed the way sshd
feeds it: through a pipe, here a slow one, so the 'follow' hasher really overlaps the writer."""

import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from devicelab.transports.base import put_script

SHELLS = [s for s in ("dash", "bash", "busybox", "mksh") if shutil.which(s)]
MIB = 1 << 20


def _busybox_path(tmp: Path) -> str:
    """A PATH of busybox applets only (no openssl, no coreutils): a minimal board's userland."""
    d = tmp / "bb"
    d.mkdir(exist_ok=True)
    for a in ("sh", "cat", "dd", "wc", "sleep", "kill", "mkdir", "rm", "mv", "chmod", "printf", "sha256sum"):
        (d / a).unlink(missing_ok=True)
        (d / a).symlink_to(shutil.which("busybox"))
    return str(d)


def _run(shell: str, tmp: Path, args: list[str], data: bytes, pace: float = 0.0):
    env = dict(os.environ)
    argv = [shell, "-c", put_script(), "devicelab", *args]
    if shell == "busybox":
        env["PATH"] = _busybox_path(tmp)
        argv = ["sh", "-c", put_script(), "devicelab", *args]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def feed():
        try:
            for i in range(0, len(data), MIB):
                p.stdin.write(data[i : i + MIB])
                p.stdin.flush()
                time.sleep(pace)
            p.stdin.close()
        except BrokenPipeError:
            pass

    th = threading.Thread(target=feed, daemon=True)
    th.start()
    th.join(120)  # (not communicate(): it would close stdin under the feeder)
    out, err = p.stdout.read(), p.stderr.read()  # a hash line and at most one error line
    return p.wait(60), out.decode(), err.decode()


@pytest.fixture(scope="module")
def blob():
    data = os.urandom(40 * MIB + 12345)  # three 16 MiB pieces and a ragged end
    return data, hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("how", ["after", "follow"])
@pytest.mark.parametrize("shell", SHELLS)
def test_put_hashes_what_landed_and_commits_only_a_match(tmp_path, blob, shell, how):
    data, sha = blob
    part, final, ok = tmp_path / "a b" / "m.part", tmp_path / "a b" / "m", tmp_path / "a b" / "m.ok"
    rc, out, err = _run(
        shell,
        tmp_path,
        [how, str(part), str(len(data)), sha, str(final), str(ok), "755"],
        data,
        pace=0.005 if how == "follow" else 0.0,
    )
    assert rc == 0, err
    assert out.split() == [sha]
    assert final.read_bytes() == data and ok.read_text().strip() == sha and not part.exists()
    assert final.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in final.parent.iterdir()) == ["m", "m.ok"]  # no follower leftovers
    # a hash that does not match what the host sent: printed, and nothing committed
    rc, out, err = _run(
        shell,
        tmp_path,
        [how, str(part), str(len(data)), "0" * 64, str(tmp_path / "n"), str(tmp_path / "n.ok"), ""],
        data,
    )
    assert rc == 0 and out.split() == [sha] and part.exists()
    assert not (tmp_path / "n").exists() and not (tmp_path / "n.ok").exists()


@pytest.mark.parametrize("how", ["after", "follow"])
@pytest.mark.parametrize("shell", SHELLS)
def test_cut_stream_is_a_short_write(tmp_path, blob, shell, how):
    data, sha = blob
    part = tmp_path / "m.part"
    rc, out, err = _run(
        shell,
        tmp_path,
        [how, str(part), str(len(data) + 1), sha, str(tmp_path / "m"), str(tmp_path / "m.ok"), ""],
        data,
    )
    assert rc == 28 and f"short write: {len(data)} of {len(data) + 1} bytes" in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.ok").exists()


def test_follower_ends_when_the_shell_is_killed(tmp_path):
    """sshd gone mid-push kills the script's shell: its follower must not poll on forever."""
    part = tmp_path / "m.part"
    p = subprocess.Popen(
        ["dash", "-c", put_script(), "devicelab", "follow", str(part), str(64 * MIB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    p.stdin.write(os.urandom(MIB))
    p.stdin.flush()
    deadline = time.time() + 10
    while time.time() < deadline and len(psutil.Process(p.pid).children(recursive=True)) < 2:
        time.sleep(0.02)
    kids = psutil.Process(p.pid).children(recursive=True)
    assert kids, "the follower started"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    p.stdin.close()  # as sshd's end of the pipe closes: the writer (cat) sees its end
    gone, alive = psutil.wait_procs(kids, timeout=5)
    for k in alive:
        k.kill()
    assert not alive, f"left running after the shell died: {[k.cmdline() for k in alive]}"


def test_unknown_mode_is_refused(tmp_path):
    p = subprocess.run(
        ["dash", "-c", put_script(), "devicelab", "tee", str(tmp_path / "x"), "1"], input=b"x", capture_output=True
    )
    assert p.returncode == 2 and b"unknown mode tee" in p.stderr and not (tmp_path / "x").exists()
