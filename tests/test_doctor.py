"""`devicelab doctor` on every real peer this machine has: the local host, the SSH board in its own network namespace,
the adb phone peer in Android's userland (mksh + toybox), the stand-in Mac and its stand-in iPhone. Each prints the
checklist and exits 0 where everything the lab needs is there; a failing assumption (a device that is unreachable, a
missing command) prints its line with the fix and exits 1. Each bundle, turned into corpus entries
(`--bundle-to-fixture`), passes the corpus's own checks (tests/test_real_captures.py): the lab's readers take from
the bundled texts what the lab read from the device live.

Only the local host runs the bench cell, with the session's shared host build (`host_build`): a bench on the board,
the phone or the iPhone would need their own llama.cpp builds (the static aarch64 one under qemu, the app), cold
builds the suite has no time for; those runs of the lab are test_ssh's, test_adb's and test_ios's."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from adbd_peer import BATTERY, PROPS
from conftest import FIXTURES, devicelab
from sshd_peer import SSHD, free_port
from test_real_captures import check_capture, check_source

from devicelab import doctor as dr

# it mostly waits (stand-in peers answering): the suite runs it beside the modules that need the aarch64 build
pytestmark = pytest.mark.beside("aarch64")
HAS_SSHD = Path(SSHD).exists()


def run_doctor(*args, env=None):
    p = devicelab("doctor", *map(str, args), env=env, timeout=600)
    print(p.stdout, p.stderr)  # the checklist as a person sees it, in the test's report
    return p


def corpus_from(bundle: Path, out: Path) -> dict[str, dict]:
    """The bundle as corpus entries (the CLI), each through the corpus's checks: {format/name: its TOML}."""
    import tomllib

    p = devicelab("doctor", "--bundle-to-fixture", bundle, out, check=True)
    specs = sorted(out.glob("*/*.toml"))
    assert specs and f"{len(specs)} corpus entries" in p.stdout, p.stdout
    for s in specs:
        check_source(s)
        check_capture(s)
    return {f"{s.parent.name}/{s.stem}": tomllib.loads(s.read_text()) for s in specs}


def lines_of(stdout: str) -> dict[str, str]:
    """The checklist's lines by title (mark and detail), the first of each title."""
    out = {}
    for ln in stdout.splitlines():
        s = ln.strip()
        if s[:1] in dr.MARK.values() and ": " in s:
            title, detail = s[2:].split(": ", 1)
            out.setdefault(title.strip(), f"{s[0]} {detail}")
    return out


def bundle_texts(bundle: Path) -> dict[str, str]:
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


# ---------------------------------------------------------------- the local host, with its bench cell
@pytest.mark.e2e
def test_doctor_on_the_local_host_with_its_bench_cell(tmp_path, host_build, smol_path):
    """Every check on this machine, the bench cell with the shared host build: exit 0, the row it produced printed;
    the bundle's llama-bench JSONL, as a corpus entry, gives the speeds the ledger holds."""
    lab_dir, bundle = tmp_path / "lab", tmp_path / "local.tar.gz"
    p = run_doctor("--lab-dir", lab_dir, "--bundle", bundle)
    assert p.returncode == 0, p.stdout + p.stderr
    got = lines_of(p.stdout)
    for title in ("reachable", "shell and userland", "work folder", "verified push", "device facts", "free space"):
        assert got[title].startswith("✓"), (title, p.stdout)
    assert got["build target"].startswith("✓ x86_64-linux-native") or "native" in got["build target"]
    assert got["sampler rate"].startswith("✓") and "ms a tick" in got["sampler rate"]
    assert got["clock offset"].startswith("✓") and "this host by" in got["clock offset"]
    assert got["bench cell"].startswith("✓") and "tg16 " in got["bench cell"] and "tok/s" in got["bench cell"], p.stdout
    from devicelab.ledger import Ledger, ledger_path

    led = Ledger(ledger_path(lab_dir / "doctor" / "local"))
    rows = led.rows_frame(recipe="doctor")
    led.close()
    decode = rows[rows.metric == "decode_tps"].value.iloc[0]
    entries = corpus_from(bundle, tmp_path / "real")
    bench = next(v for k, v in entries.items() if k.startswith("llama-bench-jsonl/"))
    tps = sorted(v for k, v in bench["expect"].items() if k.endswith(".tps"))
    assert any(abs(x - decode) / decode < 1e-6 for x in tps), (tps, decode)
    assert bench["source"].startswith("devicelab doctor bundle of ") and "on 20" in bench["source"]
    cpu = next(v for k, v in entries.items() if k.startswith("cpuinfo/"))
    assert cpu["expect"]["cpu.model"] in p.stdout  # the facts line the device printed


# ---------------------------------------------------------------- the SSH board in its namespace
@pytest.mark.skipif(not HAS_SSHD, reason="needs openssh-server")
def test_doctor_on_the_ssh_board_in_its_namespace(netns_sshd, tmp_path):
    """The board behind its veth pair, its target the static aarch64 build its cpu_features pick (the flag and the
    features it came from are said). --no-bench: its bench would need that build (cold, minutes) run under qemu."""
    sshd, _ = netns_sshd
    lab = tmp_path / "lab.yaml"
    lab.write_text(sshd.lab_yaml("board", "    target: aarch64\n    cpu_features: 'fp asimd asimddp'\n"))
    bundle = tmp_path / "board.tar.gz"
    p = run_doctor("board", "--lab", lab, "--lab-dir", tmp_path / "lab", "--no-bench", "--bundle", bundle)
    assert p.returncode == 0, p.stdout + p.stderr
    got = lines_of(p.stdout)
    assert got["reachable"].startswith("✓"), p.stdout
    assert "GGML_CPU_ARM_ARCH=armv8.2-a+dotprod" in got["build target"] and "asimddp" in got["build target"]
    assert "target: aarch64" in got["build target"]
    assert got["bench cell"].startswith("-") and "--no-bench" in got["bench cell"]
    assert sshd.host not in "".join(bundle_texts(bundle).values())  # the board's address, were it there
    corpus_from(bundle, tmp_path / "real")


# ---------------------------------------------------------------- the adb phone peer in Android's userland
PHONE_PROPS = {**PROPS, "ro.serialno": "R5CW31XYZ7A"}  # a serial number, which the bundle must not carry


def _phone_tree(root: Path) -> Path:
    bat = root / "sys/class/power_supply/battery"
    bat.mkdir(parents=True)
    for k, v in {**BATTERY, "serial_number": "BAT0SN12345"}.items():
        (bat / k).write_text(v + "\n")
    for i, (kind, temp) in enumerate((("cpu-1-0-usr", "39500"), ("battery", "30100"))):
        z = root / f"sys/class/thermal/thermal_zone{i}"
        z.mkdir(parents=True)
        (z / "type").write_text(kind + "\n")
        (z / "temp").write_text(temp + "\n")
    return root


@pytest.mark.skipif(not shutil.which("adb"), reason="needs the adb host server (Debian package adb)")
def test_doctor_on_the_phone_peer_in_android_userland(adb, tmp_path):
    """The phone peer with Android's shell and coreutils (mksh, toybox: no awk, no dd — said, not failed), its
    battery and zones in a sysfs tree, dumpsys answering from real-format fixtures. The battery's power as the lab
    reads it live (0.35 A × 3.912 V) and the hottest zone; the bundle has no serial number; its corpus entries give
    the zone the device gave. --no-bench: the phone's bench needs the static aarch64 build under qemu (test_adb)."""
    from adbd_peer import AdbdPeer, fake_dumpsys
    from test_adb import ANDROID_USERLAND

    keys = tmp_path / "adb_keys"
    keys.write_text(adb.pubkey.read_text())
    userland = "android" if ANDROID_USERLAND else "host"
    peer = AdbdPeer(tmp_path / "peer", free_port(), keys, PHONE_PROPS, userland=userland).start()
    snaps = FIXTURES / "snapshots"
    fake_dumpsys(
        peer,
        snaps / "dumpsys-battery-unplugged.txt",
        snaps / "dumpsys-thermalservice.txt",
        snaps / "dumpsys-meminfo.txt",
    )
    root = _phone_tree(tmp_path / "sysfs")
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        f"devices:\n  - name: phone\n    transport: adb\n    serial: '127.0.0.1:{peer.port}'\n"
        f"    adb_port: {adb.port}\n    workdir: '{tmp_path}/phone-tmp'\n    telemetry_root: '{root}'\n"
    )
    bundle = tmp_path / "phone.tar.gz"
    try:
        p = run_doctor("--lab", lab, "--lab-dir", tmp_path / "lab", "--no-bench", "--bundle", bundle)
    finally:
        peer.kill()
    assert p.returncode == 0, p.stdout + p.stderr
    got = lines_of(p.stdout)
    assert "Peer 7 (SM8550 kalama), Android 14 (SDK 34)" in got["device facts"]
    battery = next(v for k, v in got.items() if k.startswith("battery"))
    assert battery.startswith("✓") and "power 1.37 W now" in battery, battery
    assert "calibration: " in battery and "no calibration kept for this device yet" in battery
    zones = next(v for k, v in got.items() if k.startswith("thermal zones"))
    assert "hottest 39.5 °C" in zones
    if ANDROID_USERLAND:
        assert got["shell and userland"].startswith("!") and "awk" in got["shell and userland"]
    assert "aarch64-linux-static" in got["build target"] or "android" in got["build target"]
    texts = bundle_texts(bundle)
    assert not any("R5CW31XYZ7A" in t or "BAT0SN12345" in t for t in texts.values())
    m = json.loads(texts["manifest.json"])
    assert {r["what"] for r in m["replaced"]} >= {"serial"}
    entries = corpus_from(bundle, tmp_path / "real")
    tz = next(v for k, v in entries.items() if k.startswith("thermal-zones/"))
    assert tz["expect"]["hottest_c"] == pytest.approx(39.5)
    assert "Peer 7" in tz["device"] and "devicelab doctor bundle of Peer 7" in tz["source"]


# ---------------------------------------------------------------- the stand-in Mac and iPhone
@pytest.mark.skipif(not HAS_SSHD, reason="needs openssh-server")
def test_doctor_on_the_standin_mac_and_iphone(mac, tmp_path):
    """Both entries of a Mac-and-iPhone lab file: the Mac over SSH; the iPhone, which has no shell, through its
    transport (the app built and installed on the Mac first, as a run does: its facts are the app's). --no-bench: an
    iPhone's bench is the app's cells (test_ios)."""
    lab = mac.lab(tmp_path / "lab.yaml")
    bundle = tmp_path / "apple.tar.gz"
    p = run_doctor("--lab", lab, "--lab-dir", tmp_path / "lab", "--no-bench", "--bundle", bundle)
    assert p.returncode == 0, p.stdout + p.stderr
    phone = p.stdout.split("iphone (", 1)[1]
    got = lines_of(phone)
    assert got["shell and userland"].startswith("✓") and "none needed" in got["shell and userland"]
    assert got["device facts"].startswith("✓") and got["verified push"].startswith("✓")
    assert next(v for k, v in got.items() if k.startswith("devicelab harness")).startswith("✓")
    assert got["clock offset"].startswith("-")
    corpus_from(bundle, tmp_path / "real")


# ---------------------------------------------------------------- failing assumptions
def test_an_unreachable_device_and_a_missing_command_each_say_their_fix(tmp_path):
    """An SSH board nothing answers for: its reachable line fails with the fix and the rest is skipped. This machine
    with a PATH without mkfifo: the userland line names it, what needs it, and how to get it. Both exit 1."""
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        f"devices:\n  - {{name: gone, transport: ssh, host: 127.0.0.1, port: {free_port()}, user: nobody}}\n"
    )
    p = run_doctor("gone", "--lab", lab, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 1, p.stdout + p.stderr
    got = lines_of(p.stdout)
    assert got["reachable"].startswith("✗") and "fix: check that gone is on and reachable" in p.stdout
    assert "port: " in p.stdout and got["the other checks"].startswith("-")

    path = tmp_path / "bin"
    path.mkdir()
    names = {*dr.REQUIRED, *(c for g in dr.ANY_OF for c in g), *dr.OPTIONAL, "sed", "ls", "id", "env", "true"}
    for name in sorted(names - {"mkfifo"}):
        if shutil.which(name):
            (path / name).symlink_to(shutil.which(name))
    p = run_doctor("--lab-dir", tmp_path / "lab", "--no-bench", env={"PATH": str(path)})
    assert p.returncode == 1, p.stdout + p.stderr
    line = lines_of(p.stdout)["shell and userland"]
    assert line.startswith("✗") and "mkfifo (the payload's output timed line by line" in line
    assert "fix: install them on the device (one busybox or toybox binary has them all)" in p.stdout


# ---------------------------------------------------------------- the bundle's redaction, pure
def test_the_bundle_replaces_serials_host_and_user_names_and_tokens(tmp_path):
    """What a bug report must not carry, replaced wherever it occurs as a whole word; numbers and system names
    stay; the manifest says what was replaced and where, never the value."""
    rep = dr.DeviceReport("phone", "adb", model="Pixel 8 (Tensor G3), Android 14")
    rep.secrets = {"host": {"alices-mbp.lan"}, "user": {"root"}, "serial": {"35261FDH2000XY"}}
    text = (
        "[ro.serialno]: [35261FDH2000XY]\n[ro.boot.serialno]: [35261FDH2000XY]\nhostname=alices-mbp.lan\n"
        "model_filename=/home/alice/.cache/m.gguf\nHF_TOKEN=hf_abcdefghijklmnop\nuser root, voltage 3912000\n"
        '"BatterySerialNumber" = "F5D123456789"\n'
    )
    rep.captures.append(dr.Capture("getprop.txt", text, "getprop"))
    m = dr.write_bundle([rep], tmp_path / "b.tar.gz")
    out = bundle_texts(tmp_path / "b.tar.gz")["phone/getprop.txt"]
    for secret in ("35261FDH2000XY", "alices-mbp.lan", "alice", "hf_abcdefghijklmnop", "F5D123456789"):
        assert secret not in out and secret not in json.dumps(m), secret
    assert "3912000" in out and "user root" in out and "<serial-" in out and "<host-1>" in out
    assert {r["what"] for r in m["replaced"]} == {"serial", "host", "user", "token"}
    assert all(r["in"] == ["phone/getprop.txt"] for r in m["replaced"])
