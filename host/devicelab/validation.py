"""Turn pydantic/YAML errors into one line that names the file and the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from .errors import DevicelabError


def load_yaml(path: Path, what: str) -> dict:
    path = Path(path)
    if not path.exists():
        raise DevicelabError(f"{what} {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
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
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return DevicelabError(f"{path}: {loc or '(top level)'}: {msg}{more}")
