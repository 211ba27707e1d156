"""Power captures of Linux sysfs, read as the lab reads a live device: the capture becomes the sysfs tree the device
had, the lab's own sampler (device_payloads/sampler.sh) reads it, and the host's parsers turn the trace into
figures: the battery (telemetry/sources/power_supply.py, and budget.battery over facts.sh's reading), hwmon rails
and energy counters (sources/hwmon.py), RAPL domains (sources/rapl.py).

The textual forms people publish, each turned into files only where it is one:
- a power_supply uevent (`POWER_SUPPLY_X=v`, several supplies one after another), `acc -i`'s copy of it without the
  prefix, or Android's BatteryService log line `uevent={POWER_SUPPLY_X=v, …}`: the files of /sys/class/power_supply/
  NAME/ (older kernels print no POWER_SUPPLY_TYPE in the uevent; its `type` file says Battery where the supply has a
  capacity or charge/energy figures, and that is what the reader writes);
- `grep . FILES` / `grep -r . DIR` output (`PATH:VALUE`);
- `$ cat PATH` followed by its value, and `$ cat DIR/{a,b,c}` followed by the values in that order;
- powercap-info's zone listing (`Zone 0` / `name: package-0` / `energy_uj: …`): /sys/class/powercap/intel-rapl:N.
A single capture is one moment: every sampler tick reads the same values, so counters do not move (energy over
time needs two captures); a power, a unit, a domain and its range are what one capture can show."""

from __future__ import annotations

import re
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from .. import budget
from ..telemetry.sources import hwmon, power_supply, rapl
from ..telemetry.sources.base import folder_meta
from ..telemetry.units import voltage_to_v
from . import Missing, Unsupported, _sysfs, reader

PS = "/sys/class/power_supply"
_PS_LINE = re.compile(r"(POWER_SUPPLY_[A-Z0-9_]+)=(.*)$")
_BARE_LINE = re.compile(r"^\s*([A-Z][A-Z0-9_]*)=(.*)$")
_LOGGED = re.compile(r"uevent=\{(.*)\}")
_CAT = re.compile(r"^\S*\$\s*cat\s+(\S+)\s*$")
_BATTERY_PROPS = ("capacity", "charge_full", "charge_now", "energy_full", "energy_now", "charge_counter")


# ---------------------------------------------------------------- capture text → {absolute path: value}
def _uevent_pairs(text: str) -> list[tuple[str, str]]:
    """(KEY, value) of a uevent in any of its published forms, KEY without the POWER_SUPPLY_ prefix."""
    logged = _LOGGED.search(text)
    if logged:  # Android's BatteryService: {K=v, K=v, …} (values here hold no ', ')
        items = [kv.partition("=") for kv in logged.group(1).split(", ")]
        return [(k[len("POWER_SUPPLY_") :], v) for k, _, v in items if k.startswith("POWER_SUPPLY_")]
    found = [m for m in map(_PS_LINE.search, text.splitlines()) if m]
    pairs = [(m.group(1)[len("POWER_SUPPLY_") :], m.group(2).rstrip()) for m in found]
    if pairs:
        return pairs
    # `acc -i` prints the battery's uevent with the prefix taken off
    return [(m.group(1), m.group(2).rstrip()) for m in map(_BARE_LINE.match, text.splitlines()) if m]


def uevent_supplies(text: str) -> dict[str, str]:
    """Files of each supply in a uevent capture (a new supply starts at each NAME)."""
    blocks: list[list[tuple[str, str]]] = []
    for k, v in _uevent_pairs(text):
        if k == "NAME" or not blocks:
            blocks.append([])
        blocks[-1].append((k, v))
    files: dict[str, str] = {}
    for i, block in enumerate(blocks):
        name = dict(block).get("NAME") or ("battery" if i == 0 else f"supply{i}")
        lines = "\n".join(f"POWER_SUPPLY_{k}={v}" for k, v in block)
        files.update(_sysfs.uevent_files(lines, f"{PS}/{name}"))
    return files


def _expand(path: str) -> list[str]:
    """A shell brace list in a path, expanded: DIR/{a,b} → DIR/a, DIR/b."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in product(*choices)]


def cat_files(text: str) -> dict[str, str]:
    """`$ cat PATH` then its value (one line), or `$ cat DIR/{a,b}` then one value per file in that order."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in text.splitlines():
        m = _CAT.match(line)
        if m:
            paths = _expand(m.group(1))  # a glob's files are not known, and a uevent is read as one
            pending = [p for p in paths if p.startswith(("/sys/", "/proc/")) and not re.search(r"[*?[]|/uevent$", p)]
            continue
        if pending and line.strip() and not line.lstrip().startswith("$"):
            out[pending.pop(0)] = line.strip()
        elif not line.strip():
            pending = []
    return out


def powercap_info_files(text: str) -> dict[str, str]:
    """powercap-info's listing: `intel-rapl` (absent with -p) / `Zone 0` / `name: package-0` … (constraints left
    out; a zone's energy_uj is absent where the user could not read it)."""
    out: dict[str, str] = {}
    ctype, zone, zone_indent = "intel-rapl", None, -1
    for line in text.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        s = line.strip()
        m = re.match(r"Zone (\d+(?::\d+)*)$", s)
        if m:
            zone, zone_indent = f"{ctype}:{m.group(1)}", indent
            continue
        if indent == 0 and ":" not in s:
            ctype, zone = s, None
            continue
        if zone and indent == zone_indent + 2 and ":" in s and not s.startswith("Constraint"):
            k, _, v = s.partition(":")
            out[f"/sys/class/powercap/{zone}/{k.strip()}"] = v.strip()
        elif zone and indent <= zone_indent:
            zone = None
    return out


def capture_files(text: str) -> dict[str, str]:
    """The sysfs files a capture shows, whatever its form."""
    files = _sysfs.grep_files(text)
    files.update(cat_files(text))
    if re.search(r"^\s*Zone \d", text, re.M) and "max_energy_range_uj:" in text:
        files.update(powercap_info_files(text))
    if not files:
        files = uevent_supplies(text)
    return files


def _battery_types(files: dict[str, str]) -> dict[str, str]:
    """A power_supply folder with battery figures but no `type` (older kernels' uevent has no TYPE; a cut grep):
    its type file reads Battery on the device."""
    folders = {p.rsplit("/", 1)[0] for p in files if p.startswith(PS + "/")}
    for d in folders:
        if f"{d}/type" not in files and any(f"{d}/{k}" in files for k in _BATTERY_PROPS):
            files[f"{d}/type"] = "Battery"
    return files


# ---------------------------------------------------------------- the lab's parsers over the tree
def _median(v) -> float:
    a = np.asarray(v, dtype=float)
    a = a[~np.isnan(a)]
    return float(np.median(a)) if len(a) else float("nan")


def _figures_battery(files: dict[str, str]) -> dict[str, Any]:
    tr = _sysfs.sample(files)
    bats = power_supply.batteries(tr)
    if not bats:
        raise Unsupported("no power_supply folder of type Battery in the capture")
    e = power_supply.battery_power(tr, None)
    got: dict[str, Any] = {"battery": bats[0]}
    if e is None:
        got["battery_power_w"] = Missing("the battery gives neither current_now and voltage_now nor power_now")
    else:
        info = e.info
        got["method"] = info.get("method", "power_now")
        got["battery_power_w"] = Missing(info["missing"]) if info.get("missing") else _median(e.values)
        got["current_unit"] = info.get("current_unit") or Missing(info.get("missing") or "power_now read, no current")
    vcol = f"{bats[0]}/voltage_now"
    v = _median(tr.frame[vcol].map(voltage_to_v)) if vcol in tr.frame else float("nan")
    got["battery_voltage_v"] = v if v > 0 else Missing("no voltage_now, or it reads 0")
    wh, how = budget.battery(
        {k: v for k, v in _sysfs.device_facts(files).items() if k.startswith("battery.")}  # the device's alone
    )
    got["battery_capacity_wh"] = wh if wh is not None else Missing(how)
    return got


@reader("power-supply")
def read_power_supply(path: Path) -> dict[str, Any]:
    """A battery's power_supply folder (uevent, grep, cat): its power, the unit of its current, voltage, capacity."""
    files = _battery_types(capture_files(path.read_text(errors="replace")))
    if not any(p.startswith(PS + "/") for p in files):
        raise Unsupported("no /sys/class/power_supply figures in the capture")
    return _figures_battery(files)


@reader("hwmon")
def read_hwmon(path: Path) -> dict[str, Any]:
    """hwmon power monitors (INA3221/INA2xx rails, power/energy inputs) and the older Jetsons' iio rails."""
    files = capture_files(path.read_text(errors="replace"))
    if not any("/hwmon" in p or "iio:device" in p for p in files):
        raise Unsupported("no hwmon or iio power-monitor files in the capture")
    tr = _sysfs.sample(files)
    rails = hwmon.power_rails(tr)
    got: dict[str, Any] = {"rail_labels": [lab or col for lab, col, _ in rails]}
    for lab, col, w in rails:
        got[f"rail_w:{lab or col}"] = _median(w)
    e = hwmon.rail_power(tr)
    if e is None:
        got["rail_power_w"] = Missing("no power, current×voltage or iio power rails")
    else:
        got["rail_power_w"] = _median(e.values)
        got["rail_method"] = e.info["method"]
    counters = tr.columns(hwmon.ENERGY_COLS)
    got["energy_counters"] = len(counters)
    gpu = hwmon.SOURCE.gpu(tr, None)
    got["gpu_power_w"] = gpu["gpu_power_mean"][0] if "gpu_power_mean" in gpu else Missing("no rail labelled GPU")
    return got


@reader("rapl")
def read_rapl(path: Path) -> dict[str, Any]:
    """RAPL powercap domains: the package domains the lab sums, their names, counters and wrap ranges."""
    files = capture_files(path.read_text(errors="replace"))
    if not any("/powercap/" in p for p in files):
        raise Unsupported("no /sys/class/powercap files in the capture")
    tr = _sysfs.sample(files)
    cols = rapl.package_columns(tr)
    if not cols:
        raise Unsupported("no readable RAPL package domain (intel-rapl:N/energy_uj) in the capture")
    metas = [folder_meta(tr, c) for c in cols]
    e = rapl.package_energy(tr)
    return {
        "rapl_domains": [m.get("name", "") for m in metas],
        "rapl_counter_j": [_median(tr.frame[c]) / 1e6 for c in cols],
        "rapl_max_range_j": [
            float(m["max_energy_range_uj"]) / 1e6 if m.get("max_energy_range_uj") else Missing("no max_energy_range_uj")
            for m in metas
        ],
        "rapl_energy_j": float(e.values[-1]) if e is not None else Missing("no RAPL energy"),
    }
