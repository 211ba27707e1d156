"""`devicelab devices probe` says plainly what a device can measure."""

from conftest import devicelab


def test_probe_this_machine_and_a_fixture_tree(tmp_path):
    root = tmp_path / "root"
    z = root / "sys/class/thermal/thermal_zone0"
    z.mkdir(parents=True)
    (z / "type").write_text("soc\n")
    (z / "temp").write_text("41000\n")
    iio = root / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"  # a Jetson Nano's power monitor
    iio.mkdir(parents=True)
    for n, (name, mw) in enumerate((("POM_5V_IN", 4200), ("POM_5V_GPU", 300), ("POM_5V_CPU", 900))):
        (iio / f"rail_name_{n}").write_text(name + "\n")
        (iio / f"in_power{n}_input").write_text(f"{mw}\n")
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        f"devices:\n  - {{name: here, transport: local}}\n"
        f"  - {{name: board-fixture, transport: local, telemetry_root: '{root}'}}\n"
    )
    p = devicelab("devices", "probe", "--lab", lab, check=True)
    here, board = p.stdout.split("board-fixture", 1)
    # this VM: no battery, no RAPL; said as "no", not as zeros
    assert "no  battery" in here and "no readable /sys/class/power_supply" in here
    assert "yes payload peak RSS" in here
    assert "yes thermal zones: 1 zones" in board
    assert (
        "yes power rails (hwmon, Jetson INA3221): 3 rails (POM_5V_IN, POM_5V_GPU, POM_5V_CPU); board input POM_5V_IN"
        in " ".join(board.split())
    )
    assert "no  power rails" in here
