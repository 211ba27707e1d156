"""GGUF metadata read with gguf-py: architecture, parameter count, the real per-tensor type mix and
bits per weight. k-quants fall back per tensor when a row width is not a multiple of 256, so the type
mix is always read from the file, never inferred from the quant's name."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import DevicelabError

# bytes per KV-cache element for llama.cpp's -ctk/-ctv types (ggml block sizes: q8_0 34 B / 32, q4_0 18 B / 32)
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


# Sliding-window attention as the pinned tree's src/models/<arch>.cpp sets it up. GGUF architecture -> (the layers'
# pattern n: n - 1 sliding layers then a full one, or, dense first, a full one then n - 1 sliding; the window where
# the header gives none; how the header's `<arch>.attention.sliding_window` counts: "gives" it (over the default),
# "needs" it (> 0, or no layer slides), "switches" it (> 0 slides with the default window), "zero-off" (0 turns
# sliding off, else the default window)). A header's `<arch>.attention.sliding_window_pattern` (a list a layer, or n)
# overrides the pattern, as llama.cpp's load_swa_pattern does.
SWA_ARCHS: dict[str, tuple[int, bool, int | None, str]] = {
    "gemma2": (2, False, 4096, "gives"),
    "gemma3": (6, False, None, "needs"),
    "gemma3n": (5, False, None, "gives"),
    "cohere2": (4, False, None, "gives"),
    "cohere2moe": (4, True, None, "gives"),
    "gpt-oss": (2, False, None, "gives"),
    "olmo2": (4, False, None, "needs"),
    "exaone-moe": (4, False, 128, "gives"),
    "exaone4": (4, False, 4096, "gives"),  # its 64-layer (32B) model only
    "afmoe": (4, False, None, "needs"),
    "mellum": (4, False, None, "needs"),
    "plamo3": (8, False, None, "needs"),
    "laguna": (4, True, None, "needs"),
    "smallthinker": (4, True, 4096, "switches"),
    "llama4": (4, False, 8192, "zero-off"),  # chunked attention, held as a window
}
N_UBATCH = 512  # llama.cpp's default micro-batch: a sliding layer's cache holds the window + one (llama-kv-cache-iswa)


def swa_layers(arch: str, n_layer: int | None, window, pattern) -> tuple[int | None, int]:
    """(the window, how many layers slide) of a model whose header gave `window` and `pattern` (None where absent);
    (None, 0) where none slides."""
    rule = SWA_ARCHS.get(arch)
    if not n_layer or rule is None or (arch == "exaone4" and n_layer != 64):
        return None, 0
    n, dense_first, default, header = rule
    w = {
        "gives": window or default,
        "needs": window,
        "switches": default if window else None,
        "zero-off": None if window == 0 else default,
    }[header]
    if not w:
        return None, 0
    if isinstance(pattern, list) and len(pattern) >= n_layer:  # the header names each layer
        return int(w), sum(1 for x in pattern[:n_layer] if x)
    if isinstance(pattern, int) and pattern >= 0:
        n = pattern
    if n == 0:
        return int(w), n_layer
    return int(w), sum(1 for il in range(n_layer) if (il % n != 0 if dense_first else il % n < n - 1))


def kv_bytes_per_token(
    n_layer: int, n_head_kv: int, head_dim_k: int, head_dim_v: int, bytes_k: float = 2.0, bytes_v: float = 2.0
) -> float:
    """K and V of one token in `n_layer` layers (F16 by default: 2 bytes per element; one layer: a cell of kv_cells):
    the one place this is written (predict's described shapes, a GGUF's ModelInfo)."""
    return n_layer * n_head_kv * (head_dim_k * bytes_k + head_dim_v * bytes_v)


def kv_cells(n_ctx: int, n_layer: int, n_swa: int | None, swa_layers: int) -> float:
    """KV cells over all layers at n_ctx: a full layer holds n_ctx, a sliding one its window + a micro-batch (padded
    to 256, as llama-kv-cache-iswa.cpp sizes it), never more than n_ctx."""
    if not n_swa or not swa_layers:
        return float(n_layer * n_ctx)
    held = min(n_ctx, -(-(n_swa + N_UBATCH) // 256) * 256)
    return float((n_layer - swa_layers) * n_ctx + swa_layers * held)


def kv_scale(kv_type: str) -> float:
    """KV cache size of `kv_type` relative to F16 (kv_bytes_per_token is recorded for F16)."""
    return KV_TYPE_BYTES[kv_type] / KV_TYPE_BYTES["f16"]


@dataclass
class ModelInfo:
    path: str
    bytes: int
    arch: str
    name: str
    n_params: int
    file_type: int | None
    n_layer: int | None
    n_embd: int | None
    n_head: int | None
    n_head_kv: int | None
    head_dim_k: int | None
    head_dim_v: int | None
    n_ctx_train: int | None
    n_vocab: int | None
    tensor_types: dict = field(default_factory=dict)  # type -> tensor count
    tensor_type_bytes: dict = field(default_factory=dict)  # type -> bytes of tensor data
    tensor_type_params: dict = field(default_factory=dict)  # type -> parameters
    # parameters of the repeating blocks (tensors `blk.*`): what a prompt token is multiplied by — the token
    # embedding is looked up, and the output head runs for the last token of a prompt only
    n_params_blocks: int | None = None
    # their bytes: what a CPU backend that repacks a quant type's weights for its kernels holds a second copy of
    blocks_bytes: int | None = None
    # the blocks' matrices: parameters per tensor type (a prompt token's multiplies, by kernel), and their rows (a
    # matrix row is one dot product a token: its fixed cost weighs more in a narrow model's short rows)
    blocks_type_params: dict = field(default_factory=dict)
    n_rows_blocks: int | None = None
    # sliding-window attention: the window, and how many layers slide (their KV cache holds the window + a
    # micro-batch, not the context)
    n_swa: int | None = None
    swa_layers: int = 0

    @property
    def bpw(self) -> float:
        """Bits per weight of the whole file: bytes × 8 / n_params (metadata included, as llama.cpp's
        model_size / n_params reporting does for the tensor part)."""
        return self.bytes * 8 / self.n_params if self.n_params else float("nan")

    @property
    def tensor_bpw(self) -> float:
        tb = sum(self.tensor_type_bytes.values())
        return tb * 8 / self.n_params if self.n_params else float("nan")

    def dominant_type(self) -> str:
        """The type holding most parameters (what the file 'is', for display only)."""
        if not self.tensor_type_params:
            return "?"
        return max(self.tensor_type_params.items(), key=lambda kv: kv[1])[0]

    def kv_cache_bytes(self, n_ctx: int, type_bytes_k: float = 2.0, type_bytes_v: float = 2.0) -> int:
        """KV cache size at n_ctx (F16 by default: 2 bytes per element) from the model's shape, its sliding layers
        holding at most their window's cells."""
        if not (self.n_layer and self.n_head_kv and self.head_dim_k):
            raise DevicelabError(f"{self.path}: GGUF lacks the attention shape needed to size the KV cache")
        dv = self.head_dim_v or self.head_dim_k
        per_cell = kv_bytes_per_token(1, self.n_head_kv, self.head_dim_k, dv, type_bytes_k, type_bytes_v)
        return int(per_cell * kv_cells(n_ctx, self.n_layer, self.n_swa, self.swa_layers))

    def to_json(self) -> dict:
        d = asdict(self)
        d["bpw"] = self.bpw
        d["tensor_bpw"] = self.tensor_bpw
        d["dominant_type"] = self.dominant_type()
        return d


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # a malformed optional field must not stop reading
        return default


def split_parts(path: Path, count: int) -> list[Path]:
    """A split GGUF's parts in order, from its first (`NAME-00001-of-0000N.gguf`); [path] when not split."""
    import re

    if count <= 1:
        return [path]
    m = re.match(r"^(.+)-00001-of-(\d{5})\.gguf$", path.name)
    if not m:
        raise DevicelabError(
            f"{path} is one part of a split GGUF ({count} parts): give its first part, NAME-00001-of-….gguf"
        )
    parts = [path.with_name(f"{m.group(1)}-{i:05d}-of-{m.group(2)}.gguf") for i in range(1, count + 1)]
    missing = [p for p in parts if not p.exists()]
    if missing:
        raise DevicelabError(f"{missing[0]} is missing: a split GGUF needs all its parts in one folder")
    return parts


def all_parts(path: Path) -> list[Path]:
    """The files a GGUF is made of: its parts when split, else itself."""
    from gguf import GGUFReader

    m = __import__("re").match(r"^.+-00001-of-(\d{5})\.gguf$", Path(path).name)
    if not m:
        return [Path(path)]
    r = GGUFReader(str(path))
    return split_parts(Path(path), _field(r, "split.count", 1) or 1)


def content_sha256(path: Path) -> str:
    """sha256 of a GGUF file; of a split one, over its parts' sha256s in order."""
    from ..hashing import sha256_file

    parts = all_parts(path)
    if len(parts) == 1:
        return sha256_file(parts[0])
    import hashlib

    return hashlib.sha256(" ".join(sha256_file(p) for p in parts).encode()).hexdigest()


def read(path: Path) -> ModelInfo:
    from gguf import GGUFReader

    path = Path(path)
    if not path.exists():
        raise DevicelabError(f"model file {path} does not exist; give the path of a .gguf file")
    try:
        r = GGUFReader(str(path))
    except Exception as e:
        raise DevicelabError(f"{path} is not a readable GGUF file ({e}); give a .gguf model") from e
    arch = _field(r, "general.architecture", "unknown")
    a = lambda k: _field(r, f"{arch}.{k}")
    counts: Counter[str] = Counter()  # per tensor type: tensors, bytes, parameters
    tbytes: Counter[str] = Counter()
    tparams: Counter[str] = Counter()
    n_params = 0
    n_blocks = 0
    blocks_bytes = 0
    blocks_types: Counter[str] = Counter()
    rows = 0
    parts = split_parts(path, _field(r, "split.count", 1) or 1)
    size = sum(p.stat().st_size for p in parts)
    for rr in [r] + [GGUFReader(str(p)) for p in parts[1:]]:
        for t in rr.tensors:
            ty = t.tensor_type.name
            counts[ty] += 1
            tbytes[ty] += int(t.n_bytes)
            tparams[ty] += int(t.n_elements)
            n_params += int(t.n_elements)
            n_blocks += int(t.n_elements) if t.name.startswith("blk.") else 0
            blocks_bytes += int(t.n_bytes) if t.name.startswith("blk.") else 0
            if t.name.startswith("blk.") and len(t.shape) >= 2 and int(t.shape[0]):  # shape: ggml's order, ne0 first
                blocks_types[ty] += int(t.n_elements)
                rows += int(t.n_elements) // int(t.shape[0])
    n_head = a("attention.head_count")
    n_embd = a("embedding_length")
    n_head_kv = a("attention.head_count_kv")
    if isinstance(n_head_kv, list):  # per-layer lists in some archs: take the max
        n_head_kv = max(n_head_kv)
    if isinstance(n_head, list):
        n_head = max(n_head)
    hdk = a("attention.key_length") or (n_embd // n_head if n_embd and n_head else None)
    hdv = a("attention.value_length") or hdk
    n_swa, slide = swa_layers(
        arch, a("block_count"), a("attention.sliding_window"), a("attention.sliding_window_pattern")
    )
    vocab = a("vocab_size")
    if vocab is None:
        toks = r.fields.get("tokenizer.ggml.tokens")
        vocab = len(toks.data) if toks is not None else None
    return ModelInfo(
        path=str(path),
        bytes=size,
        arch=arch,
        name=str(_field(r, "general.name", path.stem)),
        n_params=n_params,
        n_params_blocks=n_blocks or None,
        blocks_bytes=blocks_bytes or None,
        file_type=_field(r, "general.file_type"),
        n_layer=a("block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=hdk,
        head_dim_v=hdv,
        n_ctx_train=a("context_length"),
        n_vocab=vocab,
        tensor_types=dict(counts),
        tensor_type_bytes=dict(tbytes),
        tensor_type_params=dict(tparams),
        blocks_type_params=dict(blocks_types),
        n_rows_blocks=rows or None,
        n_swa=n_swa,
        swa_layers=slide,
    )
