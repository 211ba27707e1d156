"""GPU telemetry: the real device-side sampler under dash, busybox and mksh against fixture trees laid out as
the devices lay them out (Adreno's kgsl, a Mali devfreq GPU, a Jetson's Tegra load and VDD_GPU rail; none of
those GPUs is here), and nvidia-smi's CSV as it prints it (an H200's lines; no NVIDIA GPU here), normalized
into the schema: W and J, bytes, Hz, busy share, °C; what no source gives is NaN with the reason."""

import math
import subprocess
from pathlib import Path

import pytest
from test_sampler import SAMPLER, SHELLS

from devicelab.telemetry import normalize, sampler_csv
from devicelab.telemetry.sources import nvidia_smi

pytestmark = pytest.mark.beside  # it mostly waits: the suite runs it beside the others (conftest.py)


def _tree(root: Path, files: dict) -> Path:
    for rel, v in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{v}\n")
    return root


ADRENO = {
    "sys/class/kgsl/kgsl-3d0/gpuclk": 585000000,
    "sys/class/kgsl/kgsl-3d0/gpubusy": "   6250    25000",
    "sys/class/kgsl/kgsl-3d0/temp": 51300,
    "sys/class/kgsl/kgsl-3d0/devfreq/cur_freq": 585000000,
}
MALI = {"sys/class/devfreq/13000000.gpu/cur_freq": 848000000, "sys/class/devfreq/dmc/cur_freq": 2133000000}
JETSON = {
    "sys/devices/platform/gpu.0/load": 730,
    "sys/class/hwmon/hwmon1/name": "ina3221",
    "sys/class/hwmon/hwmon1/in1_label": "VDD_IN",
    "sys/class/hwmon/hwmon1/in1_input": 5000,
    "sys/class/hwmon/hwmon1/curr1_input": 1200,
    "sys/class/hwmon/hwmon1/in2_label": "VDD_CPU_GPU_CV",
    "sys/class/hwmon/hwmon1/in2_input": 5000,
    "sys/class/hwmon/hwmon1/curr2_input": 400,
}


def _sample(shell, root, out, seconds=0.6):
    payload = subprocess.Popen(["sleep", str(seconds)])
    try:
        p = subprocess.run(
            [*shell, str(SAMPLER), "-o", str(out), "-p", str(payload.pid), "-i", "100", "-R", str(root), "-S"],
            check=True,
            timeout=30,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert p.stderr == ""
    finally:
        payload.wait()
    return sampler_csv.parse(out.read_text())


def _by(tr, nv=None):
    return {r.metric: r for r in normalize.gpu_rows(tr, {nvidia_smi.SOURCE.name: nv} if nv else None)}


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_adreno_mali_and_jetson_trees(tmp_path, shell):
    a = _by(_sample(shell, _tree(tmp_path / "adreno", ADRENO), tmp_path / "a.csv"))
    assert a["gpu_freq_mean"].value == pytest.approx(585e6) and a["gpu_busy_mean"].value == pytest.approx(0.25)
    assert a["gpu_temp_max"].value == pytest.approx(51.3)
    assert math.isnan(a["gpu_power_mean"].value) and "no GPU telemetry" in a["gpu_power_mean"].missing_reason
    m = _by(_sample(shell, _tree(tmp_path / "mali", MALI), tmp_path / "m.csv"))
    assert m["gpu_freq_mean"].value == pytest.approx(848e6)  # the GPU's devfreq, not the memory bus's
    assert math.isnan(m["gpu_busy_mean"].value)
    j = _by(_sample(shell, _tree(tmp_path / "jetson", JETSON), tmp_path / "j.csv"))
    assert j["gpu_busy_mean"].value == pytest.approx(0.73)
    assert j["gpu_power_mean"].value == pytest.approx(2.0) and "VDD_CPU_GPU_CV" in j["gpu_power_mean"].test
    assert j["gpu_energy"].value > 0


NVSMI = """timestamp, index, name, power.draw [W], memory.used [MiB], utilization.gpu [%], temperature.gpu, \
clocks.sm [MHz], clocks_throttle_reasons.active
2026/12/03 15:04:05.100, 0, NVIDIA H200, 118.52, 1, 0, 31, 345, 0x0000000000000001
2026/12/03 15:04:05.200, 0, NVIDIA H200, 402.10, 2210, 97, 38, 1980, 0x0000000000000000
2026/12/03 15:04:05.300, 0, NVIDIA H200, 455.77, 2210, 100, 40, 1980, 0x0000000000000000
2026/12/03 15:04:05.400, 0, NVIDIA H200, [N/A], 1730, 64, 41, 1980, 0x0000000000000004
"""


def test_nvidia_smi_csv(tmp_path):
    s = nvidia_smi.parse(NVSMI)
    assert len(s) == 4 and s[0]["name"] == "NVIDIA H200" and s[3]["power_w"] is None
    assert s[1]["mem_bytes"] == 2210 * 1024**2 and s[2]["busy"] == 1.0 and s[0]["throttle"] == 1
    assert s[1]["t"] - s[0]["t"] == pytest.approx(0.1, abs=1e-3)
    empty = tmp_path / "e.csv"
    empty.write_text("tick,t_s\n")
    g = _by(sampler_csv.parse(empty.read_text()), s)
    assert g["gpu_mem_peak"].value == 2210 * 1024**2 and g["gpu_temp_max"].value == 41
    assert g["gpu_power_mean"].value == pytest.approx((118.52 + 402.10 + 455.77) / 3)
    # trapezoids over the three samples with power: 0.1 s × (118.52+402.10)/2 + 0.1 s × (402.10+455.77)/2
    assert g["gpu_energy"].value == pytest.approx(0.1 * (118.52 + 402.10) / 2 + 0.1 * (402.10 + 455.77) / 2)
    assert g["gpu_freq_mean"].value == pytest.approx((345 + 1980 * 3) / 4 * 1e6)
    assert "nvidia-smi NVIDIA H200" in g["gpu_busy_mean"].test


def test_nvidia_smi_rounds_of_several_gpus():
    """The lab's own query on two GPUs: each GPU's row has its own timestamp; a round is the run of rows of distinct
    GPUs, summed. A GPU's '[N/A]' leaves its round out of the sums (never a partial sum) and says why."""
    head = NVSMI.splitlines()[0]
    text = "\n".join(
        [
            head,
            "2026/12/03 15:04:05.100, 0, NVIDIA H200, 100.00, 1000, 50, 40, 1980, 0x0000000000000000",
            "2026/12/03 15:04:05.104, 1, NVIDIA H200, 200.00, 3000, 100, 45, 1980, 0x0000000000000000",
            "2026/12/03 15:04:06.100, 0, NVIDIA H200, 300.00, 1000, 50, 41, 1980, 0x0000000000000000",
            "2026/12/03 15:04:06.103, 1, NVIDIA H200, 400.00, 5000, 100, 46, 1980, 0x0000000000000000",
            "2026/12/03 15:04:07.100, 0, NVIDIA H200, [N/A], 1000, 50, 41, 1980, 0x0000000000000000",
            "2026/12/03 15:04:07.102, 1, NVIDIA H200, 400.00, 5000, 100, 46, 1980, 0x0000000000000000",
        ]
    )
    s = nvidia_smi.parse(text, nvidia_smi.QUERY)
    assert [x["round"] for x in s] == [0, 0, 1, 1, 2, 2] and s[4]["why"] == {"power_w": "nvidia-smi reports [N/A]"}
    g = nvidia_smi.gpu_figures(s)
    assert g["gpu_power_mean"][0] == pytest.approx((300 + 700) / 2)
    assert g["gpu_energy"][0] == pytest.approx(1.0 * (300 + 700) / 2)
    assert g["gpu_mem_peak"][0] == 6000 * 1024**2
    none = nvidia_smi.gpu_figures(nvidia_smi.parse("\n".join(text.splitlines()[:1] + text.splitlines()[5:6])))
    assert math.isnan(none["gpu_power_mean"][0]) and "[N/A] on NVIDIA H200" in none["gpu_power_mean"][1]
