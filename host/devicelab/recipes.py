"""Recipes: YAML describing devices × models × quants × payloads, validated with pydantic."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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
    threads: list[int | str] = [1]              # counts, or auto: one thread per CPU of the mask
    # llama-bench -C affinity, one cell each: a hex mask, or big.LITTLE-aware names resolved per device
    # from its cpufreq clusters: prime (fastest cluster), big (all but the slowest), little, all
    cpu_masks: list[str | None] = [None]
    quota: list[Annotated[float, Field(gt=0)] | None] = [None]   # CPU quota in cores (0.5 = half a core), cgroup
    contention: list[Annotated[int, Field(ge=0)]] = [0]          # busy-looping co-runners
    repetitions: int = Field(default=3, ge=1)
    warmup: bool = True
    cache_type_k: str | None = None
    cache_type_v: str | None = None


    @field_validator("threads")
    @classmethod
    def _threads(cls, v: list[int | str]) -> list[int | str]:
        for t in v:
            if t != "auto" and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
                raise ValueError(f"thread count {t!r}: give an integer ≥ 1 or auto")
        return v

    @field_validator("cpu_masks")
    @classmethod
    def _masks(cls, v: list[str | None]) -> list[str | None]:
        import re

        from .facts import MASK_NAMES
        for m in v:
            if m is not None and m not in MASK_NAMES and not re.fullmatch(r"0x[0-9a-fA-F]+", m):
                raise ValueError(f"cpu mask {m!r}: give a hex mask (0xf0) or prime | big | little | all")
        return v


class KLDSpec(_Strict):
    kind: Literal["kld"]
    text: str = DEFAULT_TEXT
    ctx: int = Field(default=128, ge=16)
    chunks: int = Field(default=8, ge=1)
    threads: int | None = Field(default=None, ge=1)
    host_check: bool | None = None    # also compare the device's logits with the host's for the same file
                                      # (default: on for every device that is not this machine)

    @model_validator(mode="after")
    def _enough_tokens(self) -> "KLDSpec":
        scored = (self.ctx - self.ctx // 2 - 1) * self.chunks    # llama-perplexity scores each chunk's 2nd half
        if scored < 100:
            raise ValueError(f"ctx {self.ctx} × chunks {self.chunks} scores {scored} tokens; llama-perplexity "
                             "prints KL-divergence statistics only over ≥ 100 (e.g. ctx: 128, chunks: 2)")
        return self


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
    """Task evals, three routes, each recorded with its rows:
    - 'device-mc': llama-perplexity --hellaswag/--winogrande/--multiple-choice on the device with a data
      file in llama.cpp's format (`task`, `data`, `tasks`);
    - 'server-generate': lm-eval generation tasks against llama-server on the device through a forwarded
      port, `slots` parallel slots (`include`, `lm_tasks`, `limit`, `chat`);
    - 'host-loglikelihood': lm-eval log-likelihood tasks in-process on the host through llama-cpp-python
      on the same GGUF file (`include`, `lm_tasks`, `limit`)."""
    kind: Literal["eval"]
    route: Literal["device-mc", "server-generate", "host-loglikelihood"] = "device-mc"
    task: Literal["hellaswag", "winogrande", "multiple-choice"] = "hellaswag"
    data: str | None = None
    tasks: int = Field(default=0, ge=0)           # 0 = all
    ctx: int = Field(default=512, ge=64)
    threads: int | None = Field(default=None, ge=1)
    include: str | None = None                    # folder of lm-eval task YAMLs (relative to the recipe)
    lm_tasks: list[str] = []
    limit: int | None = Field(default=None, ge=1)  # lm-eval --limit: first N documents per task
    slots: int = Field(default=1, ge=1, le=64)     # llama-server --parallel = lm-eval num_concurrent
    chat: bool = False                             # local-chat-completions (the model's chat template)

    @model_validator(mode="after")
    def _route_fields(self) -> "EvalSpec":
        if self.route == "device-mc":
            if not self.data:
                raise ValueError("route device-mc needs `data:` (a task file in llama.cpp's format)")
            if self.lm_tasks or self.include:
                raise ValueError("`lm_tasks`/`include` are for the lm-eval routes (server-generate, "
                                 "host-loglikelihood); route device-mc takes `task` and `data`")
        else:
            if not self.lm_tasks:
                raise ValueError(f"route {self.route} needs `lm_tasks:` (lm-eval task names)")
            if self.data:
                raise ValueError(f"`data` is for route device-mc; route {self.route} reads lm-eval task YAMLs "
                                 "from `include:`")
            if self.route == "host-loglikelihood" and (self.slots != 1 or self.chat):
                raise ValueError("`slots` and `chat` are llama-server settings (route server-generate)")
        return self

    def cell_params(self) -> dict:
        """What identifies a cell of this payload (only its route's fields: adding a field to another
        route never changes the cell ids of a recorded run)."""
        if self.route == "device-mc":
            keep = ("route", "task", "data", "tasks", "ctx", "threads")
        elif self.route == "server-generate":
            keep = ("route", "include", "lm_tasks", "limit", "ctx", "threads", "slots", "chat")
        else:
            keep = ("route", "include", "lm_tasks", "limit", "ctx", "threads")
        return {k: getattr(self, k) for k in keep}


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
    _check_eval_routes(r, path)
    return r, hashlib.sha256(path.read_bytes()).hexdigest()


def resolve_include(spec: str, recipe_dir: Path) -> Path:
    """An lm-eval task folder named in a recipe: relative paths are relative to the recipe's folder."""
    p = Path(spec).expanduser()
    return p if p.is_absolute() else Path(recipe_dir) / p


def _check_eval_routes(r: Recipe, path: Path) -> None:
    """Refuse, before anything runs, an lm-eval task on a route that cannot score it honestly."""
    from .errors import DevicelabError
    from .payloads import lmeval
    for i, p in enumerate(r.payloads):
        if not isinstance(p, EvalSpec) or p.route == "device-mc":
            continue
        types: dict = {}
        if p.include:
            inc = resolve_include(p.include, path.resolve().parent)
            if not inc.is_dir():
                raise DevicelabError(f"{path}: payloads.{i}.include: {inc} is not a folder; give the folder of "
                                     "the lm-eval task YAMLs, relative to the recipe")
            types = lmeval.declared_output_types(inc)
        if any(t not in types for t in p.lm_tasks):     # lm-eval's own tasks (hellaswag, gsm8k, …)
            types.update(lmeval.builtin_output_types(t for t in p.lm_tasks if t not in types))
        try:
            lmeval.check_tasks(p.route, p.lm_tasks, types)
        except DevicelabError as e:
            raise DevicelabError(f"{path}: payloads.{i}: {e}") from None
