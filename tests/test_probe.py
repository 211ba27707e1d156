"""`devicelab devices probe` says plainly what a device can measure."""

from conftest import devicelab


def test_probe_this_machine_and_a_fixture_tree(tmp_path):
    root = tmp_path / "root"
    z = root / "sys/class/thermal/thermal_zone0"
    z.mkdir(parents=True)
    (z / "type").write_text("soc\n")
    (z / "temp").write_text("41000\n")
    lab = tmp_path / "lab.yaml"
    lab.write_text(f"devices:\n  - {{name: here, transport: local}}\n"
                   f"  - {{name: board-fixture, transport: local, telemetry_root: '{root}'}}\n")
    p = devicelab("devices", "probe", "--lab", lab, check=True)
    here, board = p.stdout.split("board-fixture", 1)
    # this VM: no battery, no RAPL; said as "no", not as zeros
    assert "no  battery" in here and "no readable /sys/class/power_supply" in here
    assert "yes payload peak RSS" in here
    assert "yes thermal zones: 1 zones" in board
