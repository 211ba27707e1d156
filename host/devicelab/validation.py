"""Turn pydantic/YAML errors into one line that names the file and the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from .errors import DevicelabError


def read_text(path: Path, what: str) -> str:
    """A text file the user gave: one line for a missing file, a folder, no permission, or bytes that are
    not UTF-8 (the line and byte where they stop being text)."""
    path = Path(path)
    if not path.exists():
        raise DevicelabError(f"{what} {path} does not exist")
    if path.is_dir():
        raise DevicelabError(f"{what} {path} is a folder; give the file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DevicelabError(f"{what} {path} cannot be read: {e.strerror or e}") from e
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DevicelabError(
            f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at line {line}); save the {what} as UTF-8"
        ) from e


def load_yaml(path: Path, what: str) -> dict:
    path = Path(path)
    text = read_text(path, what)
    if "\x00" in text:
        raise DevicelabError(f"{path}: a {what} is YAML text; this file holds binary data")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise DevicelabError(f"{path}: malformed YAML{where}: {problem}") from e
    if not isinstance(data, dict):
        raise DevicelabError(f"{path}: a {what} must be a YAML mapping (key: value), got {type(data).__name__}")
    return data


def one_line(path: Path, e: ValidationError) -> DevicelabError:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    ctx = err.get("ctx") or {}
    if err["type"] == "union_tag_invalid":  # an unknown payload kind or transport
        loc = f"{loc}.{ctx.get('discriminator', '').strip(chr(39))}".lstrip(".")
        msg = f"unknown {ctx.get('tag')!r}; available: {ctx.get('expected_tags')}"
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return DevicelabError(f"{path}: {loc or '(top level)'}: {msg}{more}")
