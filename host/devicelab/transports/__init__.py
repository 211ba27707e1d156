"""Transports: the only code that knows how a device is reached."""

from .base import CommandResult, Transport, quote_argv
from .local import LocalTransport

__all__ = ["CommandResult", "Transport", "LocalTransport", "quote_argv", "open_transport", "reached_through"]


def open_transport(device) -> Transport:
    """Make the transport a lab device entry asks for (see lab.Device)."""
    kind = device.transport
    if kind == "local":
        return LocalTransport(device.name, root=device.workdir)
    if kind == "ssh":
        from .ssh import SSHTransport  # imported lazily: paramiko only when needed

        return SSHTransport.from_device(device)
    if kind == "adb":
        from .adb import ADBTransport

        return ADBTransport.from_device(device)
    if kind == "ios":
        from .ios import IOSTransport  # an iPhone/iPad, chained through its Mac's ssh transport

        return IOSTransport.from_device(device)
    raise ValueError(f"unknown transport {kind!r}")


def reached_through(t: Transport, device) -> dict[str, tuple[bool, str]]:
    """`devices probe`'s lines for the devices reached through this one (a Mac's paired iPhones and iPads, each a
    lab entry ready to paste); empty where there are none."""
    if device.transport != "ssh":
        return {}
    from .ios import paired_lines

    return paired_lines(t, device.name)
