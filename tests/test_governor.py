"""CPU governor pinning: the real device_payloads/governor.sh under dash and busybox sh against a fixture
cpufreq tree (no rooted phone here; the tests run as root, so the permission-denied path — which undoes
a half-done pin — is not exercised), and the executor's wiring on the local target."""

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import devicelab

from devicelab import paths
from devicelab.ledger import ledger_path

SHELLS = [s for s in (["dash"], ["busybox", "sh"]) if shutil.which(s[0])]
SCRIPT = paths.device_payloads_dir() / "governor.sh"


def cpufreq_tree(root: Path) -> Path:
    for pol in ("policy0", "policy4", "policy7"):
        d = root / "sys/devices/system/cpu/cpufreq" / pol
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text("schedutil\n")
        (d / "scaling_available_governors").write_text("schedutil performance powersave\n")
    return root


def govs(root: Path) -> list[str]:
    return [p.read_text().strip() for p in sorted(root.glob("sys/devices/system/cpu/cpufreq/policy*/scaling_governor"))]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_pin_and_restore(tmp_path, shell):
    root = cpufreq_tree(tmp_path / "root")
    state = tmp_path / "saved"
    sh = lambda *a: subprocess.run([*shell, str(SCRIPT), *a], capture_output=True, text=True, check=True).stdout.strip()
    assert sh("set", "performance", str(state), str(root)) == "pinned 3 performance"
    assert govs(root) == ["performance"] * 3
    assert sh("restore", str(state), str(root)) == "restored 3"
    assert govs(root) == ["schedutil"] * 3 and not state.exists()
    assert sh("set", "turbo", str(state), str(root)).startswith("unsupported: governor turbo not offered")
    assert govs(root) == ["schedutil"] * 3
    assert sh("set", "performance", str(state), str(tmp_path / "empty")).startswith("unsupported: no cpufreq")


def test_executor_pins_records_and_restores(tmp_path, host_build, smol_path):
    root = cpufreq_tree(tmp_path / "root")
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        f"devices:\n  - name: pinned\n    transport: local\n    governor: performance\n    telemetry_root: {root}\n"
    )
    r = tmp_path / "r.yaml"
    r.write_text(
        "name: gov\ndevices: [pinned]\nmodels: [{name: smollm2-135m}]\nquants: [q4_0]\npayloads:\n"
        "  - {kind: bench, prompt: [8], gen: [4], threads: [1], repetitions: 1}\n"
    )
    p = devicelab("run", r, "--lab", lab, "--lab-dir", tmp_path / "out")
    assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    rows = Ledger(ledger_path(tmp_path / "out")).rows_frame()
    assert (rows.governor == "pinned 3 performance").all()
    assert govs(root) == ["schedutil"] * 3  # restored after the device's cells
