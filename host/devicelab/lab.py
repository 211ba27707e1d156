"""The lab file: which devices exist, how to reach them, and their budgets."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Annotated, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from .errors import DevicelabError
from .transports.settings import ADBSettings, IOSSettings, LocalSettings, SSHSettings
from .validation import load_yaml, one_line

LAB_HOST_ENV = "DEVICELAB_LAB_HOST"  # a Ray node's lab-host name, inherited by the lanes it runs


def this_host() -> str:
    """The lab host this process drives devices from: its node's `--host` in a cluster, else the machine's name."""
    return os.environ.get(LAB_HOST_ENV) or platform.node()


# one settings model per transport (transports/settings.py), picked by `transport:` (default local)
Device = Annotated[Union[LocalSettings, SSHSettings, ADBSettings, IOSSettings], Field(discriminator="transport")]
# a device entry without `transport:` is this workstation (its name is the local transport's own default)
DEFAULT_TRANSPORT = LocalSettings.model_fields["transport"].default


def device_from(entry: dict) -> Device:
    """One lab-file device entry, validated by its transport's settings model."""
    return TypeAdapter(Device).validate_python({"transport": DEFAULT_TRANSPORT, **entry})


def _this_workstation() -> list[Device]:
    """The devices of a lab without a lab file: this workstation alone."""
    return [LocalSettings(name="local")]


class Lab(BaseModel):
    model_config = ConfigDict(extra="forbid")
    devices: list[Device] = Field(default_factory=_this_workstation)
    cluster: str | None = Field(default=None, pattern=r"^[^\s:]+:[0-9]{1,5}$")  # the Ray head, HOST:PORT

    @field_validator("devices", mode="before")
    @classmethod
    def _local_by_default(cls, v):
        if isinstance(v, list):
            return [{"transport": DEFAULT_TRANSPORT, **d} if isinstance(d, dict) else d for d in v]
        return v

    @model_validator(mode="after")
    def _resolve(self):
        """Entries chained through another (an iPhone through its Mac) take that entry's settings."""
        by_name = {d.name: d for d in self.devices}
        self.devices = [d.resolve(by_name) for d in self.devices]
        return self

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        if name == "local":
            return LocalSettings(name="local")
        known = ", ".join(d.name for d in self.devices) or "none"
        raise DevicelabError(f"device {name!r} is not in the lab file (known: {known}); add it under devices:")

    def hosted_by(self, host: str | None) -> list[Device]:
        """The devices plugged into one lab host (None: the head)."""
        return [d for d in self.devices if d.lab_host == host]


def load(path: Path | None) -> Lab:
    if path is None:
        return Lab()
    data = load_yaml(path, "lab file")
    try:
        return Lab.model_validate(data)
    except ValidationError as e:
        raise one_line(path, e) from e
