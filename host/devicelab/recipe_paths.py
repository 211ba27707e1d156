"""Files a recipe names, found where a user means them: relative to the recipe's folder, or inside the
pinned llama.cpp source (`llama.cpp:RELATIVE/PATH`). A leaf: the kinds (when a recipe loads) and the host
work (when a run needs the file) both ask it."""

from __future__ import annotations

from pathlib import Path

from .errors import DevicelabError

SOURCE_PREFIX = "llama.cpp:"


def resolve_text(spec: str, src=None, base: Path | None = None, what: str = "perplexity text") -> Path:
    """A text file of a recipe: `src` is the resolved llama.cpp source (anything with a `.path`), needed only
    for `llama.cpp:` paths."""
    if spec.startswith(SOURCE_PREFIX):
        if src is None:
            raise DevicelabError(f"{what} {spec}: the llama.cpp source is not resolved yet")
        p = src.path / spec[len(SOURCE_PREFIX) :]
    else:
        p = Path(spec).expanduser()
        if not p.is_absolute() and base is not None and (base / p).exists():
            p = base / p  # relative paths in a recipe are relative to the recipe file
    if not p.is_file():
        raise DevicelabError(
            f"{what} {spec} not found; give a text file path (relative to the recipe) or '{SOURCE_PREFIX}RELATIVE/PATH'"
        )
    return p


def resolve_include(spec: str, recipe_dir: Path) -> Path:
    """An lm-eval task folder named in a recipe: relative paths are relative to the recipe's folder."""
    p = Path(spec).expanduser()
    return p if p.is_absolute() else Path(recipe_dir) / p
