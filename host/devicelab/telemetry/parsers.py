"""Parsers for the once-per-cell telemetry snapshots: Android `dumpsys battery` and
`dumpsys thermalservice`, macOS `ioreg -rn AppleSmartBattery`, `pmset -g batt` and `pmset -g therm`.

Each returns a dict of normalized values (SI units; current and power positive when the battery is
discharging — the schema's sign convention) plus the raw fields it read."""

from __future__ import annotations

import re

ANDROID_BATTERY_STATUS = {1: "unknown", 2: "charging", 3: "discharging", 4: "not-charging", 5: "full"}


def _kv_lines(text: str, sep: str = ":") -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, s, v = line.strip().partition(sep)
        if s and k:
            out[k.strip()] = v.strip()
    return out


def dumpsys_battery(text: str) -> dict:
    """Android BatteryService dump. voltage is mV, temperature deci-°C, Charge counter µAh."""
    kv = _kv_lines(text)
    num = lambda k: float(kv[k]) if k in kv and re.fullmatch(r"-?\d+(\.\d+)?", kv[k]) else None  # noqa: E731
    status = int(num("status")) if num("status") is not None else None
    plugged = any(kv.get(k) == "true" for k in ("AC powered", "USB powered", "Wireless powered", "Dock powered"))
    out = {
        "plugged": plugged,
        "updates_stopped": "UPDATES STOPPED" in text,    # after `dumpsys battery unplug`
        "status": ANDROID_BATTERY_STATUS.get(status, str(status)) if status is not None else None,
        "battery_level": (num("level") / num("scale")) if num("level") is not None and num("scale") else None,
        "battery_voltage": num("voltage") / 1e3 if num("voltage") is not None else None,
        "battery_temp": num("temperature") / 10 if num("temperature") is not None else None,
        "charge_counter_c": num("Charge counter") * 3.6e-3 if num("Charge counter") is not None else None,
        "technology": kv.get("technology"),
    }
    return out


_TEMP = re.compile(
    r"Temperature\{mValue=(?P<v>-?[\d.]+), mType=(?P<t>-?\d+), mName=(?P<n>[^,]+), mStatus=(?P<s>-?\d+)\}"
)


def dumpsys_thermalservice(text: str) -> dict:
    """Android ThermalManagerService dump: the overall thermal status (0 none … 6 shutdown) and the HAL's
    current temperatures (°C)."""
    m = re.search(r"Thermal Status:\s*(-?\d+)", text)
    cur = text.split("Current temperatures from HAL:", 1)
    section = cur[1].split("Current cooling devices", 1)[0] if len(cur) == 2 else text
    temps = [
        {"name": t["n"], "type": int(t["t"]), "value": float(t["v"]), "status": int(t["s"])}
        for t in _TEMP.finditer(section)
    ]
    return {
        "thermal_status": int(m.group(1)) if m else None,
        "temperatures": temps,
        "temp_max": max((t["value"] for t in temps), default=None),
    }


def _ioreg_int(v: str) -> int:
    n = int(v)
    return n - (1 << 64) if n >= (1 << 63) else n  # ioreg prints signed currents as unsigned 64-bit


def ioreg_battery(text: str) -> dict:
    """macOS `ioreg -rn AppleSmartBattery`: Voltage mV, InstantAmperage/Amperage mA (negative while
    discharging), Temperature centi-°C, capacities in % or mAh."""
    kv = {}
    for m in re.finditer(r'^\s*"(\w+)" = (.+)$', text, re.M):
        kv[m.group(1)] = m.group(2).strip()
    ints = {k: _ioreg_int(v) for k, v in kv.items() if re.fullmatch(r"\d+", v)}
    amp = ints.get("InstantAmperage", ints.get("Amperage"))
    volt = ints.get("Voltage")
    cur = -amp / 1e3 if amp is not None else None  # our convention: positive = discharging
    cap, mx = ints.get("CurrentCapacity"), ints.get("MaxCapacity")
    level = (
        (cap / mx) if cap is not None and mx and mx <= 100 else (cap / 100 if cap is not None and cap <= 100 else None)
    )
    return {
        "battery_voltage": volt / 1e3 if volt is not None else None,
        "battery_current": cur,
        "battery_power": (cur * volt / 1e3) if cur is not None and volt is not None else None,
        "battery_level": level,
        "battery_temp": ints["Temperature"] / 100 if "Temperature" in ints else None,
        "plugged": kv.get("ExternalConnected") == "Yes",
        "charging": kv.get("IsCharging") == "Yes",
        "raw_current_unit": "mA",
    }


def pmset_batt(text: str) -> dict:
    src = re.search(r"Now drawing from '([^']+)'", text)
    m = re.search(r"(\d+)%;\s*([^;]+);\s*([^\n]*)", text)
    return {
        "power_source": src.group(1) if src else None,
        "battery_level": int(m.group(1)) / 100 if m else None,
        "status": m.group(2).strip() if m else None,
        "remaining": m.group(3).split(" present")[0].strip() if m else None,
        "plugged": bool(src and "AC" in src.group(1)),
    }


def pmset_therm(text: str) -> dict:
    kv = _kv_lines(text, "=")
    limit = kv.get("CPU_Speed_Limit")
    warn = re.search(r"[Tt]hermal warning level (?:set to|is) (\d+)", text)
    return {
        "cpu_speed_limit": int(limit) / 100 if limit and limit.isdigit() else None,
        "cpu_available": int(kv["CPU_Available_CPUs"]) if kv.get("CPU_Available_CPUs", "").isdigit() else None,
        "thermal_warning_level": int(warn.group(1)) if warn else (0 if "No thermal warning" in text else None),
    }


def dumpsys_power(text: str) -> dict:
    """Android PowerManagerService dump: is the screen on? (mWakefulness=Awake / Display Power: state=ON)."""
    m = re.search(r"mWakefulness=(\w+)", text)
    d = re.search(r"Display Power: state=(\w+)", text)
    on = None
    if m:
        on = m.group(1) == "Awake"
    elif d:
        on = d.group(1) == "ON"
    return {"screen_on": float(on) if on is not None else None}


THERMAL_PRESSURE = {"nominal": 0, "light": 1, "moderate": 2, "heavy": 3, "trapping": 4, "sleeping": 4, "critical": 4}


def powermetrics(raw: bytes) -> list[dict]:
    """macOS `powermetrics -f plist -s cpu_power,gpu_power,thermal` (Apple silicon): one plist per sample,
    samples separated by NUL bytes. Per sample: its length (elapsed_ns), the SoC energy model's CPU, GPU
    and ANE energy over it (processor.cpu_energy / gpu_energy / ane_energy, mJ; the GPU's may sit in the
    gpu dict) or, without those, combined_power (mW) × length; thermal_pressure; each CPU cluster's
    clock (freq_hz). A sample cut off by the stop (the last, half-written) is skipped."""
    import plistlib

    out = []
    for chunk in raw.split(b"\0"):
        chunk = chunk.strip()
        if not chunk:
            continue
        try:
            d = plistlib.loads(chunk)
        except Exception:  # noqa: BLE001 - plistlib raises several types for a torn document
            continue
        proc, gpu = d.get("processor") or {}, d.get("gpu") or {}
        dt = d.get("elapsed_ns")
        if not isinstance(dt, (int, float)) or dt <= 0:
            continue
        dt = dt / 1e9
        parts = {
            k: proc.get(f"{k}_energy", gpu.get(f"{k}_energy") if k == "gpu" else None) for k in ("cpu", "gpu", "ane")
        }
        if any(isinstance(v, (int, float)) for v in parts.values()):
            energy = sum(float(v) for v in parts.values() if isinstance(v, (int, float))) / 1e3
            how = "energy"
        elif isinstance(proc.get("combined_power"), (int, float)):
            energy = float(proc["combined_power"]) / 1e3 * dt
            how = "combined_power"
        else:
            energy, how = None, None
        tp = d.get("thermal_pressure")
        out.append(
            {
                "elapsed_s": dt,
                "energy_j": energy,
                "energy_from": how,
                "cpu_j": parts["cpu"] / 1e3 if isinstance(parts["cpu"], (int, float)) else None,
                "gpu_j": parts["gpu"] / 1e3 if isinstance(parts["gpu"], (int, float)) else None,
                "ane_j": parts["ane"] / 1e3 if isinstance(parts["ane"], (int, float)) else None,
                "thermal_pressure": THERMAL_PRESSURE.get(str(tp).lower()) if tp is not None else None,
                "cluster_hz": {
                    c.get("name", str(i)): float(c["freq_hz"])
                    for i, c in enumerate(proc.get("clusters") or [])
                    if isinstance(c, dict) and isinstance(c.get("freq_hz"), (int, float))
                },
            }
        )
    return out


def nvidia_smi(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=timestamp,index,name,power.draw,… --format=csv,nounits -l…` → one dict per GPU
    and sample, SI units: t (epoch s), gpu (index), name, power_w, mem_bytes, busy (0–1), temp_c, sm_hz,
    throttle (the active reasons' bitmask). '[N/A]' and '[Not Supported]' are None."""
    import csv
    import datetime as dt
    rows = list(csv.reader(text.splitlines(), skipinitialspace=True))
    if not rows:
        return []
    head = [h.strip().split(" [")[0] for h in rows[0]]
    out = []
    for r in rows[1:]:
        if len(r) != len(head) or r[0] == head[0]:
            continue
        d = dict(zip(head, (x.strip() for x in r)))
        num = lambda k: (float(d[k]) if d.get(k) not in (None, "", "[N/A]", "[Not Supported]")  # noqa: E731
                         and _isnum(d[k]) else None)
        try:
            t = dt.datetime.strptime(d["timestamp"], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except (KeyError, ValueError):
            continue
        thr = d.get("clocks_throttle_reasons.active") or d.get("clocks_event_reasons.active")
        mem, sm = num("memory.used"), num("clocks.sm")
        busy = num("utilization.gpu")
        out.append({"t": t, "gpu": int(d.get("index") or 0), "name": d.get("name"), "power_w": num("power.draw"),
                    "mem_bytes": mem * 1024**2 if mem is not None else None,
                    "busy": busy / 100 if busy is not None else None, "temp_c": num("temperature.gpu"),
                    "sm_hz": sm * 1e6 if sm is not None else None,
                    "throttle": int(thr, 16) if thr and thr.startswith("0x") else None})
    return out


def _isnum(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False

