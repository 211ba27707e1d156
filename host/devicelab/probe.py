"""`devicelab devices probe`: which telemetry sources a device has and can read — said plainly."""

from __future__ import annotations

import posixpath

from . import kit as kitmod
from .lab import Device
from .telemetry import normalize, sampler_csv, snapshots
from .transports import open_transport


def gpu_backends(t, dev: Device) -> str:
    """Per backend: buildable for this device's target, or why not (the devices each build sees are listed when
    a run builds it: `--list-devices`)."""
    from . import facts as factsmod
    from .build import backends
    from .runner.session import target_for
    kit = kitmod.ensure(t)
    tgt, _ = target_for(t, dev, factsmod.collect(t, kit, dev.telemetry_root))
    out = []
    for b in backends.BACKENDS:
        try:
            backends.variant(tgt, b)
            out.append(f"{b}: yes")
        except backends.NoBackend as e:
            out.append(f"{b}: no ({e})")
    return "; ".join(out)


def probe(dev: Device) -> dict[str, tuple[bool, str]]:
    t = open_transport(dev)
    t.connect()
    try:
        kit = kitmod.ensure(t)
        out = posixpath.join(t.workdir(), "probe.csv")
        t.run(["sh", f"{kit}/sampler.sh", "-o", out, "-n", "1", "-i", "10", "-R", dev.telemetry_root])
        tr = sampler_csv.parse(t.read_text(out) or "")
        has = lambda rx: [c for c in tr.columns(rx)]  # noqa: E731
        res: dict[str, tuple[bool, str]] = {}
        bat = [
            d for d, m in tr.meta.items() if m.get("kind") == "power_supply" and m.get("type", "").lower() == "battery"
        ]
        res["battery (current, voltage, level)"] = (
            bool(bat),
            ", ".join(bat) if bat else "no readable /sys/class/power_supply/*/ of type Battery",
        )
        z = has(normalize.ZONE_COLS)
        res["thermal zones"] = (
            bool(z),
            f"{len(z)} zones" if z else "no readable /sys/class/thermal/thermal_zone*/temp",
        )
        f = has(normalize.FREQ_COLS)
        pol = [c for c in f if "/policy" in c]
        res["CPU frequency"] = (
            bool(f),
            (f"{len(pol)} cpufreq policies (clusters)" if pol else f"{len(f)} CPUs")
            if f
            else "no readable cpufreq/scaling_cur_freq",
        )
        r = has(r"sys/class/powercap/(intel-rapl/)?intel-rapl:\d+/energy_uj")
        res["RAPL energy"] = (
            bool(r),
            ", ".join(r)
            if r
            else "no readable /sys/class/powercap/intel-rapl:*/energy_uj (absent, or root-only since kernel 5.10)",
        )
        rails = normalize.power_rails(tr)
        he = has(r".*hwmon\d+/energy\d+_input")
        inp = [lab for lab, _, _ in rails if normalize.INPUT_RAIL.search(lab)]
        res["power rails (hwmon, Jetson INA3221)"] = (
            bool(rails or he),
            (
                f"{len(rails)} rails ({', '.join(lab or '?' for lab, _, _ in rails)}); "
                + (f"board input {', '.join(inp)}" if inp else "no board input rail: summed")
            )
            if rails
            else f"{len(he)} hwmon energy counters"
            if he
            else "no hwmon power, current×voltage or energy inputs, nor a Jetson iio power monitor",
        )
        gpus = [f"{d} ({m.get('type')})" for d, m in tr.meta.items() if m.get("kind") == "gpu"]
        grails = [lab for lab, _, _ in rails if "GPU" in lab.upper()]
        nv = t.sh("command -v nvidia-smi >/dev/null 2>&1").rc == 0
        res["GPU telemetry (kgsl, devfreq, Tegra load, GPU rails, nvidia-smi)"] = (
            bool(gpus or grails or nv),
            "; ".join(gpus + [f"rail {x}" for x in grails] + (["nvidia-smi"] if nv else []))
            or "no readable GPU clock, load or rail, no nvidia-smi",
        )
        res["GPU backends its builds can have"] = (True, gpu_backends(t, dev))
        st = t.run(["test", "-r", "/proc/self/status"]).rc == 0
        res["payload peak RSS (/proc/PID/status)"] = (st, "VmHWM/VmRSS" if st else "no /proc (macOS: not available)")
        res["sub-second clock"] = (
            tr.clock == "proc",
            "/proc/uptime" if tr.clock == "proc" else "none: times are reconstructed from the tick count",
        )
        res["sampler pacing without a process per tick"] = (
            tr.pace == "readt",
            f"`read -t` under {tr.pace_via or 'sh'}"
            if tr.pace == "readt"
            else "no shell with a fractional `read -t` (busybox, mksh, bash ≥ 4, ksh): one `sleep` per tick, "
            "about 1% of a core at 10 Hz; install busybox to avoid it",
        )
        for tool, label in (
            ("dumpsys", "Android dumpsys battery/thermalservice"),
            ("ioreg", "macOS ioreg AppleSmartBattery"),
        ):
            ok = t.sh('command -v "$1" >/dev/null 2>&1', tool).rc == 0
            res[label] = (ok, "present" if ok else "not on this device")
        pm = snapshots.powermetrics_access(t)
        has_pm = t.sh("command -v powermetrics >/dev/null 2>&1").rc == 0
        res["macOS powermetrics (SoC energy, thermal pressure)"] = (
            bool(pm),
            f"runs as {pm}"
            if pm
            else "present but needs root: allow it with a sudoers rule "
            "(NOPASSWD: /usr/bin/powermetrics) for the SSH user"
            if has_pm
            else "not on this device",
        )
        return res
    finally:
        t.close()
