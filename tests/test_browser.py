"""The report and the live page in a real browser: Playwright (from PyPI) driving the system's Chromium, against
a real run — two devices on this machine, one of whose payloads prints garbage for one model file, so a cell
fails mid-run.

The live page (`devicelab serve`) is watched while the run goes: a lane's progress changes and the failed cell
appears, pushed by the server (no reload), and a reload shows the same state. The run's report, opened from its
file: no console error, no request that leaves the file, a filter changes the plotted points (and lives in the
address), hovering a point shows its cell's provenance, the constraints read as sentences. Screenshots of each
are kept in out/screenshots/ (DEVICELAB_SCREENSHOTS to put them elsewhere)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, devicelab

pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not shutil.which("chromium"), reason="needs the system's chromium (.ci/run)"),
]

SHOTS = Path(os.environ.get("DEVICELAB_SCREENSHOTS") or REPO / "out" / "screenshots")
ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-gpu",
]
RECIPE = """name: browser
devices: [odd, fine]
models: [{name: smollm2-135m}]
quants: [q8_0, q4_0]
payloads:
  - {kind: bench, prompt: [16], gen: [8], threads: [1], repetitions: 2}
  - {kind: kld, text: "llama.cpp:docs/build.md", ctx: 128, chunks: 8}
recommend: {context: 1024, max_kld_mean: 0.1, min_decode_tps: 1}
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        yield b
        b.close()


def _watch(page) -> dict:
    """What a page did: console errors, uncaught exceptions, every request's URL."""
    seen = {"errors": [], "requests": []}
    page.on("console", lambda m: m.type == "error" and seen["errors"].append(m.text))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("request", lambda r: seen["requests"].append(r.url))
    return seen


def _lab(tmp: Path) -> tuple[Path, Path, Path]:
    wrap = tmp / "garbage-wrapper"  # a broken build stand-in: one file's results come out as garbage
    wrap.write_text(
        '#!/bin/sh\n"$@"; rc=$?\ncase "$*" in *q4_0*) echo \'{"avg_ts": 1, "samples_ts": 5}\';; esac\nexit $rc\n'
    )
    wrap.chmod(0o755)
    lab = tmp / "lab.yaml"
    lab.write_text(
        f"devices:\n  - {{name: odd, transport: local, workdir: '{tmp}/odd-wd', exec_prefix: ['{wrap}']}}\n"
        f"  - {{name: fine, transport: local, workdir: '{tmp}/fine-wd'}}\n"
    )
    r = tmp / "browser.yaml"
    r.write_text(RECIPE)
    return r, lab, tmp / "labdata"


def _lanes(page) -> dict[str, str]:
    """Each lane's text, read in one go (the server replaces the fragment under the page at any moment)."""
    return page.evaluate(
        "() => Object.fromEntries([...document.querySelectorAll('#live .lane')]"
        ".map((e) => [e.dataset.device, e.innerText]))"
    )


@pytest.fixture(scope="module")
def live_run(tmp_path_factory, browser, host_build, smol_path):
    """A real run watched on the live page; yields (lab folder, recipe, what the page showed)."""
    tmp = tmp_path_factory.mktemp("browser")
    recipe, lab, lab_dir = _lab(tmp)
    port = _port()
    srv = subprocess.Popen(
        [sys.executable, "-m", "devicelab.cli", "serve", "--lab-dir", str(lab_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    seen = _watch(page)
    shown: dict = {"progress": [], "failure": None}
    try:
        url = f"http://127.0.0.1:{port}/"
        for _ in range(100):
            try:
                page.goto(url)
                break
            except Exception:  # the server is starting
                time.sleep(0.1)
        assert "No run in" in page.inner_text("#live")
        run = subprocess.Popen(
            [sys.executable, "-m", "devicelab.cli", "run", str(recipe), "--lab", str(lab), "--lab-dir", str(lab_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _follow(page, run, shown)
        out, errs = run.communicate(timeout=600)
        shown["run"] = (run.returncode, out, errs)
        page.wait_for_selector("#live a[href='report']", timeout=30000)
        page.screenshot(path=SHOTS / "live-finished.png", full_page=True)
        before = re.sub(r"read from .*", "", page.inner_text("#live"))
        page.reload()
        shown["reloaded_same"] = before == re.sub(r"read from .*", "", page.inner_text("#live"))
        page.click("#live a[href='report']")
        page.wait_for_selector("#plot-speed .main-svg", timeout=30000)
        shown["explorer_title"] = page.title()
        shown["live_errors"], shown["live_requests"] = list(seen["errors"]), list(seen["requests"])
        yield lab_dir, recipe, shown, port
    finally:
        page.close()
        srv.terminate()
        srv.wait(timeout=30)


def _follow(page, run, shown) -> None:
    """Until the run ends: every change of the lanes' text as the server pushes it, and the first failure."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    last: dict = {}
    deadline = time.time() + 600
    while run.poll() is None and time.time() < deadline:
        lanes = _lanes(page)
        if lanes and lanes != last:
            shown["progress"].append(lanes)
            if len(shown["progress"]) == 2:
                page.screenshot(path=SHOTS / "live-progress.png", full_page=True)
            last = lanes
        failure = page.evaluate("() => document.querySelector('#failures .failure')?.innerText ?? null")
        if shown["failure"] is None and failure:
            shown["failure"] = failure
            page.screenshot(path=SHOTS / "live-failure.png", full_page=True)
        time.sleep(0.1)


def test_the_live_page_follows_a_real_run(live_run):
    lab_dir, _, shown, port = live_run
    rc, out, errs = shown["run"]
    assert rc == 1, out + errs  # the garbage cell failed, the rest finished
    cells = (
        sqlite3.connect(lab_dir / "ledger.sqlite")
        .execute("SELECT device, quant, payload, status FROM cells")
        .fetchall()
    )
    failed = [c for c in cells if c[3] == "failed"]
    assert failed and all(c[0] == "odd" and c[1] == "q4_0" for c in failed), cells
    # the page saw both lanes, and a lane's count change while the run went (pushed: the page was never reloaded)
    counts = [
        {d: re.search(r"(\d+) done, (\d+) failed of (\d+)", t).groups() for d, t in s.items()}
        for s in shown["progress"]
    ]
    assert any(set(s) == {"odd", "fine"} for s in shown["progress"]), shown["progress"]
    fine = [c["fine"] for c in counts if "fine" in c]
    assert len(set(fine)) >= 2 and fine[-1] != fine[0], fine
    assert any("now: smollm2-135m" in t for s in shown["progress"] for t in s.values())
    # the failed cell appeared while the run went, named and with its reason
    assert shown["failure"] and shown["failure"].startswith("odd smollm2-135m q4_0"), shown["failure"]
    assert shown["reloaded_same"]  # the state is the server's: a reload shows the same page
    assert shown["explorer_title"] == "devicelab report: browser"
    assert shown["live_errors"] == []
    assert all(u.startswith(f"http://127.0.0.1:{port}/") for u in shown["live_requests"]), shown["live_requests"]


def test_the_report_explorer_in_a_real_browser(live_run, browser, tmp_path):
    lab_dir, recipe, _, _ = live_run
    out = tmp_path / "report.html"
    devicelab("report", "--lab-dir", lab_dir, "--recipe", recipe, "-o", out, check=True)
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    seen = _watch(page)
    left: list[str] = []
    page.route(
        "**/*",
        lambda route: (
            route.continue_()
            if route.request.url.startswith(("file:", "data:", "blob:"))
            else (left.append(route.request.url), route.abort())
        ),
    )
    page.goto(out.as_uri())
    page.wait_for_selector("#plot-speed .point")
    page.screenshot(path=SHOTS / "report.png", full_page=True)

    # a filter changes the plotted points, in every view, and lives in the address
    n = {v: page.locator(f"#plot-{v} .scatterlayer .point").count() for v in ("speed", "quality", "frontier")}
    assert all(n.values()), n
    page.uncheck("#filters input[name=quant][value=q8_0]")
    m = {v: page.locator(f"#plot-{v} .scatterlayer .point").count() for v in ("speed", "quality", "frontier")}
    assert all(0 < m[v] < n[v] for v in n), (n, m)
    assert "quant=" in page.evaluate("location.hash")
    assert (
        page.locator("table.results tbody tr:not([data-hidden])").count()
        < page.locator("table.results tbody tr").count()
    )
    page.screenshot(path=SHOTS / "report-filtered.png", full_page=True)
    page.reload()
    assert page.locator("#plot-speed .scatterlayer .point").count() == m["speed"]  # the selection survived
    page.check("#filters input[name=quant][value=q8_0]")

    # hovering a point shows its cell's provenance
    ids = {r[0] for r in sqlite3.connect(lab_dir / "ledger.sqlite").execute("SELECT cell_id FROM cells")}
    pt = page.locator("#plot-speed .scatterlayer .point").first
    pt.scroll_into_view_if_needed()
    box = pt.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector("#plot-speed .hoverlayer .hovertext")
    tip = page.locator("#plot-speed .hoverlayer .hovertext").first.text_content()  # SVG: its text, no layout
    cid = re.search(r"cell ([0-9a-f]{16})", tip)
    assert cid and cid.group(1) in ids, tip
    assert "llama.cpp" in tip and "build" in tip and "threads" in tip and "recorded" in tip
    page.screenshot(path=SHOTS / "report-hover.png")

    # the recommendation's constraints read as sentences, and the minimum-RAM table is there
    sentences = page.locator(".constraints li").all_inner_texts()
    assert sentences and all(s[0].isupper() and s.endswith(".") and "{" not in s for s in sentences), sentences
    assert page.locator("#min-ram").count() == 1 and page.locator("table.min-ram").count() >= 1
    # the telemetry traces: one shared time axis, prefill and decode shaded
    assert page.locator("#plot-traces .main-svg").count() >= 1
    assert page.locator("#plot-traces .shapelayer path").count() > 0
    assert seen["errors"] == [] and left == [], (seen["errors"], left)
    assert all(u.startswith(("file:", "data:", "blob:")) for u in seen["requests"])
    page.close()
