"""Each transport's own settings: the typed entry a lab file gives a device of that transport (pyinfra's
connectors each declare theirs). `transport:` picks the model; the fields all devices share are in
DeviceBase."""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..build.backends import Backend


class DeviceBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    workdir: str | None = None  # device folder devicelab owns
    ram_budget_bytes: int | None = Field(default=None, gt=0)
    telemetry_root: str = "/"  # prefix for sysfs reads (fixture trees in tests)
    target: Literal["local", "aarch64", "android"] | None = None  # override the target chosen from facts
    cpu_features: str | None = None  # override /proc/cpuinfo Features for the ARM arch flags
    exec_prefix: list[str] = []  # run payload binaries through this (e.g. qemu-aarch64-static)
    host_cpus: bool | None = None  # its payloads run on this host's CPUs (default: the transport's)
    governor: str | None = Field(default=None, pattern=r"^[a-z_]+$")  # pin cpufreq (rooted), e.g. performance
    # the GPU backends this device may be measured on (a recipe's other backends are skipped here), and
    # environment variables for its payloads (GGML_VK_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, …)
    backends: list[Backend] | None = None
    env: dict[str, str] = {}
    # the lab host it is plugged into (its `devicelab worker --host NAME`); unset: the head, where `devicelab run`
    # runs. Only a run across a cluster (`--cluster`) places it there; a single-host run drives every device here
    lab_host: str | None = Field(default=None, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")

    def resolve(self, devices: dict[str, DeviceBase]) -> Self:
        """This entry once the whole lab file is read: a transport chained through another device's (an iPhone
        through its Mac) takes that device's settings here. The default: nothing to resolve."""
        return self

    @field_validator("name", "lab_host")
    @classmethod
    def _safe_name(cls, v: str | None) -> str | None:
        """A device's name names folders (its work folder, its lock, a node's staging) and a Ray resource: one safe
        path component."""
        if v is not None and (not re.fullmatch(r"[A-Za-z0-9_.-]+", v) or v in (".", "..")):
            raise ValueError(
                f"{v!r} is not a name devicelab can use: letters, digits, '_', '.' and '-' only (and not '.' or '..')"
            )
        return v


class LocalSettings(DeviceBase):
    """This workstation."""

    transport: Literal["local"] = "local"


class SSHSettings(DeviceBase):
    """A Linux board or a Mac over SSH (paramiko; ~/.ssh/config, agent and ProxyJump honoured)."""

    transport: Literal["ssh"]
    host: str = Field(min_length=1)  # an address or a Host alias from ~/.ssh/config
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None
    cross_build: bool = True  # build here (True) or natively on the board (False)


class ADBSettings(DeviceBase):
    """An Android phone through the adb server: a USB serial, or host:port for Wi-Fi adb."""

    transport: Literal["adb"]
    serial: str | None = None
    adb_host: str = "127.0.0.1"
    adb_port: int = Field(default=5037, ge=1, le=65535)


class IOSSettings(DeviceBase):
    """An iPhone or iPad paired with a Mac (Xcode 15+, Developer Mode on), reached through that Mac's SSH entry with
    `xcrun devicectl`; the devicelab app is built and signed on the Mac with the user's team."""

    transport: Literal["ios"]
    mac: str = Field(min_length=1)  # the name of the lab's `ssh` entry for the Mac the device is paired with
    udid: str = Field(pattern=r"^[A-Fa-f0-9-]{8,64}$")  # `xcrun devicectl list devices` (or `devices probe MAC`)
    team_id: str = Field(pattern=r"^[A-Z0-9]{10}$")  # the Apple developer team that signs the app
    bundle_id: str  # the app's bundle identifier, reverse-DNS under a prefix the team may use
    xcode: str | None = None  # DEVELOPER_DIR of the Xcode to build with (default: the Mac's selected one)
    min_os: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+){0,2}$")  # deployment target override
    # the Mac's entry, taken from the lab file by `mac` (filled in when the lab is read; not written by hand)
    mac_ssh: SSHSettings | None = None

    @field_validator("bundle_id")
    @classmethod
    def _reverse_dns(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*(\.[A-Za-z0-9-]+)+", v):
            raise ValueError(f"{v!r} is not a bundle id: a reverse-DNS name such as org.example.devicelab")
        return v

    def resolve(self, devices: dict[str, DeviceBase]) -> Self:
        mac = devices.get(self.mac)
        if mac is None and self.mac_ssh is not None and self.mac_ssh.name == self.mac:
            return self  # already resolved (an entry sent to a cluster node)
        if not isinstance(mac, SSHSettings):
            known = ", ".join(n for n, d in devices.items() if isinstance(d, SSHSettings)) or "none"
            raise ValueError(
                f"{self.name}: mac {self.mac!r} is not an ssh entry of this lab file (ssh entries: {known}); add the "
                "Mac under devices: with transport: ssh"
            )
        return self.model_copy(update={"mac_ssh": mac})
