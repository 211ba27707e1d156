"""Recipes: YAML describing devices × models × quants × payloads, validated with pydantic."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import kinds
from .build.backends import Backend
from .build.source import DEFAULT_SOURCE
from .kinds.kld import DEFAULT_TEXT
from .models.ladder import DEFAULT_LADDER, check_quant
from .models.store import DEFAULT_MODEL
from .recipe_paths import resolve_include  # noqa: F401  (re-exported)
from .validation import load_yaml, one_line


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImatrixSpec(_Strict):
    """An importance matrix made once per base on the host (llama-imatrix), cached by base and text; the
    model's ladder is quantized with it, which makes the i-quants possible."""

    text: str = DEFAULT_TEXT  # calibration text: a path (relative to the recipe) or the KLD default
    chunks: int = Field(default=16, ge=1)
    ctx: int = Field(default=512, ge=16)


class ModelSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    source: str = DEFAULT_MODEL
    imatrix: ImatrixSpec | None = None
    # a fine-tune: a PEFT LoRA adapter (a folder or hf:ORG/REPO) on this checkpoint, merged before quantizing
    lora: str | None = None

    @field_validator("source", "lora")
    @classmethod
    def _hf(cls, v: str | None) -> str | None:
        if v and v.startswith("hf:"):
            from .models.hub import parse

            try:
                parse(v)
            except Exception as e:  # DevicelabError → pydantic message
                raise ValueError(str(e)) from None
        return v


# the payload union is built from the kinds' registry: a new kind is one file in kinds/
if TYPE_CHECKING:  # to a type checker, any kind's spec: a Spec with its kind's name (each a `kind: Literal[...]`)
    from .kinds.base import Spec

    class Payload(Spec):
        kind: str

else:
    Payload = Annotated[Union[tuple(k.spec for k in kinds.REGISTRY.values())], Field(discriminator="kind")]


class RecommendSpec(_Strict):
    context: int = Field(default=2048, ge=1)
    max_kld_mean: float = Field(default=0.10, gt=0)
    max_ppl_ratio: float = Field(default=1.10, gt=0)
    min_decode_tps: float = Field(default=0.0, ge=0)
    max_energy_per_token: float | None = Field(default=None, gt=0)
    # laptops and servers in the minimum-RAM table, and a device that reports no available memory
    ram_fraction: float = Field(default=0.75, gt=0, le=1)
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = "f16"  # KV sizing at `context` (llama.cpp -ctk/-ctv)
    max_devhost_kld: float = Field(default=0.01, gt=0)  # device vs host logits for the same file
    min_accuracy: float | None = Field(default=None, ge=0, le=1)
    # "within 2 points of the unquantized model on your own eval": per task, against the model's f16/bf16/f32
    # file on the same task and device (accuracy points, 0–100)
    max_accuracy_drop: float | None = Field(default=None, ge=0, le=100)
    # the prompt whose energy is reported (Wh per prompt, battery share per 1,000 prompts): its prompt and
    # generated tokens; unset, the largest prompt and generation the lab measured
    prompt_tokens: int | None = Field(default=None, ge=1)
    gen_tokens: int | None = Field(default=None, ge=1)
    prefer: Literal["smallest", "fastest", "best_quality"] = "smallest"
    # the decode speed held to min_decode_tps: a bench's, or a soak run's last quarter (kind: soak)
    speed: Literal["burst", "sustained"] = "burst"

    @property
    def decode_label(self) -> str:
        """The decode speed min_decode_tps holds, in words."""
        return "sustained decode" if self.speed == "sustained" else "decode"


class TelemetrySpec(_Strict):
    interval_ms: int = Field(default=100, ge=10, le=10000)
    cooldown_delta_c: float = Field(default=3.0, gt=0)
    cooldown_timeout_s: float = Field(default=120.0, ge=0)


AUTO_MIN_ROUNDS = 3  # a paired interval over fewer rounds is too wide to judge (Student's t with 1 df: 12.7)
DEFAULT_PRECISION, DEFAULT_MAX_ROUNDS = 0.02, 30


class Recipe(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    source: str = DEFAULT_SOURCE
    devices: list[str] = ["local"]
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec(name="smollm2-135m")], min_length=1)
    quants: list[str] = Field(default_factory=lambda: list(DEFAULT_LADDER), min_length=1)
    payloads: list[Payload] = Field(min_length=1)
    recommend: RecommendSpec = RecommendSpec()
    telemetry: TelemetrySpec = TelemetrySpec()
    # GPU backends as a measured axis: each device's cells once per backend (a backend a device cannot have is
    # a skipped cell with the reason); unset, each device's default build (cpu; metal on a Mac)
    backends: list[Backend] | None = Field(default=None, min_length=1)
    # llama.cpp as a swept axis: several sources (pypi:llama-cpp-python==X, a checkout, git:PATH@REV), each its
    # own build and its own cells (cell ids carry the commit); run one after the other on every device
    sources: list[str] | None = Field(default=None, min_length=1)
    # every cell measured `rounds` times, round after round; within a round each device's cells (and the sources of
    # a sweep) in a random order drawn from `round_seed` (default: from the recipe's name), so a load spike or a
    # hotter chip lands on every side alike and `compare` can pair the sides round by round
    # `rounds: auto`: rounds until every ratio a user compares on one device (two quants, commits, backends, thread
    # counts… everything else equal; precision.py) has a 95 % interval no wider than ±`precision`, from
    # AUTO_MIN_ROUNDS up to `max_rounds` rounds or `max_minutes` minutes, whichever comes first
    rounds: Annotated[int, Field(ge=1, le=1000)] | Literal["auto"] | None = None
    round_seed: int | None = None
    precision: float | None = Field(default=None, gt=0, lt=1)
    max_rounds: int | None = Field(default=None, ge=AUTO_MIN_ROUNDS, le=1000)
    max_minutes: float | None = Field(default=None, gt=0)

    @field_validator("rounds", mode="before")
    @classmethod
    def _rounds(cls, v):
        if v is not None and v != "auto" and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1000):
            raise ValueError(f"{v!r}: give a number of rounds from 1 to 1000, or auto")
        return v

    @model_validator(mode="after")
    def _auto_rounds(self):
        given = [k for k in ("precision", "max_rounds", "max_minutes") if getattr(self, k) is not None]
        if given and self.rounds != "auto":
            raise ValueError(f"{given[0]}: goes with rounds: auto (the lab adds rounds until the intervals meet it)")
        if self.rounds == "auto":
            self.precision = self.precision or DEFAULT_PRECISION
            self.max_rounds = self.max_rounds or DEFAULT_MAX_ROUNDS
        return self

    @model_validator(mode="after")
    def _one_source_key(self):
        if self.sources is not None and "source" in self.model_fields_set:
            raise ValueError("give source: (one llama.cpp) or sources: (a sweep), not both")
        if self.sources is not None and len(set(self.sources)) != len(self.sources):
            raise ValueError("sources: a source is listed twice")
        return self

    def source_specs(self) -> list[str]:
        """The llama.cpp sources the recipe runs, in order."""
        return list(self.sources or [self.source])

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
    _check_kinds(r, path)
    _check_imatrix(r, path)
    return r, hashlib.sha256(path.read_bytes()).hexdigest()


def _check_imatrix(r: Recipe, path: Path) -> None:
    """i-quants are made with an importance matrix: asked for without one, refused here, before anything runs."""
    from .errors import DevicelabError
    from .models.ladder import NEEDS_IMATRIX

    iq = [q for q in r.quants if q in NEEDS_IMATRIX]
    bare = [m.name for m in r.models if m.imatrix is None]
    if iq and bare:
        raise DevicelabError(
            f"{path}: quants {', '.join(iq)} need an importance matrix, and model {bare[0]} has "
            "none: give it `imatrix: {text: CALIBRATION.txt}` (or drop the i-quants)"
        )
    for i, m in enumerate(r.models):
        if m.imatrix is not None and m.imatrix.text != DEFAULT_TEXT:
            t = Path(m.imatrix.text).expanduser()
            t = t if t.is_absolute() else path.resolve().parent / t
            if not t.is_file():
                raise DevicelabError(
                    f"{path}: models.{i}.imatrix.text: {t} does not exist; give a calibration text file"
                )


def _check_kinds(r: Recipe, path: Path) -> None:
    """Each kind's own checks that need the file system (data files, task folders, eval routes), before
    anything runs."""
    from .errors import DevicelabError

    for i, p in enumerate(r.payloads):
        try:
            kinds.get(p.kind).check(p, path.resolve().parent)
        except DevicelabError as e:
            raise DevicelabError(f"{path}: payloads.{i}: {e}") from None
