"""Recipes: YAML describing devices × models × quants × payloads, validated with pydantic."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .build.source import DEFAULT_SOURCE
from .models.ladder import DEFAULT_LADDER, check_quant
from .models.store import DEFAULT_MODEL
from .validation import load_yaml, one_line

DEFAULT_TEXT = "llama.cpp:docs/build.md"   # ships with the pinned llama.cpp source: on every machine


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    source: str = DEFAULT_MODEL


class BenchSpec(_Strict):
    kind: Literal["bench"]
    prompt: list[Annotated[int, Field(ge=0)]] = [64]
    gen: list[Annotated[int, Field(ge=0)]] = [32]
    pg: list[tuple[int, int]] = []
    depth: list[Annotated[int, Field(ge=0)]] = [0]
    threads: list[Annotated[int, Field(ge=1)]] = [1]
    cpu_masks: list[str | None] = [None]        # llama-bench -C hex masks (affinity), one cell each
    quota: list[Annotated[float, Field(gt=0)] | None] = [None]   # CPU quota in cores (0.5 = half a core), cgroup
    contention: list[Annotated[int, Field(ge=0)]] = [0]          # busy-looping co-runners
    repetitions: int = Field(default=3, ge=1)
    warmup: bool = True
    cache_type_k: str | None = None
    cache_type_v: str | None = None


class KLDSpec(_Strict):
    kind: Literal["kld"]
    text: str = DEFAULT_TEXT
    ctx: int = Field(default=128, ge=16)
    chunks: int = Field(default=8, ge=1)
    threads: int | None = Field(default=None, ge=1)
    host_check: bool | None = None    # also compare the device's logits with the host's for the same file
                                      # (default: on for every device that is not this machine)


class MembwSpec(_Strict):
    """Roofline payload: streaming-read bandwidth and an FMA compute peak (device_payloads/membw.c)."""
    kind: Literal["membw"]
    mib: int = Field(default=512, ge=16)
    threads: int | None = Field(default=None, ge=1)
    repetitions: int = Field(default=5, ge=1)


class BatchedSpec(_Strict):
    """Parallel streams: aggregate throughput at several concurrent sequences (llama-batched-bench)."""
    kind: Literal["batched"]
    prompt: int = Field(default=64, ge=1)
    gen: int = Field(default=32, ge=1)
    parallel: list[Annotated[int, Field(ge=1)]] = [1, 2, 4, 8]
    threads: int | None = Field(default=None, ge=1)
    cache_type_k: str | None = None
    cache_type_v: str | None = None


class EvalSpec(_Strict):
    """Task evals. route 'device-mc': llama-perplexity --hellaswag/--winogrande/--multiple-choice on the
    device with a data file in llama.cpp's format."""
    kind: Literal["eval"]
    route: Literal["device-mc", "server-generate", "host-loglikelihood"] = "device-mc"
    task: Literal["hellaswag", "winogrande", "multiple-choice"] = "hellaswag"
    data: str
    tasks: int = Field(default=0, ge=0)           # 0 = all
    ctx: int = Field(default=512, ge=64)
    threads: int | None = Field(default=None, ge=1)

    @field_validator("route")
    @classmethod
    def _route(cls, v: str) -> str:
        if v != "device-mc":
            raise ValueError(f"route {v!r} is not available in this version; use route: device-mc")
        return v


Payload = Annotated[Union[BenchSpec, KLDSpec, MembwSpec, BatchedSpec, EvalSpec], Field(discriminator="kind")]


class RecommendSpec(_Strict):
    context: int = Field(default=2048, ge=1)
    max_kld_mean: float = Field(default=0.10, gt=0)
    max_ppl_ratio: float = Field(default=1.10, gt=0)
    min_decode_tps: float = Field(default=0.0, ge=0)
    max_energy_per_token: float | None = Field(default=None, gt=0)
    ram_fraction: float = Field(default=0.75, gt=0, le=1)
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = "f16"   # KV sizing at `context` (llama.cpp -ctk/-ctv)
    max_devhost_kld: float = Field(default=0.01, gt=0)   # device vs host logits for the same file
    min_accuracy: float | None = Field(default=None, ge=0, le=1)
    prefer: Literal["smallest", "fastest", "best_quality"] = "smallest"


class TelemetrySpec(_Strict):
    interval_ms: int = Field(default=100, ge=10, le=10000)
    cooldown_delta_c: float = Field(default=3.0, gt=0)
    cooldown_timeout_s: float = Field(default=120.0, ge=0)


class Recipe(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    source: str = DEFAULT_SOURCE
    devices: list[str] = ["local"]
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec(name="smollm2-135m")], min_length=1)
    quants: list[str] = Field(default_factory=lambda: list(DEFAULT_LADDER), min_length=1)
    payloads: list[Payload] = Field(min_length=1)
    recommend: RecommendSpec = RecommendSpec()
    telemetry: TelemetrySpec = TelemetrySpec()

    @field_validator("quants")
    @classmethod
    def _quants(cls, v: list[str]) -> list[str]:
        out = []
        for q in v:
            try:
                out.append(check_quant(q))
            except Exception as e:  # DevicelabError → pydantic message
                raise ValueError(str(e)) from None
        if len(set(out)) != len(out):
            raise ValueError("a quant is listed twice")
        return out


def load(path: Path) -> tuple[Recipe, str]:
    """Return the validated recipe and the sha256 of its file."""
    path = Path(path)
    data = load_yaml(path, "recipe")
    try:
        r = Recipe.model_validate(data)
    except ValidationError as e:
        raise one_line(path, e) from e
    return r, hashlib.sha256(path.read_bytes()).hexdigest()
