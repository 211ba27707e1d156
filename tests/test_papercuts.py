"""What a newcomer meets first, each without a build: a CMake configure failure says CMake's reason and the fix;
a recipe with only bench says that no quality was measured, what to add, and still gives the speed and memory
picks; the constraints read as sentences; the live line names a device once; `devicelab plan` lists the cells
per device, what is done and a time estimate from the ledger's history, doing nothing."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from conftest import REPO
from rich.console import Console
from rich.progress import Progress
from test_views import ladder

from devicelab import console, tables
from devicelab.build import cache
from devicelab.errors import DevicelabError
from devicelab.plan import Cell
from devicelab.recipes import RecommendSpec

VULKAN_LOG = """-- The C compiler identification is GNU 12.2.0
CMake Error at /usr/share/cmake-3.25/Modules/FindPackageHandleStandardArgs.cmake:230 (message):
  Could NOT find Vulkan (missing: Vulkan_LIBRARY Vulkan_INCLUDE_DIR) (found
  version "")
Call Stack (most recent call first):
  /usr/share/cmake-3.25/Modules/FindPackageHandleStandardArgs.cmake:600 (_FPHSA_FAILURE_MESSAGE)
"""


def test_cmake_reason_is_the_message_under_the_header():
    reason = cache.cmake_reason(VULKAN_LOG)
    assert reason == 'Could NOT find Vulkan (missing: Vulkan_LIBRARY Vulkan_INCLUDE_DIR) (found version "")'
    fix = cache.cmake_fix(reason)
    assert "libvulkan-dev" in fix and "DEVICELAB_VULKAN_INCLUDE_DIR" in fix
    assert cache.cmake_fix("Could NOT find ZLIB (missing: ZLIB_LIBRARY)") == "install ZLIB's development package"
    assert (
        cache.cmake_reason('CMake Error: The source directory "/x" does not exist.\n')
        == 'The source directory "/x" does not exist.'
    )
    assert cache.cmake_reason("make: *** [all] Error 2\n") == ""


@pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")
def test_a_real_configure_failure_says_the_reason_and_the_fix(tmp_path):
    """CMake itself fails to find a package (its search confined to an empty root): the one line says why."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(x NONE)\nfind_package(Vulkan REQUIRED)\n"
    )
    log = tmp_path / "build.log"
    env = {k: v for k, v in os.environ.items() if k != "VULKAN_SDK"}
    argv = [
        "cmake",
        "-S",
        str(tmp_path / "src"),
        "-B",
        str(tmp_path / "b"),
        f"-DCMAKE_FIND_ROOT_PATH={tmp_path}/no",
        "-DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY",
        "-DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY",
    ]
    with pytest.raises(DevicelabError) as e:
        cache._stream(argv, log, env, "configure", None)
    msg = str(e.value)
    assert msg.startswith("llama.cpp configure failed: Could NOT find Vulkan (missing:"), msg
    assert "FindPackageHandleStandardArgs" not in msg and "DEVICELAB_VULKAN_INCLUDE_DIR" in msg and str(log) in msg


def _no_quality_rows():
    rows = pd.DataFrame(ladder(budget=200 * 1024**2))
    return rows[rows.metric != "kld_mean"]


def test_a_bench_only_recipe_says_what_to_add_and_still_picks_on_speed_and_memory():
    spec = RecommendSpec(context=512, min_decode_tps=30)
    recs, views = tables.recommendation_views(_no_quality_rows(), spec)
    (r,), (v,) = recs, views
    assert r.pick is None and v.no_pick == tables.NO_QUALITY
    # f16 does not fit 200 MiB and decodes at 20 tok/s < 30: out; q2_k is the fastest and the smallest
    assert {k: c.quant for k, c in r.unjudged.items()} == {"fastest": "q2_k", "smallest": "q2_k"}
    assert v.reasons[0] == tables.ADD_QUALITY and "- kind: kld" in v.reasons[0]
    assert v.reasons[1].startswith("on speed and memory alone (measured): the fastest is m q2_k (80.0 tok/s")
    buf = io.StringIO()
    old, console.console = console.console, Console(file=buf, width=300, color_system=None)
    try:
        console.print_recs(_no_quality_rows(), spec)
    finally:
        console.console = old
    out = buf.getvalue()
    assert f"phone: {tables.NO_QUALITY}" in out and "add `- kind: kld`" in out and "the smallest is m q2_k" in out
    assert tables.NO_PICK not in out
    # with quality measured, nothing changes: a pick, no such lines
    (r2,) = tables.recommendation_views(pd.DataFrame(ladder(budget=200 * 1024**2)), spec)[0]
    assert r2.unjudged == {} and r2.pick is not None


def test_the_constraints_read_as_sentences():
    spec = RecommendSpec(context=2048, max_kld_mean=0.1, min_decode_tps=5, max_accuracy_drop=2)
    ss = tables.constraints_sentences(spec)
    assert all(s[0].isupper() and s.endswith(".") and "{" not in s and "_" not in s for s in ss), ss
    assert ss[0].startswith("A quant must fit the device's RAM budget for one app at a 2,048-token context")
    assert "at most 0.1 nats" in ss[1] and "at least 5 tokens per second" in ss[2]
    assert "There is no energy budget." in ss and ss[-1] == "Of the quants that pass, the smallest file is picked."


def test_the_live_line_names_the_device_once(tmp_path):
    from devicelab.serve import LIVE_FILE, LiveStatus

    prog = Progress(console=Console(file=io.StringIO()))
    ev = console.RichEvents(prog, LiveStatus(tmp_path, "r", {}))
    cell = Cell("r", "local", "smollm2-135m", "q8_0", "bench", {"threads": 1}, "abc")
    ev.lane("local", cell.label())
    ev.lane("pixel", "connecting")
    texts = [t.description for t in prog.tasks]
    assert texts[0].startswith("local: smollm2-135m q8_0 bench") and "local: local" not in texts[0]
    assert texts[1] == "pixel: connecting"
    ev.cells(1)
    ev.cell_done(cell, False, "local: boom")
    import json

    live = json.loads((tmp_path / LIVE_FILE).read_text())
    assert live["lanes"]["local"]["text"].startswith("smollm2-135m q8_0 bench")
    assert live["failures"][0]["cell"] == "abc" and live["failures"][0]["note"] == "local: boom"


def test_plan_lists_cells_per_device_and_what_is_done(tmp_path):
    """A ledger whose history holds some of the recipe's cells (by what the cell is: the model file is not
    here, so no id can be computed), a lab of two devices: the plan says which are done, estimates the rest from
    that history, and writes nothing."""
    import sqlite3

    from devicelab.ledger import LEDGER_FILE

    model = tmp_path / "nowhere.gguf"
    r = tmp_path / "r.yaml"
    r.write_text(
        f"name: planned\ndevices: [local, board]\nmodels: [{{name: m, source: {model}}}]\n"
        "quants: [q8_0, q4_0]\npayloads:\n  - {kind: bench, prompt: [8], gen: [4], threads: [1]}\n"
    )
    lab = tmp_path / "lab.yaml"
    lab.write_text("devices:\n  - {name: board, transport: ssh, host: 192.0.2.1}\n")
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    from devicelab import ledger_schema as ls

    db = sqlite3.connect(lab_dir / LEDGER_FILE)
    db.executescript(ls.BASE)
    from devicelab import recipes
    from devicelab.plan import expand

    rec, _ = recipes.load(r)
    cells = {(c.device, c.quant): c for c in expand(rec, "?", {"m": "?"})}
    params = __import__("json").dumps(cells[("local", "q8_0")].params, sort_keys=True)
    db.execute(
        "INSERT INTO cells VALUES ('x1','planned','local','m','q8_0','bench',?,'done',1,'run-1',"
        "'2026-12-01T10:00:00Z','2026-12-01T10:00:30Z',NULL,NULL)",
        (params,),
    )
    db.commit()
    db.close()
    before = sorted(p.name for p in lab_dir.iterdir())
    p = subprocess.run(
        [sys.executable, "-m", "devicelab.cli", "plan", str(r), "--lab", str(lab), "--lab-dir", str(lab_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "local: 2 cells, 1 done, 1 to run (≈ 0.5 min)" in out, out
    assert "board: 2 cells, 0 done, 2 to run (≈ 1.0 min)" in out, out  # bench anywhere: 30 s each
    assert "by what the cell is" in out and f"model {model}" in out
    assert sorted(x.name for x in lab_dir.iterdir()) == before


def test_an_error_during_a_run_has_no_blank_line_before_it(tmp_path):
    """An error raised while the live display is up (here: the model file does not exist), written to a log or a
    pipe: `error:` is the first line, with no blank line before it."""
    r = tmp_path / "r.yaml"
    r.write_text(
        f"name: x\ndevices: [local]\nmodels: [{{name: m, source: {tmp_path}/none.gguf}}]\nquants: [q8_0]\n"
        "payloads: [{kind: bench}]\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "devicelab.cli", "run", str(r), "--lab-dir", str(tmp_path / "lab")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert p.returncode == 2 and p.stderr.startswith("error: model "), repr(p.stderr)
