"""`devicelab devices probe`: which telemetry sources a device has and can read — said plainly. Each source says
its own line (telemetry/sources/); the lines after them are the device's, not a source's."""

from __future__ import annotations

import posixpath

from . import kit as kitmod
from .lab import Device
from .telemetry import sampler_csv, sources
from .transports import open_transport, reached_through
from .transports.commands import SampleOnce


def gpu_backends(t, dev: Device, facts: dict | None = None) -> str:
    """Per backend: buildable for this device's target, or why not (the devices each build sees are listed when
    a run builds it: `--list-devices`). `facts`: the device's, where the caller has them already."""
    from . import facts as factsmod
    from .build import backends
    from .runner.session import target_for

    if facts is None:
        facts = factsmod.collect(t, kitmod.ensure(t), dev.telemetry_root)
    tgt, _ = target_for(t, dev, facts)
    out = []
    for b in backends.BACKENDS:
        try:
            backends.variant(tgt, b)
            out.append(f"{b}: yes")
        except backends.NoBackend as e:
            out.append(f"{b}: no ({e})")
    return "; ".join(out)


def device_lines(
    t, dev: Device, tr: sampler_csv.SamplerTrace, facts: dict | None = None, gpu: bool = True
) -> dict[str, tuple[bool, str]]:
    """The lines of `devices probe` that are the device's, not a source's (`gpu`: with its GPU backends)."""
    res = {"GPU backends its builds can have": (True, gpu_backends(t, dev, facts))} if gpu else {}
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
    return res


def probe(dev: Device) -> dict[str, tuple[bool, str]]:
    t = open_transport(dev)
    t.connect()
    try:
        kit = kitmod.ensure(t)
        out = posixpath.join(t.workdir(), "probe.csv")
        t.execute(SampleOnce(kit, out, 1, 10, dev.telemetry_root))
        tr = sampler_csv.parse(t.read_text(out) or "")
        view = sources.ProbeView(t, tr, sources.detect(t))
        res = {s.title: s.probe(view) for s in sources.SOURCES}
        res.update(device_lines(t, dev, tr))
        res.update(reached_through(t, dev))
        return res
    finally:
        t.close()
