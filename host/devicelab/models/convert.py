"""Safetensors checkpoints (a local Hugging Face folder, or an hf: repo's snapshot) converted to a GGUF base with
the pinned source's own `convert_hf_to_gguf.py` and its `gguf-py` — the same commit as the builds, recorded —
cached by the checkpoint's content. Needs the `[convert]` extra (torch, transformers, sentencepiece).

A checkpoint the converter cannot take (an architecture, a tokenizer) is one line naming what it refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from .. import paths
from ..errors import DevicelabError
from ..hashing import sha256_file

OUTTYPES = ("bf16", "f16", "f32")
CONTENT = ("*.safetensors", "*.json", "tokenizer.model", "*.tiktoken", "*.txt")


def content_key(folder: Path) -> tuple[str, dict]:
    """The checkpoint's identity: sha256 over its weight, config and tokenizer files (name and content). A file
    in the huggingface_hub cache is a link to a blob named by its own sha256 (LFS) — no need to read it."""
    files = {}
    for pat in CONTENT:
        for f in sorted(folder.glob(pat)):
            if f.name.endswith(".sha256.json"):  # our own hash memo, not the checkpoint's
                continue
            blob = f.resolve()
            named = blob.name if f.is_symlink() and re.fullmatch(r"[0-9a-f]{64}", blob.name) else None
            files[f.name] = named or sha256_file(f)
    if not any(n.endswith(".safetensors") for n in files):
        raise DevicelabError(f"{folder} holds no .safetensors weights; give a Hugging Face checkpoint folder")
    h = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return h, files


def _refusal(text: str) -> str:
    """The converter's own reason, from its traceback: the last 'SomethingError: why' line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = re.match(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)):\s*(.+)$", ln)
        if m:
            return f"{m.group(1)}: {m.group(2)}"[:240]
    return (lines[-1] if lines else "no output")[:240]


def converter_env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "gguf-py"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("NO_LOCAL_GGUF", "")
    return env


def check_extra() -> None:
    missing = []
    for mod in ("torch", "transformers", "sentencepiece", "safetensors"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise DevicelabError(f"converting a checkpoint needs {', '.join(missing)}: pip install -e '.[convert]'")


def to_gguf(folder: Path, outtype: str = "bf16", provenance: dict | None = None, source=None, progress=None) -> Path:
    """The checkpoint as a GGUF base (cached: the same content converts once)."""
    from ..build import source as sourcemod

    folder = Path(folder)
    if outtype not in OUTTYPES:
        raise DevicelabError(f"unknown conversion type {outtype!r}; use one of {', '.join(OUTTYPES)}")
    key, files = content_key(folder)
    src = source or sourcemod.resolve()
    out_dir = paths.sub("models") / "converted" / key[:16]
    out = out_dir / f"{_name(folder)}-{outtype}.gguf"
    manifest = out.with_name(out.name + ".convert.json")
    for done in sorted(out_dir.glob(f"*-{outtype}.gguf.convert.json")):  # the same content, under any name
        if done.with_name(done.name[: -len(".convert.json")]).exists():
            return done.with_name(done.name[: -len(".convert.json")])
    check_extra()
    script = src.path / "convert_hf_to_gguf.py"
    if not script.exists():
        raise DevicelabError(f"the llama.cpp tree {src.path} has no convert_hf_to_gguf.py")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.temp_for(out)
    argv = [sys.executable, str(script), str(folder), "--outfile", str(tmp), "--outtype", outtype]
    log = out_dir / "convert.log"
    rc, text = _stream(argv, converter_env(src.path), log, progress, f"converting {_name(folder)} to {outtype}")
    if rc != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise DevicelabError(
            f"{folder.name}: the pinned convert_hf_to_gguf.py ({src.short}) cannot take this "
            f"checkpoint: {_refusal(text)}; full log: {log}"
        )
    tmp.replace(out)
    manifest.write_text(
        json.dumps(
            {
                "checkpoint": str(folder),
                "content_sha256": key,
                "files": files,
                "outtype": outtype,
                "converter": "convert_hf_to_gguf.py",
                "source_commit": src.commit,
                "converter_sha256": sha256_file(script),
                **({"hub": provenance} if provenance else {}),
            },
            indent=1,
        )
    )
    return out


_PCT = re.compile(r"(\d{1,3})%\|")


def _stream(argv: list[str], env: dict, log: Path, progress, what: str) -> tuple[int, str]:
    """Run the converter, its output to `log`; its tqdm bar ("Writing:  45%|…") to progress(what, pct)."""
    with open(log, "ab") as fh:
        fh.write(("\n$ " + " ".join(argv) + "\n").encode())
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        out = p.stdout
        assert out is not None, "stdout=PIPE"
        chunks = []
        buf = b""
        while True:
            b = out.read1(65536) if hasattr(out, "read1") else out.read(65536)
            if not b:
                break
            fh.write(b)
            chunks.append(b)
            buf = (buf + b)[-4096:]
            m = _PCT.findall(buf.decode(errors="replace").replace("\r", "\n").splitlines()[-1] if buf else "")
            if progress and m:
                progress(what, float(m[-1]))
        rc = p.wait()
    if progress:
        progress(what, 100.0)
    return rc, b"".join(chunks).decode(errors="replace")


def _name(folder: Path) -> str:
    """A readable file name: the checkpoint's folder, or its hub repo for a cache snapshot."""
    parts = folder.resolve().parts
    for p in parts:
        if p.startswith("models--"):
            return re.sub(r"[^\w.-]", "_", p[len("models--") :].split("--")[-1])
    return re.sub(r"[^\w.-]", "_", folder.name) or "model"


def lora_to_gguf(adapter: Path, base_checkpoint: Path, source=None) -> Path:
    """A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) as a GGUF LoRA, with the pinned
    source's convert_lora_to_gguf.py; the base checkpoint gives its config. Cached by the adapter's content."""
    from ..build import source as sourcemod

    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise DevicelabError(f"{adapter} is not a PEFT LoRA adapter (no adapter_config.json)")
    files = {f.name: sha256_file(f) for f in sorted(adapter.glob("adapter_*")) if f.is_file()}
    base_key, _ = content_key(base_checkpoint)
    key = hashlib.sha256(json.dumps([files, base_key], sort_keys=True).encode()).hexdigest()
    src = source or sourcemod.resolve()
    out = paths.sub("models") / "converted" / "lora" / f"{key[:16]}.gguf"
    if out.exists():
        return out
    check_extra()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.temp_for(out)
    log = out.parent / "convert.log"
    rc, text = _stream(
        [
            str(x)
            for x in (
                sys.executable,
                src.path / "convert_lora_to_gguf.py",
                "--base",
                base_checkpoint,
                "--outfile",
                tmp,
                "--outtype",
                "f32",
                adapter,
            )
        ],
        converter_env(src.path),
        log,
        None,
        "",
    )
    if rc != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise DevicelabError(
            f"{adapter.name}: the pinned convert_lora_to_gguf.py ({src.short}) cannot take this "
            f"adapter: {_refusal(text)}; full log: {log}"
        )
    tmp.replace(out)
    return out


def merge_lora(base: Path, lora: Path, export_tool: Path, threads: int | None = None) -> Path:
    """The base GGUF with the LoRA merged into its weights (llama-export-lora), so the ladder is of the
    fine-tuned model. Cached by base and adapter."""
    from ..proc import run_logged

    key = hashlib.sha256(f"{sha256_file(base)} {sha256_file(lora)}".encode()).hexdigest()
    out = paths.sub("models") / "converted" / "merged" / f"{Path(base).stem}-lora{key[:12]}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.temp_for(out)
    argv: list[str | Path] = [
        export_tool,
        "-m",
        base,
        "--lora",
        lora,
        "-o",
        tmp,
        *(["-t", str(threads)] if threads else []),
    ]
    run_logged(argv, out.parent / "export-lora.log", what=f"llama-export-lora {Path(base).name} + {Path(lora).name}")
    tmp.replace(out)
    return out
