"""Device facts collected on first contact (by device_payloads/facts.sh through the transport)."""

from __future__ import annotations

from .transports.base import Transport
from .transports.commands import KitScript


def collect(t: Transport, kit_dir: str, root: str = "/") -> dict:
    r = t.execute(KitScript(kit_dir, "facts.sh", (t.workdir(), root)), timeout=60)
    return parse(r.stdout, type(t).__name__)


def parse(text: str, transport: str) -> dict:
    """facts.sh's key=value lines → the facts dict (with the numbers the lab computes with)."""
    facts: dict = {"transport": transport}
    for line in text.splitlines():
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
    keep = (
        "uname",
        "arch",
        "hostname",
        "os",
        "cpu.model",
        "cpu.count",
        "cpu.parts",
        "cpu.max_khz",
        "mem_total_bytes",
        "storage_free_bytes",
        "android.model",
        "android.soc",
        "ios.model",
        "ios.marketing_name",
        "ios.chip",
        "ios.version",
        "harness.version",
        "transport",
    )
    return {k: f.get(k) for k in keep if f.get(k) not in (None, "")}


MASK_NAMES = ("prime", "big", "little", "all")


def clusters(f: dict) -> list[tuple[int, list[int]]]:
    """CPU clusters by cpuinfo_max_freq, fastest first: [(kHz, [cpu ids])] (facts.sh writes cpu.max_khz as
    'ID:kHz …'; older facts without IDs are in cpu order)."""
    by: dict[int, list[int]] = {}
    for i, tok in enumerate((f.get("cpu.max_khz") or "").split()):
        cpu, sep, khz = tok.partition(":")
        if not sep:
            cpu, khz = str(i), tok
        try:
            by.setdefault(int(khz), []).append(int(cpu))
        except ValueError:
            continue
    return sorted(((k, sorted(v)) for k, v in by.items()), reverse=True)


def named_cpus(name: str, f: dict) -> list[int] | None:
    """The CPUs a big.LITTLE-aware name selects: prime (the fastest cluster), big (every cluster but the
    slowest), little (the slowest), all. None when the device has no such split (uniform cores, or no
    CPU clock limits to tell them apart)."""
    cl = clusters(f)
    if name == "all":
        if cl:
            return sorted(c for _, cpus in cl for c in cpus)
        n = f.get("cpu_count")
        return list(range(n)) if n else None
    if len(cl) < 2:
        return None
    pick = {"prime": cl[:1], "big": cl[:-1], "little": cl[-1:]}[name]
    return sorted(c for _, cpus in pick for c in cpus)


def mask_hex(cpus: list[int]) -> str:
    """llama-bench -C / taskset hex mask."""
    return hex(sum(1 << c for c in cpus))
