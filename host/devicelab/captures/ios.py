"""What `xcrun devicectl` printed for other people, through the lab's own parsers (transports/devicectl.py, the ones
the iOS transport runs on its Mac's output): the device list as JSON, a launched app's console, the JetsamEvent
reports iOS writes when it kills an app for memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..transports import devicectl
from . import Missing, Unsupported, reader


def _said(v: Any, what: str) -> Any:
    return v if v not in ("", None) else Missing(f"devicectl gives no {what} for this device")


@reader("devicectl-json")
def devicectl_devices(path: Path) -> dict[str, Any]:
    """`devicectl list devices --json-output FILE`: per device, in devicectl's order, udid, model (productType),
    marketing_name, os_version, pairing, developer_mode, ddi_services, transport, tunnel (the device's address in
    its CoreDevice tunnel, where that is up); phones: the udids devicelab would measure (iPhones and iPads)."""
    devs = devicectl.parse_devices(path.read_text(errors="replace"))
    if not devs:
        raise Unsupported("not `devicectl list devices --json-output` JSON (no result.devices[])")
    return {
        "devices": len(devs),
        "udid": [d.udid for d in devs],
        "model": [_said(d.product_type, "productType") for d in devs],
        "marketing_name": [_said(d.marketing_name, "marketingName") for d in devs],
        "device_type": [d.device_type for d in devs],
        "os_version": [_said(d.os_version, "osVersionNumber (not connected?)") for d in devs],
        "pairing": [d.pairing for d in devs],
        "developer_mode": [_said(d.developer_mode, "developerModeStatus") for d in devs],
        "ddi_services": [_said(d.ddi_services, "ddiServicesAvailable") for d in devs],
        "transport": [_said(d.transport, "transportType") for d in devs],
        "tunnel": [d.reachable_tunnel or Missing(f"tunnel {d.tunnel_state or 'not said'}") for d in devs],
        "storage_bytes": [_said(d.storage_bytes, "internalStorageCapacity") for d in devs],
        "phones": [d.udid for d in devicectl.phones(devs)],
    }


@reader("devicectl-console")
def devicectl_console(path: Path) -> dict[str, Any]:
    """What `devicectl device process launch --console` printed: app_lines (the app's own non-blank lines, as the
    iOS transport hands them to the tools' parsers), devicectl_lines (devicectl's own lines taken out), failure
    (the fix-table key its text means) and first_error (the line a failure the table does not know is told by)."""
    text = path.read_text(errors="replace")
    app = [ln for ln in devicectl.app_output(text).splitlines() if ln.strip()]
    return {
        "app_lines": app,
        "devicectl_lines": sum(1 for ln in text.splitlines() if ln.strip()) - len(app),
        "failure": devicectl.classify(text) or Missing("no failure devicectl's table knows"),
        "first_error": devicectl.first_error(text),
    }


@reader("ios-crash")
def jetsam_report(path: Path) -> dict[str, Any]:
    """A JetsamEvent .ips report: killed (the processes iOS killed, in the report's order), reasons, footprint_mb
    (each one's resident memory when killed, MB of 2^20 bytes, by the lab's jetsam_footprint_mb)."""
    text = path.read_text(errors="replace")
    kills = devicectl.jetsam_kills(text)
    if kills is None:
        raise Unsupported("not a whole JetsamEvent report (no JSON body with processes[])")
    names = [n for n, _, _ in kills]
    mbs = [devicectl.jetsam_footprint_mb(text, n) for n in names]
    return {
        "killed": names,
        "reasons": [r for _, r, _ in kills],
        "footprint_mb": [mb if mb is not None else Missing("the report states no page size") for mb in mbs],
    }
