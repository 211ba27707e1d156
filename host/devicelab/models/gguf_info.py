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
    tensor_types: dict = field(default_factory=dict)        # type -> tensor count
    tensor_type_bytes: dict = field(default_factory=dict)   # type -> bytes of tensor data
    tensor_type_params: dict = field(default_factory=dict)  # type -> parameters

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
        """KV cache size at n_ctx (F16 by default: 2 bytes per element) from the model's shape."""
        if not (self.n_layer and self.n_head_kv and self.head_dim_k):
            raise DevicelabError(f"{self.path}: GGUF lacks the attention shape needed to size the KV cache")
        dv = self.head_dim_v or self.head_dim_k
        per_tok = self.n_layer * self.n_head_kv * (self.head_dim_k * type_bytes_k + dv * type_bytes_v)
        return int(per_tok * n_ctx)

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
    except Exception:  # noqa: BLE001 - a malformed optional field must not stop reading
        return default


def read(path: Path) -> ModelInfo:
    from gguf import GGUFReader

    path = Path(path)
    if not path.exists():
        raise DevicelabError(f"model file {path} does not exist; give the path of a .gguf file")
    try:
        r = GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001
        raise DevicelabError(f"{path} is not a readable GGUF file ({e}); give a .gguf model") from e
    arch = _field(r, "general.architecture", "unknown")
    a = lambda k: _field(r, f"{arch}.{k}")  # noqa: E731
    counts, tbytes, tparams = Counter(), Counter(), Counter()
    n_params = 0
    for t in r.tensors:
        ty = t.tensor_type.name
        counts[ty] += 1
        tbytes[ty] += int(t.n_bytes)
        tparams[ty] += int(t.n_elements)
        n_params += int(t.n_elements)
    n_head = a("attention.head_count")
    n_embd = a("embedding_length")
    n_head_kv = a("attention.head_count_kv")
    if isinstance(n_head_kv, list):  # per-layer lists in some archs: take the max
        n_head_kv = max(n_head_kv)
    if isinstance(n_head, list):
        n_head = max(n_head)
    hdk = a("attention.key_length") or (n_embd // n_head if n_embd and n_head else None)
    hdv = a("attention.value_length") or hdk
    vocab = a("vocab_size")
    if vocab is None:
        toks = r.fields.get("tokenizer.ggml.tokens")
        vocab = len(toks.data) if toks is not None else None
    return ModelInfo(
        path=str(path), bytes=path.stat().st_size, arch=arch, name=str(_field(r, "general.name", path.stem)),
        n_params=n_params, file_type=_field(r, "general.file_type"), n_layer=a("block_count"),
        n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim_k=hdk, head_dim_v=hdv,
        n_ctx_train=a("context_length"), n_vocab=vocab,
        tensor_types=dict(counts), tensor_type_bytes=dict(tbytes), tensor_type_params=dict(tparams),
    )
