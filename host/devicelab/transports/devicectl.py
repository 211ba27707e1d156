"""`xcrun devicectl` (Xcode 15+, run on the Mac an iPhone or iPad is paired with), as pure data: the argument lists
of every devicectl command devicelab runs, the parse of `devicectl list devices --json-output FILE`, and the table
that turns each failure a user meets into one line naming the fix. Nothing here runs anything: transports/ios.py
runs these on the Mac through its SSH transport.

devicectl's device JSON (`list devices --json-output`, jsonVersion 2): result.devices[] with `identifier` (the
CoreDevice id), hardwareProperties {udid, marketingName, productType, hardwareModel, cpuType {name}, platform,
deviceType, internalStorageCapacity}, deviceProperties {name, osVersionNumber, osBuildUpdate, developerModeStatus,
ddiServicesAvailable}, connectionProperties {pairingState, tunnelState, tunnelIPAddress, transportType}."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

XCRUN = ("xcrun", "devicectl")
DOMAIN_APP = "appDataContainer"  # the app's data container (its home folder: Documents/, Library/, tmp/)
DOMAIN_CRASH = "systemCrashLogs"  # the device's crash and diagnostic reports (JetsamEvent-….ips among them)


# ---------------------------------------------------------------- command lines
def list_devices(json_out: str, timeout_s: int = 15) -> list[str]:
    return [*XCRUN, "list", "devices", "--json-output", json_out, "--timeout", str(timeout_s)]


def info_details(udid: str) -> list[str]:
    return [*XCRUN, "device", "info", "details", "--device", udid]


def install_app(udid: str, app: str) -> list[str]:
    return [*XCRUN, "device", "install", "app", "--device", udid, app]


def launch(udid: str, bundle_id: str, args: list[str], env: dict[str, str] | None = None) -> list[str]:
    """Launch the app with arguments, wait for it to exit and stream its stdout/stderr (`--console`, Xcode 16+);
    a copy already running is ended first (`--terminate-existing`)."""
    envs = ["--environment-variables", json.dumps(env, sort_keys=True)] if env else []
    return [
        *XCRUN,
        "device",
        "process",
        "launch",
        "--console",
        "--terminate-existing",
        *envs,
        "--device",
        udid,
        bundle_id,
        *map(str, args),
    ]


def terminate(udid: str, pid: str | int, kill: bool = False) -> list[str]:
    return [
        *XCRUN,
        "device",
        "process",
        "terminate",
        "--device",
        udid,
        "--pid",
        str(pid),
        *(["--kill"] if kill else []),
    ]


def _copy(direction: str, udid: str, domain: str, ident: str | None, source: str, dest: str) -> list[str]:
    who = ["--domain-identifier", ident] if ident else []
    return [
        *XCRUN,
        "device",
        "copy",
        direction,
        "--device",
        udid,
        "--domain-type",
        domain,
        *who,
        "--source",
        source,
        "--destination",
        dest,
    ]


def copy_to(udid: str, bundle_id: str, source: str, dest: str) -> list[str]:
    """A Mac file into the app's data container (dest: relative to the container's root)."""
    return _copy("to", udid, DOMAIN_APP, bundle_id, source, dest)


def copy_from(udid: str, bundle_id: str, source: str, dest: str) -> list[str]:
    """A file of the app's data container (source: relative to its root) onto the Mac."""
    return _copy("from", udid, DOMAIN_APP, bundle_id, source, dest)


# a shell script for the Mac: NAMES of one container folder into a Mac folder, one `devicectl device copy from`
# each (a missing one is skipped); positional: DST SRC UDID BUNDLE_ID NAMES…
COPY_FROM_EACH = (
    'dst=$1; src=$2; u=$3; b=$4; shift 4; mkdir -p "$dst"; for f in "$@"; do '
    f'{" ".join(XCRUN)} device copy from --device "$u" --domain-type {DOMAIN_APP} --domain-identifier "$b" '
    '--source "$src/$f" --destination "$dst/$f" >/dev/null 2>&1; done; true'
)


def crash_files(udid: str, json_out: str) -> list[str]:
    return [
        *XCRUN,
        "device",
        "info",
        "files",
        "--device",
        udid,
        "--domain-type",
        DOMAIN_CRASH,
        "--json-output",
        json_out,
    ]


def copy_crash(udid: str, name: str, dest: str) -> list[str]:
    return _copy("from", udid, DOMAIN_CRASH, None, name, dest)


# ---------------------------------------------------------------- the device JSON
@dataclass(frozen=True)
class AppleDevice:
    identifier: str
    udid: str
    name: str
    marketing_name: str
    product_type: str
    hardware_model: str
    chip: str
    platform: str
    device_type: str
    os_version: str
    os_build: str
    developer_mode: str  # enabled | disabled | '' (not said)
    ddi_services: bool | None
    pairing: str  # paired | unpaired | …
    tunnel_state: str  # connected | disconnected | unavailable
    tunnel_ip: str
    transport: str  # wired | localNetwork
    storage_bytes: int | None
    memory_bytes: int | None  # where devicectl gives it (not in every Xcode's JSON)

    @property
    def reachable_tunnel(self) -> str | None:
        """The device's address in its CoreDevice tunnel, when the tunnel is up."""
        return self.tunnel_ip if self.tunnel_ip and self.tunnel_state == "connected" else None

    def facts(self) -> dict[str, str]:
        """key=value facts devicelab keeps (the harness's own beside them)."""
        f = {
            "ios.model": self.product_type,
            "ios.marketing_name": self.marketing_name,
            "ios.chip": self.chip,
            "ios.hardware_model": self.hardware_model,
            "ios.version": self.os_version,
            "ios.build": self.os_build,
            "ios.device_type": self.device_type,
            "ios.name": self.name,
            "ios.transport": self.transport,
            "os": f"{self.platform or 'iOS'} {self.os_version}".strip(),
        }
        if self.storage_bytes:
            f["ios.storage_bytes"] = str(self.storage_bytes)
        if self.memory_bytes:
            f["mem.total_kB"] = str(self.memory_bytes // 1024)
        return {k: v for k, v in f.items() if v}


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def parse_devices(text: str) -> list[AppleDevice]:
    """`devicectl list devices --json-output` → the devices (phones, pads, watches; paired or not)."""
    try:
        data = json.loads(text or "{}")
    except json.JSONDecodeError:
        return []
    out = []
    for d in (data.get("result") or {}).get("devices") or []:
        hw, dp, cp = (
            d.get("hardwareProperties") or {},
            d.get("deviceProperties") or {},
            d.get("connectionProperties") or {},
        )
        out.append(
            AppleDevice(
                identifier=str(d.get("identifier", "")),
                udid=str(hw.get("udid", "")),
                name=str(dp.get("name", "")),
                marketing_name=str(hw.get("marketingName", "")),
                product_type=str(hw.get("productType", "")),
                hardware_model=str(hw.get("hardwareModel", "")),
                chip=str((hw.get("cpuType") or {}).get("name", "")),
                platform=str(hw.get("platform", "")),
                device_type=str(hw.get("deviceType", "")),
                os_version=str(dp.get("osVersionNumber", "")),
                os_build=str(dp.get("osBuildUpdate", "")),
                developer_mode=str(dp.get("developerModeStatus", "")),
                ddi_services=dp.get("ddiServicesAvailable"),
                pairing=str(cp.get("pairingState", "")),
                tunnel_state=str(cp.get("tunnelState", "")),
                tunnel_ip=str(cp.get("tunnelIPAddress", "")),
                transport=str(cp.get("transportType", "")),
                storage_bytes=_int(hw.get("internalStorageCapacity")),
                memory_bytes=_int(hw.get("physicalMemory") or hw.get("memorySize")),
            )
        )
    return out


def find(devices: list[AppleDevice], udid: str) -> AppleDevice | None:
    return next((d for d in devices if udid in (d.udid, d.identifier)), None)


def phones(devices: list[AppleDevice]) -> list[AppleDevice]:
    """The iPhones and iPads (devicelab measures those; watches and TVs are listed by devicectl too)."""
    return [d for d in devices if d.device_type in ("iPhone", "iPad") or d.platform in ("iOS", "iPadOS")]


def lab_entry(d: AppleDevice, mac: str) -> str:
    """A device as a lab-file entry, ready to paste (team_id and bundle_id are the user's)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", d.name or d.marketing_name or d.udid).strip("-") or "iphone"
    return (
        f"- {{name: {name}, transport: ios, mac: {mac}, udid: {d.udid or d.identifier}, "
        "team_id: YOUR_TEAM_ID, bundle_id: org.example.devicelab}"
    )


def state_problem(d: AppleDevice | None, udid: str, where: str) -> str | None:
    """Why this device cannot be used from its JSON alone, as one line (None: it looks usable)."""
    if d is None:
        return (
            f"no device with udid {udid} is known to {where}: connect it by USB, unlock it and tap Trust, then see "
            f"`devicelab devices probe` for the paired ones"
        )
    if d.pairing and d.pairing != "paired":
        return FIXES["not paired"].format(what=d.name or udid, where=where)
    if d.developer_mode == "disabled":
        return FIXES["developer mode"].format(what=d.name or udid, where=where)
    return None


# ---------------------------------------------------------------- failures, one line each
FIXES = {
    "xcode too old": (
        "{where} has no `xcrun devicectl` (it needs Xcode 15 or later, and Xcode 16+ for `process launch --console`): "
        "install the current Xcode there and run `sudo xcode-select -s /Applications/Xcode.app`"
    ),
    "console unsupported": (
        "{where}'s devicectl cannot wait for an app and capture its output (`process launch --console` came with "
        "Xcode 16): update Xcode there"
    ),
    "locked": "{what} is locked: unlock it (and keep it unlocked, e.g. Auto-Lock: Never) while devicelab measures",
    "not paired": (
        "{what} is not paired with {where}: connect it by USB, unlock it, tap Trust on the phone, and open Xcode's "
        "Devices and Simulators window once"
    ),
    "developer mode": (
        "Developer Mode is off on {what}: turn it on in Settings > Privacy & Security > Developer Mode, restart the "
        "phone and confirm"
    ),
    "untrusted profile": (
        "{what} does not trust the developer profile of the devicelab app: on the phone open Settings > General > "
        "VPN & Device Management, tap your developer app certificate and Trust it, then run again"
    ),
    "no team": (
        "signing the devicelab app on {where} failed: no account for team {team} in Xcode: add your Apple ID in "
        "Xcode > Settings > Accounts, and check team_id in the lab file (Membership details on developer.apple.com)"
    ),
    "no profile": (
        "signing the devicelab app on {where} failed: no provisioning profile for {bundle}: choose a bundle_id your "
        "team may use (a reverse-DNS name of yours), and open Xcode's Accounts once so it can make the profile"
    ),
    "not installed": (
        "the devicelab app is not installed on {what}: `devicelab run` builds and installs it (run a recipe on this "
        "device), or it was deleted: run again"
    ),
    "not found": (
        "{what} is not connected to {where}: plug it in (or bring it onto the Mac's network), unlock it, and check "
        "`xcrun devicectl list devices` on the Mac"
    ),
}

# (a pattern in devicectl's or xcodebuild's own text, the FIXES key it means), first match wins
PATTERNS: tuple[tuple[str, str], ...] = (
    (r'unable to find utility "devicectl"', "xcode too old"),
    (r"Unknown option '--console'|unrecognized option .--console", "console unsupported"),
    (r"BSErrorCodeDescription\s*=\s*Locked|device (?:was not, or could not be, unlocked|is locked)", "locked"),
    (r"[Dd]eveloper [Mm]ode (?:is )?(?:disabled|not enabled|off)", "developer mode"),
    (
        r"not been explicitly trusted by the user|BSErrorCodeDescription\s*=\s*Security|invalid code signature",
        "untrusted profile",
    ),
    (r"(?:device|it) is not paired|pairing (?:is )?required|pairingState.*unpaired", "not paired"),
    (r'No Account for Team|requires a development team|No signing certificate "iOS Development"', "no team"),
    (r"No profiles for '[^']*' were found|provisioning profile", "no profile"),
    (
        # OSStatus -10814 is LaunchServices' kLSApplicationNotFoundErr: no app with that bundle identifier
        r"is not installed|returned nil for|FBSOpenApplicationErrorDomain error 4|No application .* installed"
        r"|OSStatus error -10814|NSOSStatusErrorDomain error -10814",
        "not installed",
    ),
    (r"specified device was not found|No devices? (?:matched|found)|device is not connected", "not found"),
)


def classify(text: str) -> str | None:
    """The FIXES key devicectl's (or xcodebuild's) output means, or None when it is none of them."""
    for pat, key in PATTERNS:
        if re.search(pat, text or ""):
            return key
    return None


def explain(text: str, what: str, where: str, team: str = "", bundle: str = "") -> str | None:
    """One line naming the fix for devicectl's (or xcodebuild's) output, or None when it is none devicelab knows."""
    key = classify(text)
    return FIXES[key].format(what=what, where=where, team=team, bundle=bundle) if key else None


def first_error(text: str) -> str:
    """The first line of devicectl's output that says what went wrong (for a failure the table does not know)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    hit = next((ln for ln in lines if re.search(r"error|ERROR|failed|Failed", ln)), None)
    return (hit or (lines[-1] if lines else "no output"))[:240]


# ---------------------------------------------------------------- the console of a launched app
# devicectl's own lines around an app's output: its progress, each with a time stamp (the CoreDevice tunnel being
# acquired, established and its endpoint resolved, DDI services enabled, the usage assertion acquired or granted),
# and the launch and wait notes. Seen in real output: "10:04:12  Acquired tunnel connection to device.",
# "07:49:04  Establishing a tunnel connection to the device.", "07:49:05  Resolved tunnel endpoint.",
# "07:49:03  Enabling developer mode throttling override." (tests/fixtures/real/devicectl-console/)
_OWN = re.compile(
    r"^(?:\d\d:\d\d:\d\d\s+(?:Acquired|Enabling|Establishing|Resolved|Granted|Waiting|Launched|Warning)\b.*"
    r"|Launched application with .* bundle identifier\.?"
    r"|Waiting for the application to terminate.*"
    r"|App terminated due to (?:signal|exit).*"
    r"|Press Ctrl-C to (?:stop|exit).*)$"
)


def app_output(text: str) -> str:
    """A launched app's console output without devicectl's own lines."""
    return "".join(ln for ln in (text or "").splitlines(keepends=True) if not _OWN.match(ln.rstrip("\r\n")))


# ---------------------------------------------------------------- jetsam reports
def jetsam_names(listing_json: str) -> list[str]:
    """The JetsamEvent report names in `device info files --domain-type systemCrashLogs --json-output` (newest
    last: their names carry the time)."""
    return sorted(set(re.findall(r"JetsamEvent-[A-Za-z0-9_.:+-]*?\.ips", listing_json or "")))


def _jetsam_body(report: str) -> dict | None:
    """The JSON body of a JetsamEvent .ips report (a one-line JSON header, then the body), or None."""
    text = (report or "").strip()
    for candidate in (text.split("\n", 1)[1] if "\n" in text else "", text):
        try:
            body = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(body, dict) and isinstance(body.get("processes"), list):
            return body
    return None


def jetsam_kills(report: str) -> list[tuple[str, str, float | None]] | None:
    """The processes a JetsamEvent .ips report says iOS killed: (name, reason, resident MB = rpages × the page size
    the report states, in memoryStatus.pageSize: 16 KiB on A9 and later, 4 KiB on older SoCs); None when the text is
    not a whole report (an excerpt, another bug_type)."""
    body = _jetsam_body(report)
    if body is None:
        return None
    page = _int((body.get("memoryStatus") or {}).get("pageSize")) or _int(body.get("pageSize"))
    out = []
    for p in body["processes"]:
        if isinstance(p, dict) and p.get("reason"):
            rpages = _int(p.get("rpages"))
            mb = rpages * page / 2**20 if rpages is not None and page else None
            out.append((str(p.get("name", "")), str(p["reason"]), mb))
    return out


def jetsam_footprint_mb(report: str, process: str) -> float | None:
    """How much memory `process` held when iOS killed it, in MB (2^20 bytes), from a JetsamEvent .ips report (a JSON
    header line, then the JSON body: processes[] with name, rpages and reason; memoryStatus.pageSize)."""
    return next((mb for name, _, mb in jetsam_kills(report) or [] if name == process), None)
