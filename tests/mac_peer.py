"""The stand-in Mac and iPhone (see test_ios.py): a real sshd whose sessions find tests/mac_standin/'s xcrun, cmake
and xcodebuild first on PATH; the "iPhone" is a folder the stand-in devicectl installs into and launches from."""

from __future__ import annotations

import json
from pathlib import Path

from sshd_peer import Sshd

STANDIN = Path(__file__).resolve().parent / "mac_standin"
UDID = "00008130-001A2B3C4D5E6F70"
BUNDLE = "org.example.devicelab"
TEAM = "ABCDE12345"
TUNNEL = "127.0.0.2"  # the phone's CoreDevice tunnel address, as the Mac sees it (a loopback alias here)


class Mac:
    """The stand-in Mac: a real sshd whose sessions find the stand-in xcrun/cmake/xcodebuild first on PATH."""

    def __init__(self, d: Path, harness: Path):
        self.state = d / "standin"
        self.state.mkdir(parents=True)
        (self.state / "config.json").write_text(
            json.dumps({"udid": UDID, "harness": str(harness), "tunnel_ip": TUNNEL, "app_available_bytes": 3 << 30})
        )
        self.sshd = Sshd(d / "sshd")
        self.sshd.config.write_text(
            self.sshd.config.read_text()
            + f"SetEnv PATH={STANDIN}:/usr/local/bin:/usr/bin:/bin DEVICELAB_STANDIN={self.state}\n"
        )
        self.sshd.start()
        self.phone = self.state / "iphone"

    def mode(self, m: str) -> None:
        (self.state / "mode").write_text(m)

    def calls(self) -> list[list[str]]:
        f = self.state / "calls.log"
        return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []

    def lab(self, path: Path, team: str = TEAM, mac_port: int | None = None) -> Path:
        s = self.sshd
        path.write_text(
            "devices:\n"
            f"  - {{name: mac, transport: ssh, host: {s.host}, port: {mac_port or s.port}, user: root,"
            f" key_file: {s.client_key}, known_hosts: {s.known_hosts}, workdir: {s.d}/mac-workdir}}\n"
            f"  - {{name: iphone, transport: ios, mac: mac, udid: {UDID}, team_id: {team}, bundle_id: {BUNDLE}}}\n"
        )
        return path

    def stop(self):
        self.sshd.kill()
