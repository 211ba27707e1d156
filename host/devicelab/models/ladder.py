"""The quant ladder: an F16 base and its quantizations, made with llama-quantize and cached by the
base's sha256. Each file gets a manifest (bytes, sha256, bits per weight, the real tensor type mix)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import paths
from ..errors import DevicelabError
from ..hashing import sha256_file
from ..proc import run_logged
from . import gguf_info

# recipe name -> llama-quantize type name
QUANT_TYPES = {
    "f32": "F32",
    "f16": "F16",
    "bf16": "BF16",
    "q8_0": "Q8_0",
    "q6_k": "Q6_K",
    "q5_k_m": "Q5_K_M",
    "q5_k_s": "Q5_K_S",
    "q5_1": "Q5_1",
    "q5_0": "Q5_0",
    "q4_k_m": "Q4_K_M",
    "q4_k_s": "Q4_K_S",
    "q4_1": "Q4_1",
    "q4_0": "Q4_0",
    "iq4_nl": "IQ4_NL",
    "iq4_xs": "IQ4_XS",
    "q3_k_l": "Q3_K_L",
    "q3_k_m": "Q3_K_M",
    "q3_k_s": "Q3_K_S",
    "q2_k": "Q2_K",
    # i-quants: made with an importance matrix (a recipe model's `imatrix:`)
    "iq3_m": "IQ3_M",
    "iq3_s": "IQ3_S",
    "iq3_xs": "IQ3_XS",
    "iq3_xxs": "IQ3_XXS",
    "iq2_m": "IQ2_M",
    "iq2_s": "IQ2_S",
    "iq2_xs": "IQ2_XS",
    "iq2_xxs": "IQ2_XXS",
    "iq1_m": "IQ1_M",
    "iq1_s": "IQ1_S",
}
NEEDS_IMATRIX = {q for q in QUANT_TYPES if q.startswith("iq")}
DEFAULT_LADDER = ["f16", "q8_0", "q5_k_m", "q5_0", "q4_k_m", "q4_0", "q3_k_m", "q2_k"]
FLOAT_FILE_TYPES = {0: "f32", 1: "f16", 32: "bf16"}  # general.file_type values of unquantized files
# what a file's manifest keeps of its blocks and its sliding-window layers (gguf_info.ModelInfo): a manifest written
# before one of them is read anew
BLOCK_FACTS = ("n_params_blocks", "blocks_bytes", "blocks_type_params", "n_rows_blocks", "n_swa", "swa_layers")


def _file_type(quant: str) -> int | None:
    """general.file_type (llama_ftype) of a file quantized to `quant`."""
    import gguf

    m = getattr(gguf.LlamaFileType, f"MOSTLY_{QUANT_TYPES[quant]}", None)
    return int(m) if m is not None else None


def quant_of_file_type(file_type: int | None) -> str | None:
    """The quant a file of this general.file_type (llama_ftype) holds; None where it is not one of QUANT_TYPES."""
    if file_type is None:
        return None
    return FLOAT_FILE_TYPES.get(int(file_type)) or next(
        (q for q in QUANT_TYPES if q not in FLOAT_FILE_TYPES.values() and _file_type(q) == int(file_type)), None
    )


def check_quant(name: str) -> str:
    q = name.lower()
    if q not in QUANT_TYPES:
        raise DevicelabError(f"unknown quant type {name!r}; use one of {', '.join(QUANT_TYPES)}")
    return q


@dataclass
class QuantFile:
    quant: str
    path: Path
    sha256: str
    manifest: dict

    @property
    def info(self) -> dict:
        return self.manifest["info"]


def _manifest_path(p: Path) -> Path:
    return p.with_name(p.name + ".devicelab.json")


def _finish(quant: str, out: Path, extra: dict) -> QuantFile:
    info = gguf_info.read(out)
    digest = sha256_file(out)
    man = {
        "quant": quant,
        "file": out.name,
        "bytes": out.stat().st_size,
        "sha256": digest,
        "bpw": info.bpw,
        "tensor_bpw": info.tensor_bpw,
        "tensor_types": info.tensor_types,
        "info": info.to_json(),
        **extra,
    }
    _write_manifest(out, man)
    return QuantFile(quant, out, digest, man)


def _write_manifest(out: Path, man: dict) -> None:
    mp = _manifest_path(out)
    tmp = paths.temp_for(mp)
    tmp.write_text(json.dumps(man, indent=1))
    tmp.replace(mp)  # a reader without the lock sees the whole manifest or none


def _cached(out: Path) -> QuantFile | None:
    mp = _manifest_path(out)
    if out.exists() and mp.exists():
        man = json.loads(mp.read_text())
        if man.get("bytes") == out.stat().st_size:
            info = man.get("info")
            if isinstance(info, dict) and not set(BLOCK_FACTS) <= set(info):
                read = gguf_info.read(out)  # made by an older devicelab: read once more
                info.update({k: getattr(read, k) for k in BLOCK_FACTS})
                try:
                    _write_manifest(out, man)
                except OSError:  # a folder this process cannot write: read again next time
                    pass
            return QuantFile(man["quant"], out, man["sha256"], man)
    return None


class Ladder:
    """All quants of one model, under models/<name>/<source sha256[:12]>/."""

    def __init__(
        self,
        model_name: str,
        source: Path,
        quantize_bin: Path | Callable[[], Path],
        build_provenance: dict | None = None,
    ):
        """`quantize_bin`: llama-quantize, or what makes it when a file has to be made (a ladder whose files are
        all made needs no build)."""
        self.model_name = model_name
        self.source = Path(source)
        self._quantize = quantize_bin
        self.build_provenance = build_provenance or {}
        self.source_sha = gguf_info.content_sha256(self.source)
        self.split = len(gguf_info.all_parts(self.source)) > 1
        self.dir = paths.sub("models") / model_name / self.source_sha[:12]
        self.dir.mkdir(parents=True, exist_ok=True)
        self._source_info: gguf_info.ModelInfo | None = None

    @property
    def quantize(self) -> Path:
        return Path(self._quantize() if callable(self._quantize) else self._quantize)

    def source_info(self) -> gguf_info.ModelInfo:
        if self._source_info is None:
            self._source_info = gguf_info.read(self.source)
        return self._source_info

    def path_for(self, quant: str, imatrix: "Imatrix | None" = None) -> Path:
        tag = f"-imat{imatrix.key[:8]}" if imatrix else ""
        return self.dir / f"{self.model_name}-{quant}{tag}.gguf"

    def _need_disk(self, nbytes: int) -> None:
        free = shutil.disk_usage(self.dir).free
        if free < nbytes * 1.1 + (256 << 20):
            raise DevicelabError(
                f"not enough disk to quantize {self.model_name}: {free / 1e9:.2f} GB free in "
                f"{self.dir}, need about {nbytes * 1.1 / 1e9:.2f} GB; free space or set DEVICELAB_HOME"
            )

    def base(self, log: Path | None = None) -> QuantFile:
        """The F16 base. An already-float source is used as is (its own type); a quantized source is
        requantized to F16 with --allow-requantize, and the manifest says so."""
        out = self.path_for("base")
        hit = _cached(out)
        if hit:
            return hit
        with paths.result_lock(out):  # another process making it: wait, then take what it made
            return _cached(out) or self._make_base(out, log)

    def _make_base(self, out: Path, log: Path | None) -> QuantFile:
        info = self.source_info()
        log = log or self.dir / "quantize.log"
        if info.file_type in FLOAT_FILE_TYPES and not self.split:
            self._link_source(out)
            return _finish(
                "base",
                out,
                {
                    "base_type": FLOAT_FILE_TYPES[info.file_type],
                    "requantized_from": None,
                    "source": str(self.source),
                    "source_sha256": self.source_sha,
                },
            )
        self._need_disk(info.n_params * 2)
        tmp = paths.temp_for(out)
        if info.file_type in FLOAT_FILE_TYPES:  # a split float file: joined into one, its own type
            run_logged(
                [self.quantize, self.source, tmp, FLOAT_FILE_TYPES[info.file_type].upper()],
                log,
                what=f"llama-quantize {self.model_name} → one {FLOAT_FILE_TYPES[info.file_type]} file",
            )
            tmp.rename(out)
            return _finish(
                "base",
                out,
                {
                    "base_type": FLOAT_FILE_TYPES[info.file_type],
                    "requantized_from": None,
                    "source": str(self.source),
                    "source_sha256": self.source_sha,
                    "joined_from_parts": len(gguf_info.all_parts(self.source)),
                    **self.build_provenance,
                },
            )
        run_logged(
            [self.quantize, "--allow-requantize", self.source, tmp, "F16"],
            log,
            what=f"llama-quantize {self.model_name} → F16 base",
        )
        tmp.rename(out)
        return _finish(
            "base",
            out,
            {
                "base_type": "f16",
                "requantized_from": info.dominant_type(),
                "source": str(self.source),
                "source_sha256": self.source_sha,
                "note": f"F16 base made from a {info.dominant_type()} file: quality is "
                "measured relative to that file, not to the original weights",
                **self.build_provenance,
            },
        )

    def _link_source(self, out: Path) -> None:
        """The source file itself as `out` (hard link, else a copy; through the HF cache's symlinks)."""
        tmp = paths.temp_for(out)
        try:
            tmp.hardlink_to(self.source.resolve())
        except OSError:
            shutil.copyfile(self.source.resolve(), tmp)
        tmp.replace(out)

    def has_base(self) -> bool:
        return _cached(self.path_for("base")) is not None

    def is_made(self, quant: str, imatrix: "Imatrix | None" = None) -> bool:
        """Whether the base and this quant are already in the cache (asking makes nothing)."""
        base = _cached(self.path_for("base"))
        return base is not None and (
            check_quant(quant) == base.manifest.get("base_type")
            or _cached(self.path_for(check_quant(quant), imatrix)) is not None
        )

    def quant(self, quant: str, threads: int | None = None, imatrix: "Imatrix | None" = None) -> QuantFile:
        quant = check_quant(quant)
        if quant in NEEDS_IMATRIX and imatrix is None:
            raise DevicelabError(
                f"{quant} is an i-quant: it is made with an importance matrix; give the model an "
                "`imatrix:` in the recipe"
            )
        base = self.base()
        if quant == base.manifest.get("base_type"):
            return QuantFile(quant, base.path, base.sha256, {**base.manifest, "quant": quant})
        out = self.path_for(quant, imatrix)
        hit = _cached(out)
        if hit:
            return hit
        with paths.result_lock(out):
            return _cached(out) or self._make_quant(quant, base, out, threads, imatrix)

    def _make_quant(
        self, quant: str, base: QuantFile, out: Path, threads: int | None, imatrix: "Imatrix | None"
    ) -> QuantFile:
        if imatrix is None and not self.split and self.source_info().file_type == _file_type(quant):
            # the source is already this quant (a published GGUF of a repo): measured as published, not
            # requantized from a base made of it
            self._link_source(out)
            return _finish(
                quant, out, {"as_published": True, "source": str(self.source), "source_sha256": self.source_sha}
            )
        self._need_disk(base.manifest["bytes"])
        tmp = paths.temp_for(out)
        argv = [str(self.quantize)]
        if imatrix:
            argv += ["--imatrix", str(imatrix.path)]
        argv += [str(base.path), str(tmp), QUANT_TYPES[quant]]
        if threads:
            argv.append(str(threads))
        t0 = time.time()
        run_logged(argv, self.dir / "quantize.log", what=f"llama-quantize {self.model_name} → {quant}")
        tmp.rename(out)
        return _finish(
            quant,
            out,
            {
                "base_sha256": base.sha256,
                "quantize_argv": argv[1:],
                "quantize_seconds": round(time.time() - t0, 2),
                "imatrix": str(imatrix.path) if imatrix else None,
                "imatrix_from": imatrix.provenance() if imatrix else None,
                **self.build_provenance,
            },
        )

    def make(
        self, quants: list[str], progress: Callable[[str], None] | None = None, imatrix: "Imatrix | None" = None
    ) -> dict[str, QuantFile]:
        out = {}
        for q in quants:
            if progress:
                progress(q)
            out[q] = self.quant(q, imatrix=imatrix)
        return out

    def imatrix(self, tool: Path, text: Path, chunks: int, ctx: int, threads: int | None = None) -> "Imatrix":
        """The base's importance matrix over a calibration text (llama-imatrix), cached by base, text, chunks
        and context."""
        base = self.base()
        text_sha = sha256_file(text)
        key = hashlib.sha256(f"{base.sha256} {text_sha} {chunks} {ctx}".encode()).hexdigest()
        out = self.dir / "imatrix" / f"{key[:16]}.gguf"
        im = Imatrix(out, key, text.name, text_sha, chunks, ctx)
        if out.exists():
            return im
        with paths.result_lock(out):
            if out.exists():
                return im
            tmp = paths.temp_for(out)
            argv = [
                str(tool),
                "-m",
                str(base.path),
                "-f",
                str(text),
                "-o",
                str(tmp),
                "--chunks",
                str(chunks),
                "-c",
                str(ctx),
                "--no-ppl",
            ]
            if threads:
                argv += ["-t", str(threads)]
            run_logged(argv, self.dir / "imatrix.log", what=f"llama-imatrix {self.model_name}")
            tmp.rename(out)
        return im


@dataclass(frozen=True)
class Imatrix:
    path: Path
    key: str
    text: str
    text_sha256: str
    chunks: int
    ctx: int

    def provenance(self) -> dict:
        return {
            "text": self.text,
            "text_sha256": self.text_sha256,
            "chunks": self.chunks,
            "ctx": self.ctx,
            "key": self.key[:16],
        }
