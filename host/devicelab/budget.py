"""One app's memory budget on a device, and where it came from; a device's battery capacity.

Measured at first contact from what the device says (device_payloads/facts.sh), kept in the ledger like the
idle baseline, and carried by every row (`ram_budget_bytes`, `ram_budget_source`, `battery_wh`,
`battery_source`). Sources, best first:

- the lab file's `ram_budget_bytes` (the user knows better);
- iOS: `os_proc_available_memory()` (the harness's `mem.app_available_bytes`): what the OS itself says the app
  may still allocate before jetsam ends it;
- Android: `dumpsys meminfo`'s free RAM (free + cached processes + cached kernel: what the low-memory killer
  can hand one app), else MemAvailable at idle; either less the killer's foreground threshold where the
  kernel exposes one (`/sys/module/lowmemorykiller/parameters/minfree`, first entry);
- macOS: `vm_stat`'s free + inactive + speculative + purgeable pages, else `memory_pressure`'s free share;
- Linux boards, laptops, servers: MemAvailable at idle;
- a phone that says nothing better: the phone rule below, from its RAM class.

The phone rule. The published guidance for phones (Q4_K_M: 4 GB+ for a 1B model, 6 GB+ for 3B; Q5_K_M
6/8 GB+; Q8_0 8/12 GB+) is met by one app getting 5/8 of the phone's marketed RAM less 1.56 GiB (Android,
its services and the apps kept warm take the rest): 0.94 GiB on a 4 GB phone, 2.19 on 6, 3.44 on 8, 5.94 on
12. The guidance cannot be met on all of its cells by any rule that follows memory need: a 3B Q4_K_M
(2.02 GB + KV) needs more than a 1B Q8_0 (1.32 GB + KV), yet the table puts the first on 6 GB phones and
the second on 8. The rule agrees with the other 23 of its 24 (model, quant, phone) cells and fits the 1B
Q8_0 on a 6 GB phone, as its bytes say (tests/test_budget.py).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

GiB = 1024**3
MiB = 1024**2
PAGE = 4096  # Linux/Android page size for the LMK's minfree (in pages)
PHONE_CLASSES_GB = (2, 3, 4, 6, 8, 12, 16, 18, 24)  # marketed phone RAM sizes
TABLE_PHONES_GB = (4, 6, 8, 12, 16)  # the minimum-RAM table's phone columns
TABLE_LAPTOPS_GB = (8, 16, 32, 64)  # and its laptop columns
PHONE_SHARE, PHONE_RESERVE = 5 / 8, 1.56 * GiB


@dataclass(frozen=True)
class Budget:
    bytes: int | None
    # lab file | os_proc_available_memory | dumpsys meminfo | MemAvailable | vm_stat | memory_pressure | phone rule
    source: str
    detail: str  # how it was reckoned, in words

    def to_json(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return f"{self.source}: {self.detail}" if self.detail else self.source


def gib(b: float) -> str:
    return f"{b / GiB:.2f} GiB"


def ram_class_gb(total_bytes: float, classes=PHONE_CLASSES_GB) -> int:
    """The marketed RAM size of a device from its MemTotal (the kernel sees less than is fitted: carve-outs for
    the modem, GPU and firmware): the smallest class at or above it."""
    g = total_bytes / GiB
    return next((c for c in classes if c >= g), classes[-1])


def phone_rule(class_gb: float) -> int:
    """One app's budget on a phone of this marketed RAM size when the phone says nothing better."""
    return max(0, int(PHONE_SHARE * class_gb * GiB - PHONE_RESERVE))


def laptop_rule(class_gb: float, fraction: float) -> int:
    """A laptop or desktop of this RAM size: the recipe's `ram_fraction` of it."""
    return int(fraction * class_gb * GiB)


def _int(facts: dict, key: str) -> int | None:
    try:
        return int(str(facts.get(key, "")).replace(",", "").strip())
    except ValueError:
        return None


MEMINFO = "dumpsys meminfo"
# ' Free RAM: 3,503,356K (  380,348K cached pss + …)' (Android 7 and later), ' Free RAM: 1182598 kB (59686 cached
# pss + …)' (Android 4.4–6: kB, no thousands separators), ' Free RAM:    4202440 kB' (no breakdown)
_FREE_RAM = re.compile(r"Free RAM:\s*([\d,]+)\s*(?:K|kB)\b")


def dumpsys_free_kb(text: str) -> int | None:
    """`dumpsys meminfo`'s Free RAM line → kB (KiB: Android's K), in every format it has been printed in."""
    m = _FREE_RAM.search(text or "")
    return int(m.group(1).replace(",", "")) if m else None


def no_free_ram(facts: dict) -> str:
    """Why the meminfo reading gave no free RAM (said where the budget falls back to MemAvailable)."""
    if "mem.dumpsys_free" not in facts:
        return f"no {MEMINFO} reading at first contact"
    line = str(facts.get("mem.dumpsys_free") or "").strip()
    if not line:
        return f"{MEMINFO} printed no Free RAM line"
    return f"{MEMINFO}'s Free RAM line not understood: {line[:80]!r}"


def vm_stat_available(text: str) -> int | None:
    """macOS `vm_stat`: (free + inactive + speculative + purgeable) pages × its page size, in bytes."""
    if not text:
        return None
    m = re.search(r"page size of (\d+) bytes", text)
    page = int(m.group(1)) if m else 4096
    have = {}
    for k in ("free", "inactive", "speculative", "purgeable"):
        mm = re.search(rf"Pages {k}:\s*(\d+)", text)
        if mm:
            have[k] = int(mm.group(1))
    if "free" not in have:
        return None
    return sum(have.values()) * page


def is_phone(facts: dict) -> bool:
    return bool(facts.get("android.model")) or str(facts.get("os", "")).startswith("Android")


def from_facts(facts: dict, override: int | None = None, fraction: float = 0.75) -> Budget:
    """The device's budget for one app, with its source (pure: from the facts facts.sh printed)."""
    if override:
        return Budget(int(override), "lab file", f"ram_budget_bytes {gib(override)}")
    app = _int(facts, "mem.app_available_bytes")  # the OS's own answer for this app (iOS: os_proc_available_memory)
    if app:
        return Budget(app, "os_proc_available_memory", f"{gib(app)} this app may still use, at first contact")
    total = facts.get("mem_total_bytes") or (_int(facts, "mem.total_kB") or 0) * 1024 or None
    avail_kb = _int(facts, "mem.available_kB")
    if is_phone(facts):
        minfree = [int(x) for x in re.findall(r"\d+", str(facts.get("mem.lmk_minfree", "")))]
        lmk = minfree[0] * PAGE if minfree else 0
        less = f" − low-memory killer's foreground threshold {lmk / MiB:.0f} MiB" if lmk else ""
        free_kb = dumpsys_free_kb(str(facts.get("mem.dumpsys_free", "")))
        if free_kb:
            return Budget(
                max(0, free_kb * 1024 - lmk),
                MEMINFO,
                f"free RAM (free + cached) {gib(free_kb * 1024)} at idle{less}",
            )
        if avail_kb:
            return Budget(
                max(0, avail_kb * 1024 - lmk),
                "MemAvailable",
                f"{gib(avail_kb * 1024)} at idle{less} (fallback: {no_free_ram(facts)})",
            )
        if total:
            c = ram_class_gb(total)
            return Budget(
                phone_rule(c), "phone rule", f"a {c} GB phone (MemTotal {gib(total)}): 5/8 of {c} GB − 1.56 GiB"
            )
        return Budget(None, "unknown", "the phone reported no memory figures: set ram_budget_bytes in the lab file")
    vm = vm_stat_available(str(facts.get("mem.vm_stat", "")).replace(";", "\n"))
    if vm:
        return Budget(vm, "vm_stat", f"free + inactive + speculative + purgeable {gib(vm)} at idle")
    pct = _int(facts, "mem.free_percent")
    if pct is not None and total:
        return Budget(int(total * pct / 100), "memory_pressure", f"{pct} % of {gib(total)} free at idle")
    if avail_kb:
        return Budget(avail_kb * 1024, "MemAvailable", f"{gib(avail_kb * 1024)} at idle")
    if total:
        return Budget(
            int(total * fraction),
            "MemTotal × ram_fraction",
            f"{fraction:.0%} of {gib(total)} (the device reports no available memory)",
        )
    return Budget(None, "unknown", "the device reported no memory figures: set ram_budget_bytes in the lab file")


# ---------------------------------------------------------------- battery


def battery(facts: dict) -> tuple[float | None, str]:
    """Full-charge capacity in Wh and how it was reckoned: energy_full (µWh), else charge_full (µAh) × the
    voltage now (µV), else the Mac's AppleRawMaxCapacity (mAh) × Voltage (mV) — or, on an Intel Mac without
    AppleRaw* keys, its MaxCapacity, which is in mAh there (Apple silicon's MaxCapacity is a percent: 100)."""
    ef = _int(facts, "battery.energy_full")
    if ef:
        return ef / 1e6, f"energy_full {ef / 1e6:.2f} Wh"
    cf, uv = _int(facts, "battery.charge_full"), _int(facts, "battery.voltage_now")
    if cf and uv:
        if cf < 100_000:  # some vendors' drivers report mAh where the ABI says µAh
            cf *= 1000
        return cf / 1e6 * uv / 1e6, f"charge_full {cf / 1e3:.0f} mAh × {uv / 1e6:.2f} V (voltage now)"
    mah, mv = _int(facts, "battery.max_mah"), _int(facts, "battery.mv")
    if mah and mv:
        return mah / 1e3 * mv / 1e3, f"AppleRawMaxCapacity {mah} mAh × {mv / 1e3:.2f} V"
    mx = _int(facts, "battery.max_capacity")
    if mx and mx > 100 and mv:
        return mx / 1e3 * mv / 1e3, f"MaxCapacity {mx} mAh (an Intel Mac's) × {mv / 1e3:.2f} V"
    return None, "no battery capacity readable"
