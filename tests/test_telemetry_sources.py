"""The telemetry sources' registry: each source is one unit, and the rest of devicelab asks the registry."""

import pytest

from devicelab.telemetry import normalize, sources
from devicelab.telemetry.sources import nvidia_smi, powermetrics


def test_unknown_source_says_what_there_is():
    assert sources.get("rapl").title == "RAPL energy"
    with pytest.raises(sources.UnknownSource, match=r"unknown telemetry source 'nope'; available: .*rapl"):
        sources.get("nope")


def test_every_source_declares_its_probe_line_and_what_it_needs():
    assert len({s.name for s in sources.SOURCES}) == len(sources.SOURCES)
    for s in sources.SOURCES:
        assert s.title and s.needs, s.name
        assert type(s).probe is not sources.Source.probe, f"{s.name} has no probe line"


def test_what_a_cell_asks_of_the_registry():
    assert set(sources.pulled()) == {nvidia_smi.FILE, powermetrics.FILE}
    assert {"dumpsys", "ioreg", "pmset", "powermetrics", "nvidia-smi"} == set(sources.tools())
    on = sources.DeviceSources(
        sources.DeviceAccess("d", t=None, tools={"nvidia-smi"}), {"nvidia-smi": "1", "powermetrics": "sudo"}
    )
    assert on.env() == {"DEVICELAB_NVIDIA_SMI": "1", "DEVICELAB_POWERMETRICS": "sudo"}
    assert on.around() == []  # no dumpsys: no charging hygiene


def test_missing_reasons_name_the_sources_that_could_have_given_the_figure():
    assert normalize.NO_POWER == (
        "no power source readable on this device (no battery current/voltage, RAPL or hwmon power)"
    )
    assert normalize.NO_GPU == (
        "no GPU telemetry readable on this device (kgsl, devfreq GPU, Tegra load, GPU rail or nvidia-smi)"
    )
