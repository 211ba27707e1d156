"""What real devices printed for other people, fed through the lab's own parsers.

tests/fixtures/real/<format>/NAME.toml describes one capture: the file it names (`capture`, default NAME.* beside
it), where it was published (`source`: a repository, path and commit, or an issue's address), the device and OS
(`device`), and under [expect] the values a person reads off it, written by hand. `{missing = "why"}` expects the
figure missing with a reason containing "why"; a top-level `unsupported = "why"` expects the capture refused in
one line. Numbers match to `tolerance` (relative, default 1e-3). Nothing here was printed by this project."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

from devicelab import captures

REAL = Path(__file__).parent / "fixtures" / "real"
SPECS = sorted(REAL.glob("*/*.toml"))
COMMIT_OR_URL = re.compile(r"(https?://\S+|\S+/\S+ @ [0-9a-f]{7,40})")
# a capture of the user's own device, made by `devicelab doctor --bundle-to-fixture` (doctor.source_line)
DOCTOR_BUNDLE = re.compile(r"devicelab doctor bundle of \S[^\n]* on \d{4}-\d{2}-\d{2}")


def _spec(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def capture_of(spec_path: Path, spec: dict) -> Path:
    if "capture" in spec:
        return spec_path.parent / spec["capture"]
    found = [p for p in spec_path.parent.glob(spec_path.stem + ".*") if p.suffix != ".toml"]
    assert len(found) == 1, f"{spec_path}: name its capture file (`capture = …`); found {found}"
    return found[0]


def _check(name: str, got, want, tol: float) -> None:
    if isinstance(want, dict) and set(want) == {"missing"}:
        assert isinstance(got, captures.Missing), f"{name}: expected missing ({want['missing']}), got {got!r}"
        assert want["missing"].lower() in got.reason.lower(), f"{name}: reason {got.reason!r}"
        return
    assert not isinstance(got, captures.Missing), f"{name}: expected {want!r}, got {got}"
    if isinstance(want, (bool, str)):
        assert got == want, f"{name}: expected {want!r}, got {got!r}"
    elif isinstance(want, (int, float)):
        assert got is not None and isinstance(got, (int, float)), f"{name}: expected {want!r}, got {got!r}"
        assert math.isclose(float(got), float(want), rel_tol=tol, abs_tol=tol * 1e-3), f"{name}: {got!r} != {want!r}"
    elif isinstance(want, list):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{name}: expected {want!r}, got {got!r}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _check(f"{name}[{i}]", g, w, tol)
    else:
        raise AssertionError(f"{name}: cannot compare with {want!r}")


@pytest.mark.parametrize("spec_path", SPECS, ids=[f"{p.parent.name}/{p.stem}" for p in SPECS])
def test_real_capture(spec_path: Path):
    check_capture(spec_path)


def check_capture(spec_path: Path) -> None:
    """One corpus entry through the lab's reader of its format: its [expect] values, or its refusal in one line."""
    spec = _spec(spec_path)
    cap = capture_of(spec_path, spec)
    fmt = spec.get("format", spec_path.parent.name)
    if "unsupported" in spec:
        with pytest.raises(captures.Unsupported) as e:
            captures.read(fmt, cap)
        msg = str(e.value)
        assert "\n" not in msg.strip() and spec["unsupported"].lower() in msg.lower(), msg
        return
    got = captures.read(fmt, cap)
    expect = spec.get("expect") or {}
    assert expect, f"{spec_path}: no [expect] values"
    for k, want in expect.items():
        assert k in got, f"{spec_path.name}: the parser gave no {k!r} (it gave {sorted(got)})"
        _check(f"{spec_path.parent.name}/{spec_path.stem}: {k}", got[k], want, spec.get("tolerance", 1e-3))


def test_every_capture_says_where_it_comes_from():
    for p in SPECS:
        check_source(p)


def check_source(p: Path) -> None:
    """An address, 'owner/repo/path @ commit', or a doctor bundle of a named device on a date — and the device."""
    spec = _spec(p)
    src = spec.get("source", "")
    assert COMMIT_OR_URL.search(src) or DOCTOR_BUNDLE.fullmatch(src), (
        f"{p}: source must be an address, 'owner/repo/path @ commit' or 'devicelab doctor bundle of DEVICE on DATE'"
    )
    assert spec.get("device"), f"{p}: which device and OS printed it?"


def test_the_corpus_covers_every_parser():
    """Every capture format the lab reads has real captures; the corpus is at least 80 captures in 15 formats."""
    have = {p.parent.name for p in SPECS} | {_spec(p).get("format") for p in SPECS} - {None}
    untested = sorted(set(captures.formats()) - have)
    assert not untested, f"formats with no real capture: {untested}"
    print(f"real captures: {len(SPECS)} in {len({p.parent.name for p in SPECS})} formats")
    assert len(SPECS) >= 80 and len({p.parent.name for p in SPECS}) >= 15


def test_an_unknown_format_says_what_there_is():
    with pytest.raises(captures.UnknownFormat, match="available: "):
        captures.read("nope", REAL)
