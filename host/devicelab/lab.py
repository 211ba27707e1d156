"""The lab file: which devices exist, how to reach them, and their budgets."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import DevicelabError
from .validation import load_yaml, one_line


class Device(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    transport: Literal["local", "ssh", "adb"] = "local"
    # ssh
    host: str | None = None
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None
    # adb
    serial: str | None = None
    adb_host: str = "127.0.0.1"
    adb_port: int = 5037
    # common
    workdir: str | None = None                   # device folder devicelab owns
    ram_budget_bytes: int | None = Field(default=None, gt=0)
    telemetry_root: str = "/"                    # prefix for sysfs reads (fixture trees in tests)
    cross_build: bool = True                     # ssh boards: build here (True) or on the board (False)
    target: Literal["local", "aarch64", "android"] | None = None   # override the target chosen from facts
    cpu_features: str | None = None              # override /proc/cpuinfo Features for the ARM arch flags
    exec_prefix: list[str] = []                  # run payload binaries through this (e.g. qemu-aarch64-static)
    host_cpus: bool | None = None                # its payloads run on this host's CPUs (default: local transport)
    governor: str | None = Field(default=None, pattern=r"^[a-z_]+$")   # pin cpufreq (rooted), e.g. performance

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        if any(ord(c) < 32 for c in v):
            raise ValueError("device name has control characters")
        return v


class Lab(BaseModel):
    model_config = ConfigDict(extra="forbid")
    devices: list[Device] = Field(default_factory=lambda: [Device(name="local")])

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        if name == "local":
            return Device(name="local")
        known = ", ".join(d.name for d in self.devices) or "none"
        raise DevicelabError(f"device {name!r} is not in the lab file (known: {known}); add it under devices:")


def load(path: Path | None) -> Lab:
    if path is None:
        return Lab()
    data = load_yaml(path, "lab file")
    try:
        return Lab.model_validate(data)
    except ValidationError as e:
        raise one_line(path, e) from e
