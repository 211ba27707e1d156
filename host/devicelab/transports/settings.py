"""Each transport's own settings: the typed entry a lab file gives a device of that transport (pyinfra's
connectors each declare theirs). `transport:` picks the model; the fields all devices share are in
DeviceBase."""

from __future__ import annotations

import re
from typing import Literal

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
