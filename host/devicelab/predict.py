"""How fast a model not measured yet will run on a device, and whether it fits — predicted from what the lab measured
on that device, with the error the lab's own history gives.

A model is known by its shape: a GGUF file's header (parameters, layers, KV heads, head sizes, vocabulary, its own
bytes) or a described one. A quant with no file is sized from the nominal bits per weight llama.cpp's own quantize
tool prints for it (the pinned tree's tools/quantize/quantize.cpp: sizes of Llama-3-8B's files).

Per device, from the cells it measured of other models (same backend, threads and test shape; the same quant, else
the same quant family, else any quant — each prediction names what it rests on):
- decode reads every weight once a token, plus the KV cache so far: the bytes a second a reference cell moved,
  t/s × (weights + KV bytes a token × context), divided by the target's bytes a token;
- prefill is compute: where the references are of two widths or more, the time a prompt token takes per block
  parameter of each tensor type and per matrix row (a dot product's own fixed cost), fitted on their cells; else t/s
  × the references' parameters a prompt token is multiplied by, divided by the target's — the repeating blocks'
  parameters where both headers gave them (the token embedding is looked up, not multiplied, and the output head
  runs for a prompt's last token only: Gemma 3 270M's 262 k-token embedding is 63 % of its parameters), else all
  parameters;
- peak RSS is weights + KV at the cell's context + the runtime overhead the device measured (peak RSS − weights − KV
  of the references): where the rows know them, a model's own overhead fitted by its layers and vocabulary, plus the
  repacked copy of its blocks that the CPU backend keeps, fitted per tensor type; else the median overhead and the
  share of the blocks' bytes the same quant held.

The error, measured: each model the device measured is predicted from the device's other models (leave one model
out); `errors` keeps each cell's log(predicted ÷ measured) per device, metric and quant family. A prediction's
interval is ± the wider of two bounds on those |log errors| (`half_width`): the ⌈(n + 1) × 0.9⌉-th smallest of the n
(split-conformal: it holds a new cell ≥ 90 % of the time where cells' errors are exchangeable; with fewer than 9
their largest, which holds n/(n + 1)), and Student's t with as many degrees of freedom as the models the errors come
from × their root mean square — a model's cells share its error, so three models' twelve cells are three draws of
it, and their largest holds a fourth model's cells about 3/4 of the time. `predict --check` judges each held-out
model's cells against the interval `predict` would have given before it was measured: from the other models'
errors, each predicted without it. Fewer than two models on a device: no interval, and it says so; with exactly
two, holding one out leaves one, whose error cannot be measured: the check cannot test the interval, it needs a
third."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .candidate import DEFAULT_OVERHEAD, kv_at, mib, num
from .errors import DevicelabError
from .models import gguf_info

GiB = 1024**3
LLAMA3_8B_PARAMS = 8.03e9
# tools/quantize/quantize.cpp at the pinned commit: " 4.58G, +0.1754 ppl @ Llama-3-8B" (GiB of an 8.03 B model), or
# " 4.25 bpw" where it gives bits per weight; F16/BF16: 16 bits a weight
_SIZES_8B_GIB = {
    "q4_0": 4.34,
    "q4_1": 4.78,
    "q5_0": 5.21,
    "q5_1": 5.65,
    "q2_k": 2.96,
    "q3_k_s": 3.41,
    "q3_k_m": 3.74,
    "q3_k_l": 4.03,
    "q4_k_s": 4.37,
    "q4_k_m": 4.58,
    "q5_k_s": 5.21,
    "q5_k_m": 5.33,
    "q6_k": 6.14,
    "q8_0": 7.96,
}
NOMINAL_BPW = {
    **{q: round(g * GiB * 8 / LLAMA3_8B_PARAMS, 2) for q, g in _SIZES_8B_GIB.items()},
    "iq2_m": 2.7,
    "iq3_m": 3.66,
    "iq4_nl": 4.5,
    "iq4_xs": 4.25,
    "f16": 16.0,
    "bf16": 16.0,
}
METRICS = ("decode_tps", "prefill_tps", "peak_rss")
COVER = 0.9  # the interval holds a new cell this often (split-conformal, `half_width`)


def family(quant: str) -> str:
    """llama.cpp's quant families: float, legacy (q4_0 … q8_0), k-quant, i-quant."""
    q = str(quant).lower()
    if q in ("f32", "f16", "bf16"):
        return "float"
    if q.startswith("iq"):
        return "i-quant"
    if re.match(r"^q\d_k", q):
        return "k-quant"
    return "legacy"


@dataclass
class Shape:
    """What a prediction needs of a model."""

    name: str
    n_params: int
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    source: str  # where the shape came from, in words
    files: dict[str, int] = field(default_factory=dict)  # quant -> bytes of a real file
    n_params_blocks: int | None = None  # the repeating blocks' parameters (GGUF tensors blk.*), where known
    blocks_files: dict[str, int] = field(default_factory=dict)  # quant -> bytes of its blocks in a real file
    type_files: dict[str, dict] = field(default_factory=dict)  # quant -> {tensor type: bytes} of a real file
    # quant -> {tensor type: parameters} of a real file's block matrices, and their rows (prefill by tensor type)
    block_type_files: dict[str, dict] = field(default_factory=dict)
    n_rows_blocks: int | None = None
    n_swa: int | None = None  # sliding-window attention: the window, and the layers that slide (from the header)
    swa_layers: int = 0

    def blocks_bytes(self, quant: str) -> int | None:
        """The quant's bytes of the blocks' tensors: a real file's, else its nominal size; None where the blocks'
        parameters are not known."""
        q = quant.lower()
        if q in self.blocks_files:
            return self.blocks_files[q]
        if not self.n_params_blocks or q not in NOMINAL_BPW:
            return None
        return int(self.n_params_blocks * NOMINAL_BPW[q] / 8)

    @property
    def kv_bytes_per_token(self) -> int:
        """F16 KV cache a token (K and V, every layer)."""
        return int(gguf_info.kv_bytes_per_token(self.n_layer, self.n_head_kv, self.head_dim_k, self.head_dim_v))

    def kv_bytes(self, context: int) -> int:
        """F16 KV cache at `context`, the sliding layers holding their window (candidate.kv_at)."""
        return int(kv_at(self.kv_bytes_per_token, context, self.n_layer, self.n_swa, self.swa_layers))

    def weights(self, quant: str) -> tuple[int, str]:
        """The quant's bytes and how they were known."""
        q = quant.lower()
        if q in self.files:
            return self.files[q], "the file's size"
        if q not in NOMINAL_BPW:
            raise DevicelabError(
                f"{quant}: no file of {self.name} in that quant and no nominal size for it; "
                f"give one of {', '.join(sorted(NOMINAL_BPW))}"
            )
        return int(self.n_params * NOMINAL_BPW[q] / 8), f"{NOMINAL_BPW[q]:g} bits a weight (llama-quantize's size)"


DESCRIBED = ("params", "layers", "kv_heads", "head_dim", "vocab")


def described(name: str, **given) -> Shape:
    """A model described by its parameters, layers, KV heads, head size and vocabulary (one line names what is
    missing)."""
    missing = [k for k in DESCRIBED if given.get(k) in (None, 0)]
    if missing:
        raise DevicelabError(
            f"described model {name}: give {', '.join('--' + m.replace('_', '-') for m in missing)} "
            "(parameters, layers, KV heads, head size and vocabulary are all needed)"
        )
    return Shape(
        name,
        int(float(given["params"])),
        int(given["layers"]),
        int(given["kv_heads"]),
        int(given["head_dim"]),
        int(given["head_dim"]),
        int(given["vocab"]),
        "described",
    )


def from_gguf(path, source: str | None = None) -> Shape:
    """A GGUF file's shape from its header (gguf-py), and its own quant's bytes."""
    return from_info(gguf_info.read(path), source)


def from_info(info: gguf_info.ModelInfo, source: str | None = None) -> Shape:
    """A read GGUF header's shape. source: where the header came from, where not the file itself (a hub file's
    header read without its weights)."""
    from .models.ladder import quant_of_file_type

    path = source or info.path
    need = {"layers": info.n_layer, "kv_heads": info.n_head_kv, "head_dim": info.head_dim_k}
    missing = [k for k, v in need.items() if not v]
    if missing:
        raise DevicelabError(f"{path}: its GGUF header lacks {', '.join(missing)}; describe the model instead")
    q = quant_of_file_type(info.file_type)
    files = {q: info.bytes} if q else {}
    return Shape(
        info.name,
        info.n_params,
        int(info.n_layer or 0),
        int(info.n_head_kv or 0),
        int(info.head_dim_k or 0),
        int(info.head_dim_v or info.head_dim_k or 0),
        int(info.n_vocab or 0),
        f"the GGUF header of {path}",
        files,
        info.n_params_blocks,
        {q: info.blocks_bytes} if q and info.blocks_bytes else {},
        {q: dict(info.tensor_type_bytes)} if q and info.tensor_type_bytes else {},
        {q: dict(info.blocks_type_params)} if q and info.blocks_type_params else {},
        info.n_rows_blocks,
        info.n_swa,
        info.swa_layers,
    )


# ---------------------------------------------------------------- the device's own cells
SHAPE_COLS = ("backend", "threads", "n_prompt", "n_gen", "n_depth")


def cells(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per measured (device, model, quant, backend, threads, test shape, metric): the mean of its rows, and
    the model's bytes, parameters and KV bytes a token; peak RSS at the largest context its cell held."""
    need = {"device", "model", "quant", "metric", "value", "model_bytes", "n_params", "kv_bytes_per_token"}
    if rows.empty or not need <= set(rows.columns):
        return pd.DataFrame()
    r = rows[rows["metric"].isin(METRICS) & pd.to_numeric(rows["value"], errors="coerce").notna()].copy()
    for c in (
        *SHAPE_COLS,
        "model_bytes",
        "n_params",
        "n_params_blocks",
        "model_blocks_bytes",
        "kv_bytes_per_token",
        "n_rows_blocks",
        "n_layer",
        "n_vocab",
    ):
        r[c] = pd.to_numeric(r[c], errors="coerce") if c in r.columns else np.nan
    r["backend"] = rows["backend"].astype("string") if "backend" in rows.columns else ""
    tb = rows["tensor_type_bytes"] if "tensor_type_bytes" in rows.columns else pd.Series(None, index=rows.index)
    r["type_bytes"] = tb.loc[r.index].map(_type_bytes)
    tp = rows["blocks_type_params"] if "blocks_type_params" in rows.columns else pd.Series(None, index=rows.index)
    r["type_params"] = tp.loc[r.index].map(_type_bytes)
    r["value"] = pd.to_numeric(r["value"], errors="coerce").astype(float)
    if "cell_id" in r.columns:  # peak RSS: one a cell, at the most tokens its tests held
        tokens = (rows["n_prompt"].fillna(0) + rows["n_gen"].fillna(0) + rows["n_depth"].fillna(0)).astype(float)
        held = tokens.groupby(rows["cell_id"]).max()
        rss = r["metric"] == "peak_rss"
        r.loc[rss, "n_prompt"] = r.loc[rss, "cell_id"].map(held)
        r.loc[rss, ["n_gen", "n_depth"]] = 0
    r = r[r["model_bytes"].notna() & r["n_params"].notna()]
    if "cell_id" in r.columns:  # peak RSS only of cells whose tokens are known (bench cells): others held more
        r = r[(r["metric"] != "peak_rss") | (r["n_prompt"].fillna(0) > 0)]
    keys = ["device", "model", "quant", "metric", *SHAPE_COLS]
    r[list(SHAPE_COLS[1:])] = r[list(SHAPE_COLS[1:])].fillna(0)
    r["backend"] = r["backend"].fillna("")
    g = r.groupby(keys, dropna=False, sort=True)
    out = g.agg(
        value=("value", "mean"),
        model_bytes=("model_bytes", "max"),
        n_params=("n_params", "max"),
        n_params_blocks=("n_params_blocks", "max"),
        blocks_bytes=("model_blocks_bytes", "max"),
        kv=("kv_bytes_per_token", "max"),
        type_bytes=("type_bytes", "first"),
        type_params=("type_params", "first"),
        n_rows_blocks=("n_rows_blocks", "max"),
        n_layer=("n_layer", "max"),
        n_vocab=("n_vocab", "max"),
    ).reset_index()
    out["kv"] = out["kv"].fillna(0)
    return out


def _type_bytes(v) -> dict | None:
    """A row's tensor_type_bytes or blocks_type_params (a JSON text in the ledger, a dict from a table) as
    {type: bytes or parameters}; None if unknown."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    if not isinstance(v, dict) or not v:
        return None
    got = {str(k): float(n) for k, n in v.items() if num(n)}
    return got or None


def _extra(rss: pd.DataFrame) -> pd.Series:
    """What peak-RSS cells held beyond their weights and their KV at the tokens they held."""
    return (rss["value"] - rss["model_bytes"] - rss["kv"] * rss["n_prompt"]).clip(lower=0)


def _overhead(rss: pd.DataFrame) -> float:
    """The runtime overhead peak-RSS cells show: the median of peak RSS − weights − KV at the tokens they held."""
    return float(np.median(_extra(rss)))


def _one_quant_only(rss: pd.DataFrame) -> bool:
    """Whether a model measured one quant only: its own overhead cannot be told from a copy of its weights."""
    return bool(rss.groupby("model")["quant"].nunique().min() < 2)


def _repacked(rss: pd.DataFrame, quant: str) -> tuple[float, float] | None:
    """(each model's own overhead, its median over the models; the share of the blocks' bytes that a quant's cells
    held beyond it) — ggml's CPU backend keeps a copy of some types' weights repacked for its kernels (which types
    depends on the CPU: Q4_0 and Q4_K on AVX2, say), so peak RSS grows with the blocks' bytes in those quants and not
    in others. A model's own overhead is the least it showed in any quant; the share is the median over the
    models that measured this quant. None where a model's blocks' bytes are not known, or one quant is all a
    model measured (its overhead cannot be told from a copy). The rule where the tensor types are not known."""
    if rss["blocks_bytes"].isna().any() or _one_quant_only(rss):
        return None
    extra = _extra(rss)
    own = extra.groupby(rss["model"]).min()
    mine = rss["quant"] == quant
    if not mine.any():
        return None
    share = ((extra[mine] - rss.loc[mine, "model"].map(own)) / rss.loc[mine, "blocks_bytes"]).clip(lower=0)
    return float(np.median(own)), float(np.median(share))


def _type_bytes_of(params: dict) -> dict | None:
    """{tensor type: bytes} of {tensor type: parameters}, from ggml's own block sizes (gguf's GGML_QUANT_SIZES)."""
    import gguf

    out = {}
    for t, n in params.items():
        try:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]]
        except KeyError:
            return None
        out[t] = float(n) * size / block
    return out


def _own_overhead(rss: pd.DataFrame, n_layer, n_vocab) -> tuple[float, str] | None:
    """A model's runtime overhead (peak RSS − weights − KV in its leanest quant), fitted on the other models' as a
    fixed part + a part a layer (its tensors' and graph's bookkeeping) + a part a vocabulary token (the tokenizer's
    tables: Gemma 3 270M's 262 k tokens held ≈ 35 MiB more than the random Llamas' 1 k here), non-negative least
    squares: the layer part where three models or more were measured, the vocabulary's where two. None where a
    reference or the target lacks its layers or vocabulary: the median overhead then."""
    if not (num(n_layer) and num(n_vocab)) or rss["n_layer"].isna().any() or rss["n_vocab"].isna().any():
        return None
    if _one_quant_only(rss):
        return None
    g = (
        rss.assign(extra=_extra(rss))
        .groupby("model")
        .agg(own=("extra", "min"), n_layer=("n_layer", "max"), n_vocab=("n_vocab", "max"))
    )
    if len(g) < 2:
        return None
    cols = [np.ones(len(g)), g["n_vocab"].to_numpy(dtype=float) / 1e5]
    target = [1.0, float(n_vocab) / 1e5]
    if len(g) >= 3:
        cols.append(g["n_layer"].to_numpy(dtype=float) / 10)
        target.append(float(n_layer) / 10)
    from scipy.optimize import nnls

    coef, _ = nnls(np.column_stack(cols), g["own"].to_numpy(dtype=float) / 2**20)
    mib_ = float(np.array(target) @ coef)
    per = f"{coef[1] * 2**20 / 1e5:.0f} B a vocabulary token" + (
        f", {coef[2] / 10:.2f} MiB a layer" if len(coef) > 2 else ""
    )
    return mib_ * 2**20, f"the {mib_:.0f} MiB runtime overhead the other models' vocabularies and layers give ({per})"


def _copy_by_type(rss: pd.DataFrame, type_params: dict | None) -> tuple[float, str] | None:
    """The bytes a quant's cells hold beyond their model's own overhead, as a share of the blocks' bytes of each
    tensor type, fitted (non-negative least squares) on the other models' cells: ggml's CPU backend keeps a repacked
    copy of the types its kernels want so (on this machine's AVX2: Q4_0, Q4_K and Q2_K whole, Q3_K, Q5_x, Q6_K, Q8_0
    and F16 not), and a quant's name does not say its types (SmolLM2's q4_k_m is half Q5_0, so it held no copy; a
    wide model's q4_k_m held one of 84 % of its blocks). None where a reference or the target lacks its types, or a
    type that is TYPE_SHARE of the target's blocks is nowhere as large a share of a reference's."""
    if not type_params or rss["type_params"].isna().any() or _one_quant_only(rss):
        return None
    mine = _type_bytes_of(type_params)
    got = [_type_bytes_of(tp) for tp in rss["type_params"]]
    feats = [f for f in got if f is not None]
    if mine is None or len(feats) < len(got):
        return None
    types = sorted(set(mine).union(*feats))
    x = np.array([[f.get(t, 0.0) for t in types] for f in feats]) / 2**20
    if _unseen_type(x, types, mine):
        return None
    extra = _extra(rss)
    over = (extra - extra.groupby(rss["model"]).transform("min")).to_numpy(dtype=float) / 2**20
    from scipy.optimize import nnls

    held, _ = nnls(x, over)
    copy = float(np.array([mine.get(t, 0.0) for t in types]) @ held) / 2**20
    kept = ", ".join(f"{t} {h:.0%}" for t, h in zip(types, held, strict=True) if h >= 0.05 and mine.get(t))
    return copy * 2**20, f"+ {copy:.0f} MiB, the copy of its blocks the other models held by type ({kept or 'none'})"


def _ctx(c) -> float:
    """Tokens in the KV cache on average while a test ran (decode: half its generation on top of the prompt)."""
    return float(c["n_depth"]) + float(c["n_prompt"]) + float(c["n_gen"]) / 2


def _scale(c, metric: str, blocks: bool = False) -> float:
    """What a reference cell's figure is divided by the target's (bytes a token, parameters a prompt token
    multiplies: the blocks' where `blocks`) — its `effort`."""
    if metric == "decode_tps":
        return float(c["model_bytes"]) + float(c["kv"]) * _ctx(c)
    if metric == "prefill_tps":
        return float(c["n_params_blocks"] if blocks else c["n_params"])
    raise ValueError(metric)


@dataclass
class Predicted:
    device: str
    model: str
    quant: str
    metric: str
    value: float
    basis: str  # what it rests on, in words
    refs: list[str]  # the reference models
    lo: float | None = None
    hi: float | None = None
    shape: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


TYPE_SHARE = 0.1  # a tensor type this large a share of the target's bytes must be as large in some reference cell


def _unseen_type(x: np.ndarray, types: list[str], target: dict) -> bool:
    """Whether a type that is TYPE_SHARE of the target's total is nowhere as large a share of a reference's (rows of
    `x`, one column per type of `types`): its rate or share would be a guess."""
    share = x / x.sum(axis=1, keepdims=True)
    total = sum(target.values())
    return any(
        target.get(t, 0.0) >= TYPE_SHARE * total and not (share[:, j] >= TYPE_SHARE).any() for j, t in enumerate(types)
    )


def _decode_by_type(same: pd.DataFrame, type_bytes: dict, kv_bytes: float) -> tuple[float, str] | None:
    """Decode t/s from the time a token takes per byte of each tensor type, fitted (non-negative least squares) on
    the reference cells at this shape, every quant of every model: a quant's name does not say its tensors' types
    (llama-quantize gives a tensor whose rows are not a multiple of 256 another type: SmolLM2's q4_k_m is half Q5_0),
    and each type's kernel moves its bytes at its own rate. The KV cache read counts as F16. None where a reference
    does not know its types, or a type that is TYPE_SHARE of the target's bytes is nowhere as large a share of a
    reference's (its rate would be a guess): the quant's bytes a second then."""
    if len(same) < 2 or same["type_bytes"].isna().any():
        return None
    feats = [
        {**tb, "F16": tb.get("F16", 0.0) + kv} for tb, kv in zip(same["type_bytes"], same["kv_bytes"], strict=True)
    ]
    target = {**type_bytes, "F16": type_bytes.get("F16", 0.0) + kv_bytes}
    types = sorted(set(target).union(*feats))
    x = np.array([[f.get(t, 0.0) for t in types] for f in feats]) / 1e6
    if _unseen_type(x, types, target):
        return None
    from scipy.optimize import nnls

    ms_per_mb, _ = nnls(x, 1000.0 / same["value"].to_numpy(dtype=float))
    ms = float(np.array([target.get(t, 0.0) for t in types]) @ ms_per_mb) / 1e6
    if ms <= 0:
        return None
    rates = ", ".join(f"{t} {1 / r:.1f} GB/s" for t, r in zip(types, ms_per_mb, strict=True) if r > 0 and target.get(t))
    return 1000.0 / ms, f"the time a token took per byte of each tensor type on the other models ({rates})"


WIDTH_SPREAD = 1.25  # the references' parameters a row must differ this much for a row's own cost to be fitted


def _prefill_by_type(same: pd.DataFrame, type_params: dict, n_rows: float) -> tuple[float, str] | None:
    """Prefill t/s from the time a prompt token takes per parameter of each tensor type in the blocks' matrices and
    per matrix row, fitted (non-negative least squares) on the reference cells at this shape, every quant of every
    model: each type's kernel multiplies at its own rate, and each row is a dot product with a fixed cost of its own,
    which weighs more in a narrow model's short rows (a 1024-wide model prefilled 1.2–1.5× the parameters a second of
    a 576-wide one here). None where a reference lacks them, the references are of one width (a row's cost and a
    parameter's cannot be told apart: SmolLM2's 576 and Gemma 3 270M's 640 are one width), or a type that is
    TYPE_SHARE of the target's parameters is nowhere as large a share of a reference's: the parameters a second of
    the same quant then."""
    if len(same) < 3 or same["model"].nunique() < 2:
        return None
    if same["type_params"].isna().any() or same["n_rows_blocks"].isna().any() or not n_rows:
        return None
    width = [sum(tp.values()) / r for tp, r in zip(same["type_params"], same["n_rows_blocks"], strict=True)]
    if max(width) < WIDTH_SPREAD * min(width):
        return None
    types = sorted(set(type_params).union(*same["type_params"]))
    x = np.array([[tp.get(t, 0.0) for t in types] for tp in same["type_params"]]) / 1e6
    if _unseen_type(x, types, type_params):
        return None
    from scipy.optimize import nnls

    x = np.column_stack([x, same["n_rows_blocks"].to_numpy(dtype=float) / 1e6])
    ms_per, _ = nnls(x, 1000.0 / same["value"].to_numpy(dtype=float))
    ms = float(np.array([*(type_params.get(t, 0.0) for t in types), n_rows]) @ ms_per) / 1e6
    if ms <= 0:
        return None
    return 1000.0 / ms, (
        "the time a prompt token took per parameter of each tensor type and per matrix row of the blocks on the "
        f"other models ({ms_per[-1]:.2f} µs a thousand rows)"
    )


def predict_one(
    refs: pd.DataFrame,
    metric: str,
    quant: str,
    shape: dict,
    weights: int,
    n_params: int,
    kv: int,
    n_params_blocks: int | None = None,
    blocks_bytes: int | None = None,
    type_bytes: dict | None = None,
    type_params: dict | None = None,
    n_rows: int | None = None,
    n_layer: int | None = None,
    n_vocab: int | None = None,
) -> tuple[float, str, list[str]] | None:
    """One figure for a target (weights, parameters — its blocks' where known —, KV bytes a token, its blocks'
    bytes, its bytes by tensor type, its block matrices' parameters by tensor type and their rows) at `shape`
    (backend, threads, n_prompt, n_gen, n_depth) from a device's reference cells, with what it rests on; None where
    nothing matches."""
    same = refs[refs["metric"] == metric]
    for c in SHAPE_COLS:
        if c in shape:
            same = same[same[c] == shape[c]]
    if same.empty:
        return None
    if metric == "peak_rss":
        tokens = float(shape.get("n_prompt", 0)) + float(shape.get("n_gen", 0)) + float(shape.get("n_depth", 0))
        models = sorted(set(same["model"]))
        own, copy = _own_overhead(same, n_layer, n_vocab), _copy_by_type(same, type_params)
        rep = _repacked(same, quant) if num(blocks_bytes) and (own is None or copy is None) else None
        if copy is None and rep is not None:
            copy = (
                rep[1] * float(blocks_bytes or 0),
                f"+ {rep[1]:.0%} of the blocks' bytes, the copy the other models' {quant} held beside their weights",
            )
        if own is None:
            o = rep[0] if rep is not None else _overhead(same)
            own = (o, f"the {o / 2**20:.0f} MiB runtime overhead measured")
        return (
            weights + kv * tokens + own[0] + (copy[0] if copy else 0.0),
            " ".join(["weights + KV +", own[1], *([copy[1]] if copy else [])]),
            models,
        )
    if metric == "decode_tps" and type_bytes:
        by_type = _decode_by_type(
            same.assign(kv_bytes=same["kv"] * same.apply(_ctx, axis=1)), type_bytes, kv * _ctx(shape)
        )
        if by_type is not None:
            return by_type[0], by_type[1], sorted(set(same["model"]))
    if metric == "prefill_tps" and type_params and num(n_rows):
        by_type = _prefill_by_type(same, type_params, float(n_rows or 0))
        if by_type is not None:
            return by_type[0], by_type[1], sorted(set(same["model"]))
    fam = family(quant)
    label, use = next(
        (label, same[pick])
        for label, pick in (
            (f"{quant}", same["quant"] == quant),
            (f"the {fam} family", same["quant"].map(family) == fam),
            ("every quant", pd.Series(True, index=same.index)),
        )
        if pick.any()
    )
    # prefill: the blocks' parameters where the target's and every reference's header gave them
    blocks = bool(num(n_params_blocks)) and bool(use["n_params_blocks"].map(lambda v: bool(num(v))).all())
    effort = use.apply(lambda c: _scale(c, metric, blocks), axis=1)
    per = float(np.median(use["value"] * effort))
    if metric == "decode_tps":
        target = weights + kv * _ctx(shape)
        how = f"bytes a second its decode moved on {label} ({per / 1e9:.2f} GB/s)"
    else:
        target = float(n_params_blocks if blocks and n_params_blocks else n_params)
        what = "block parameters" if blocks else "parameters (the blocks' not known)"
        how = f"{what} × tokens a second of its prefill on {label}"
    models = sorted(set(use["model"]))
    return per / target, how, models


# ---------------------------------------------------------------- the error, measured
def errors(c: pd.DataFrame) -> pd.DataFrame:
    """Leave one model out, per device: each measured cell (of `cells`) of a model predicted from the device's other
    models; one line per cell with log(predicted ÷ measured)."""
    out = []
    if c.empty:
        return pd.DataFrame(columns=["device", "model", "quant", "family", "metric", "predicted", "measured", "error"])
    for (device, model), mine in c.groupby(["device", "model"]):
        others = c[(c["device"] == device) & (c["model"] != model)]
        if others.empty:
            continue
        for _, cell in mine.iterrows():
            shape = {k: cell[k] for k in SHAPE_COLS}
            got = predict_one(
                others,
                cell["metric"],
                cell["quant"],
                shape,
                cell["model_bytes"],
                cell["n_params"],
                cell["kv"],
                cell["n_params_blocks"],
                cell["blocks_bytes"],
                cell["type_bytes"],
                cell["type_params"],
                cell["n_rows_blocks"],
                cell["n_layer"],
                cell["n_vocab"],
            )
            if got is None or not got[0] or not cell["value"]:
                continue
            out.append(
                {
                    "device": device,
                    "model": model,
                    "quant": cell["quant"],
                    "family": family(cell["quant"]),
                    "metric": cell["metric"],
                    **shape,
                    "predicted": got[0],
                    "measured": float(cell["value"]),
                    "error": math.log(got[0] / float(cell["value"])),
                }
            )
    return pd.DataFrame(out)


def half_width(errs: pd.DataFrame, device: str, metric: str, fam: str, leave_out: set[str]) -> float | None:
    """± log half-width of a prediction's interval from the device's held-out errors (of models other than
    `leave_out`) for that metric and quant family (else every family): the wider of two bounds, None without errors.

    - the split-conformal one: of the n |log errors|, the ⌈(n + 1) × COVER⌉-th smallest — their largest where n is
      smaller than that; it holds a new cell COVER of the time where the cells' errors are exchangeable;
    - Student's: t(COVER, k) × their root mean square, with as many degrees of freedom as the k models they come
      from. A model's cells share its error (its width, its vocabulary, what its kernels make of it), so k models'
      cells are k draws of it, not n: with three models the largest of their twelve cells is the largest of three
      draws, which holds a fourth model's cells about 3/4 of the time, not 12/13."""
    if errs.empty:
        return None
    e = errs[(errs["device"] == device) & (errs["metric"] == metric) & ~errs["model"].isin(leave_out)]
    by_fam = e[e["family"] == fam]
    use = by_fam if len(by_fam) >= 3 else e
    if use.empty:
        return None
    a = use["error"].abs().to_numpy(dtype=float)
    return max(conformal(a), student(a, int(use["model"].nunique())))


def conformal(abs_errors) -> float:
    """The ⌈(n + 1) × COVER⌉-th smallest of n absolute errors (split-conformal), or the largest where n is too few."""
    a = np.sort(np.asarray(abs_errors, dtype=float))
    k = math.ceil(round((len(a) + 1) * COVER, 9))
    return float(a[min(k, len(a)) - 1])


def student(abs_errors, units: int) -> float:
    """t((1 + COVER) / 2, units) × the errors' root mean square: a new error's two-sided COVER bound where errors are
    normal about zero and their spread is known from `units` independent draws (scipy.special, as compare.py)."""
    from scipy.special import stdtrit

    a = np.asarray(abs_errors, dtype=float)
    return float(stdtrit(max(units, 1), (1 + COVER) / 2) * math.sqrt(float(np.mean(a**2))))


TWO_MODELS = (
    "{d}: two models — each is predicted from the other (its errors above), but held out it leaves one model, "
    "whose own error cannot be measured without it: this check cannot test the interval until a third model is "
    "measured here"
)


def check(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str], list[str]]:
    """(the error table per device, metric and quant family; every held-out cell with whether its interval held
    it; a line for each device with too few models; a line for each device whose check cannot test the interval).

    A held-out model's interval is the one `predict` would have given it before it was measured: from the errors of
    the device's other models each predicted without it (leave the held-out model out, then each other in turn), so
    nothing of its own cells reaches its interval."""
    return check_cells(cells(rows))


def check_cells(c: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str], list[str]]:
    """`check` on the device's cells (of `cells`); each held-out cell keeps its interval's log half-width."""
    errs = errors(c)
    models = c.groupby("device")["model"].nunique() if not c.empty else pd.Series(dtype=int)
    few = [
        f"{d}: {n} model measured — predictions need two or more to measure their error"
        for d, n in models.items()
        if n < 2
    ]
    notes = [TWO_MODELS.format(d=d) for d, n in models.items() if n == 2]
    if errs.empty:
        return pd.DataFrame(), errs, few, notes
    held_out = errs[["device", "model"]].drop_duplicates().itertuples(index=False)
    # (device, held-out model): the errors `predict` had before that model was measured
    before = {(d, m): errors(c[(c["device"] == d) & (c["model"] != m)]) for d, m in held_out}
    widths, inside = [], []
    for _, e in errs.iterrows():
        w = half_width(before[(e["device"], e["model"])], e["device"], e["metric"], e["family"], set())
        widths.append(w)
        # held where |error| is at most the half-width: a closed interval, to the rounding of the logs
        inside.append(None if w is None else abs(e["error"]) <= w * (1 + 1e-9) + 1e-12)
    errs = errs.assign(
        half_width=pd.Series(widths, index=errs.index, dtype="object"),
        inside=pd.Series(inside, index=errs.index, dtype="object"),
    )
    table = (
        errs.groupby(["device", "metric", "family"])
        .agg(
            cells=("error", "size"),
            models=("model", "nunique"),
            median_error=("error", lambda x: math.expm1(float(np.median(x)))),
            p90_abs_error=("error", lambda x: math.expm1(float(np.quantile(x.abs(), COVER)))),
            inside=("inside", lambda x: f"{int(x.fillna(False).sum())}/{int(x.notna().sum())}"),
        )
        .reset_index()
    )
    return table, errs, few, notes


# ---------------------------------------------------------------- a target on every device
def predict(
    rows: pd.DataFrame, target: Shape, quants: list[str], context: int, devices: list[str] | None = None
) -> list[Predicted]:
    """Every device's prediction for `target` in each quant at each test shape the device measured (decode, prefill,
    peak RSS), with its interval."""
    c = cells(rows)
    if c.empty:
        raise DevicelabError("the ledger holds no measured speeds to predict from: run a bench recipe first")
    # other models only: one with the target's name or parameter count is the target (a file of it measured), and
    # its cells reach neither the prediction nor, through the other models' errors, its interval
    c = c[(c["model"] != target.name) & (c["n_params"] != target.n_params)]
    errs = errors(c)
    out: list[Predicted] = []
    for device in devices or sorted(set(c["device"])):
        refs = c[c["device"] == device]
        if refs.empty:
            continue
        shapes = refs[list(SHAPE_COLS) + ["metric"]].drop_duplicates()
        for q in quants:
            weights, _ = target.weights(q)
            for _, s in shapes.iterrows():
                shape = {k: s[k] for k in SHAPE_COLS}
                got = predict_one(
                    refs,
                    s["metric"],
                    q,
                    shape,
                    weights,
                    target.n_params,
                    target.kv_bytes_per_token,
                    target.n_params_blocks,
                    target.blocks_bytes(q),
                    target.type_files.get(q.lower()),
                    target.block_type_files.get(q.lower()),
                    target.n_rows_blocks,
                    target.n_layer,
                    target.n_vocab,
                )
                if got is None:
                    continue
                value, how, models = got
                w = half_width(errs, device, s["metric"], family(q), set())
                lo, hi = (value * math.exp(-w), value * math.exp(w)) if w is not None else (None, None)
                out.append(Predicted(device, target.name, q, s["metric"], value, how, models, lo, hi, shape))
    return out


def ram(target: Shape, quant: str, context: int, budget: int | None, overhead: int) -> dict:
    """RAM need at `context` (weights + F16 KV, its sliding layers holding their window, + runtime overhead) against a
    budget: fits or not, with the margin."""
    weights, how = target.weights(quant)
    kv = target.kv_bytes(context)
    need = weights + kv + overhead
    return {
        "quant": quant,
        "weights": weights,
        "weights_from": how,
        "kv": kv,
        "overhead": overhead,
        "need": need,
        "budget": budget,
        "fits": None if budget is None else need <= budget,
        "margin": None if budget is None else budget - need,
    }


def ram_on(rows: pd.DataFrame, device: str, target: Shape, quants: list[str], context: int) -> list[dict]:
    """Per quant, `ram` against this device's budget with the overhead it measured (else the default), and whether it
    measured one."""
    budget, overhead = device_memory(rows, device)
    return [
        ram(target, q, context, budget, overhead if overhead is not None else DEFAULT_OVERHEAD)
        | {"overhead_measured": overhead is not None}
        for q in quants
    ]


def device_memory(rows: pd.DataFrame, device: str) -> tuple[int | None, int | None]:
    """A device's budget for one app (its latest) and the runtime overhead it measured (median over its cells);
    None where not known."""
    d = rows[rows["device"] == device] if "device" in rows.columns else rows.iloc[0:0]
    budget = None
    if "ram_budget_bytes" in d.columns:
        b = pd.to_numeric(d["ram_budget_bytes"], errors="coerce").dropna()
        budget = int(b.iloc[-1]) if len(b) else None
    c = cells(d)
    o = c[c["metric"] == "peak_rss"] if not c.empty else c
    return budget, (int(_overhead(o)) if not o.empty else None)


# ---------------------------------------------------------------- recommend --consider
def _headline(preds: list[Predicted], metric: str) -> Predicted | None:
    """The figure a recommendation compares: the metric at the most threads, then the longest test."""
    mine = [p for p in preds if p.metric == metric]
    key = lambda p: (p.shape.get("threads") or 0, p.shape.get("n_gen") or 0, p.shape.get("n_prompt") or 0)
    return max(mine, key=key) if mine else None


def consider(
    rows: pd.DataFrame, target: Shape, quants: list[str], context: int, min_decode_tps: float, devices: list[str]
) -> list[dict]:
    """A model not measured, as a recommendation sees it on each device: RAM need against the budget and predicted
    decode against the speed target, with the interval, in a verdict that never claims a measurement."""
    preds = predict(rows, target, quants, context, devices)
    out = []
    for device in devices:
        for q, mem in zip(quants, ram_on(rows, device, target, quants, context), strict=True):
            mine = [p for p in preds if p.device == device and p.quant == q]
            dec, pre = _headline(mine, "decode_tps"), _headline(mine, "prefill_tps")
            out.append(
                {
                    "predicted": True,
                    "device": device,
                    "model": target.name,
                    "source": target.source,
                    "quant": q,
                    "ram": mem,
                    "decode": dec.to_json() if dec else None,
                    "prefill": pre.to_json() if pre else None,
                    "verdict": _verdict(mem, dec, min_decode_tps),
                }
            )
    return out


def _verdict(mem: dict, dec: Predicted | None, target_tps: float) -> str:
    if mem["fits"] is False:
        return f"would not fit: needs {mib(mem['need'])} > budget {mib(mem['budget'])}"
    fits = "RAM budget unknown" if mem["fits"] is None else f"fits ({mib(mem['need'])} of {mib(mem['budget'])})"
    if dec is None:
        return f"{fits}; no decode to predict from on this device"
    if dec.lo is None or dec.hi is None:
        return (
            f"{fits}; decode {dec.value:.1f} tok/s against the target {target_tps:g}, its error not measured here "
            "(that needs two other models measured on this device): measure it"
        )
    speed = f"decode {dec.value:.1f} tok/s ({dec.lo:.1f}–{dec.hi:.1f})"
    if dec.hi < target_tps:
        return f"{fits}; predicted too slow: {speed} < {target_tps:g}"
    if dec.lo >= target_tps:
        return f"{fits}; {speed} ≥ {target_tps:g}; quality not predicted: measure it to judge it"
    return f"{fits}; {speed} against the target {target_tps:g}: too close to call, measure it"
