"""Raw captures of what a device printed, read through the lab's own parsers.

Two users: the corpus of real captures published by other people (tests/fixtures/real/<format>/, each with its
SOURCE note and the values a person reads off it), and `devicelab doctor --bundle`, whose raw captures of the
user's own device become new corpus entries. A format is one reader: a function from the capture file to the
figures the lab takes from it, flat {name: value}. A figure the device marks unsupported is `Missing(reason)`,
never a measured zero; a capture the lab cannot use raises `Unsupported(why)` — one line, never a partial row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import DevicelabError

Reader = Callable[[Path], dict[str, Any]]


@dataclass(frozen=True)
class Missing:
    """A figure the capture does not give, and why (the device marks it unsupported, the field is absent …)."""

    reason: str

    def __str__(self) -> str:
        return f"missing: {self.reason}"


class Unsupported(DevicelabError):
    """The lab cannot use this capture: the message says why, in one line."""


class UnknownFormat(DevicelabError):
    pass


READERS: dict[str, Reader] = {}


def reader(*names: str) -> Callable[[Reader], Reader]:
    """Register a reader under one or more format names (the corpus folder names)."""

    def put(fn: Reader) -> Reader:
        for n in names:
            if n in READERS:
                raise ValueError(f"two readers for capture format {n!r}")
            READERS[n] = fn
        return fn

    return put


def formats() -> list[str]:
    _load()
    return sorted(READERS)


def read(fmt: str, path: Path) -> dict[str, Any]:
    """The figures the lab takes from one capture of format `fmt`."""
    _load()
    fn = READERS.get(fmt)
    if fn is None:
        raise UnknownFormat(f"unknown capture format {fmt!r}; available: {', '.join(sorted(READERS))}")
    return fn(Path(path))


_LOADED = False


def _load() -> None:
    """Import every reader module once (each registers its formats)."""
    global _LOADED
    if _LOADED:
        return
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")
    _LOADED = True
