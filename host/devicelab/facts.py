"""Device facts collected on first contact (by device_payloads/facts.sh through the transport)."""

from __future__ import annotations

from .transports.base import Transport


def collect(t: Transport, kit_dir: str) -> dict:
    r = t.run(["sh", f"{kit_dir}/facts.sh", t.workdir()], timeout=60)
    facts: dict = {"transport": type(t).__name__}
    for line in r.stdout.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            facts[k.strip()] = v.strip()
    try:
        facts["mem_total_bytes"] = int(facts.get("mem.total_kB", "")) * 1024
    except ValueError:
        facts["mem_total_bytes"] = None
    try:
        facts["storage_free_bytes"] = int(facts.get("storage.free_kB", "")) * 1024
    except ValueError:
        facts["storage_free_bytes"] = None
    try:
        facts["cpu_count"] = int(facts.get("cpu.count", ""))
    except ValueError:
        facts["cpu_count"] = None
    return facts


def summary(f: dict) -> dict:
    """The facts stored with every row (the bulky feature list is kept in the artifacts)."""
    keep = ("uname", "arch", "hostname", "os", "cpu.model", "cpu.count", "cpu.parts", "cpu.max_khz",
            "mem_total_bytes", "storage_free_bytes", "android.model", "android.soc", "transport")
    return {k: f.get(k) for k in keep if f.get(k) not in (None, "")}
