"""The cluster's secret and its off switch, checked before any Ray process starts: the token is made 0600 in a 0700
folder, a token other users can read is refused in one line, and RAY_AUTH_MODE=disabled left in a shell does not
silently turn authentication off on a head or a worker (only --insecure does, and says so loudly). Each case runs
the real CLI in its own HOME; nothing here starts a cluster (tests/test_cluster.py does)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from conftest import devicelab

pytest.importorskip("ray")

LAB = "devices:\n  - {name: board, transport: ssh, host: 127.0.0.1, lab_host: elsewhere}\n"


def _env(home, **extra):
    e = {**os.environ, "HOME": str(home), **extra}
    e.pop("RAY_AUTH_TOKEN", None)
    e.pop("RAY_AUTH_MODE", None)
    e.update(extra)
    return e


def _make_token(home):
    code = "from devicelab.cluster import node; node.use_auth_token(make=True, listens=True)"
    subprocess.run([sys.executable, "-c", code], env=_env(home), check=True, capture_output=True, timeout=120)
    return home / ".ray" / "auth_token"


def test_the_head_makes_its_token_private(tmp_path):
    tok = _make_token(tmp_path)
    assert stat.S_IMODE(tok.stat().st_mode) == 0o600
    assert stat.S_IMODE(tok.parent.stat().st_mode) == 0o700
    assert len(tok.read_text().strip()) >= 32


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_token_others_can_read_is_refused(tmp_path, what):
    tok = _make_token(tmp_path)
    (tok if what == "file" else tok.parent).chmod(0o644 if what == "file" else 0o755)
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB)
    p = devicelab("head", "--lab", lab, "--port", "6390", env=_env(tmp_path), timeout=120)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "readable by other users" in err[0] and "chmod" in err[0], p.stderr


def test_auth_mode_disabled_in_the_shell_is_refused_unless_insecure(tmp_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB)
    for cmd in (
        ["head", "--lab", lab, "--port", "6391"],
        ["worker", "--lab", lab, "--address", "127.0.0.1:6391", "--host", "elsewhere"],
    ):
        p = devicelab(*cmd, env=_env(tmp_path, RAY_AUTH_MODE="disabled"), timeout=120)
        assert p.returncode != 0
        assert "RAY_AUTH_MODE=disabled" in p.stderr and "--insecure" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    # --insecure is the one way to turn it off, and it is said: the worker then goes on (and finds no head)
    p = devicelab(
        "worker",
        "--lab",
        lab,
        "--address",
        "127.0.0.1:6391",
        "--host",
        "elsewhere",
        "--insecure",
        env=_env(tmp_path),
        timeout=120,
    )
    assert "WARNING: --insecure" in p.stdout and "no Ray head answers" in p.stderr


def test_a_hostile_peer_writes_nothing_outside_the_node_cache(tmp_path, monkeypatch):
    """Ids, digests and names from a peer are checked; a planted `.part` link is not written through; a cached
    file whose size or mtime changed since it was verified is fetched again; a node's start removes leftovers."""
    import hashlib

    from devicelab.cluster import blobs
    from devicelab.errors import RetryableError

    cache = tmp_path / "cache"
    monkeypatch.setenv("DEVICELAB_NODE_CACHE", str(cache))
    data = b"x" * 3000
    sha = hashlib.sha256(data).hexdigest()
    read = lambda off, n: data[off : off + n]
    outside = tmp_path / "outside"
    for bad in (("../../" + sha[:10], "m"), (sha, "../../evil"), (sha, "..")):
        with pytest.raises(RetryableError, match="from a peer"):
            blobs.fetch(bad[0], bad[1], len(data), read)
    with pytest.raises(RetryableError, match="from a peer"):
        blobs.tree("../..", "t", lambda: {"a": b"1"})
    with pytest.raises(RetryableError, match="outside"):
        blobs.write_tree(tmp_path / "elsewhere", {"a": b"1"}, "artifacts", within=cache)
    with pytest.raises(RetryableError, match="outside its folder"):
        blobs.write_tree(cache / "t", {"../../outside": b"1"}, "artifacts", within=cache)
    assert not (tmp_path / "elsewhere").exists() and not outside.exists()
    assert stat.S_IMODE(blobs.root().stat().st_mode) == 0o700
    # a .part that is a link to a file outside: replaced, never written through
    d = cache / "blobs" / sha[:2] / sha
    d.mkdir(parents=True)
    outside.write_bytes(b"keep")
    (d / "m.gguf.part").symlink_to(outside)
    p = blobs.fetch(sha, "m.gguf", len(data), read)
    assert p.read_bytes() == data and outside.read_bytes() == b"keep"
    # tampered after it was verified: fetched again, not trusted for its marker
    p.write_bytes(b"y" * 3000)
    reads = []
    blobs.fetch(sha, "m.gguf", len(data), lambda off, n: reads.append(off) or data[off : off + n])
    assert reads and p.read_bytes() == data
    # leftovers of a crash go when a node starts
    (d / "n.gguf.part").write_bytes(b"cut")
    (cache / "staging" / "run-1" / "board").mkdir(parents=True)
    gone = blobs.clean_leftovers()
    assert not (d / "n.gguf.part").exists() and not (cache / "staging" / "run-1").exists() and len(gone) == 2


def test_an_edited_llama_cpp_tree_at_the_same_commit_is_told_apart(tmp_path):
    """The code identity a lab host and a run are checked by names the llama.cpp tree's content, not its commit
    only: one edited source file at the same commit is a mismatch, in one line; what no build reads is not."""
    from devicelab.build.source import tree_digest
    from devicelab.cluster.node import mismatch

    tree = tmp_path / "llama.cpp"
    (tree / "ggml" / "src").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(llama)\n")
    (tree / "ggml" / "src" / "ggml.c").write_text("int x = 1;\n")
    (tree / "docs").mkdir()
    before = tree_digest(tree)
    (tree / "docs" / "build.md").write_text("notes\n")  # not read by a build
    assert tree_digest(tree) == before
    (tree / "ggml" / "src" / "ggml.c").write_text("int x = 2;\n")
    after = tree_digest(tree)
    assert after != before
    head = {"code": "c", "llama_cpp": "a" * 40, "llama_tree": before}
    why = mismatch({"code": "c", "llama_cpp": "a" * 40, "llama_tree": after}, head)
    assert why and "differs from the head's" in why and "\n" not in why
    assert mismatch({"code": "c", "llama_cpp": "a" * 40, "llama_tree": before}, head) is None
