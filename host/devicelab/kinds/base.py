"""The payload-kind contract and its registry.

A kind is one unit: its recipe spec (a pydantic model with `kind: Literal[...]`), the llama.cpp tools it
needs on the device, where it runs (on the device, served on the device and driven from the host, or on the
host), its command lines, and a *pure* parser from a cell's pulled artifacts to rows. The runner, the plan,
the report and the recommendation name no kind: they ask the registry (lm-evaluation-harness's Task and
its registry are the model: requests built, run elsewhere, results processed)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from ..errors import DevicelabError
from ..schema import Row

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from ..telemetry.normalize import Phase

DEVICE, SERVED, HOST = "device", "served", "host"


class Spec(BaseModel):
    """Base of every kind's recipe spec: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


class CellParams(BaseModel):
    """One cell's parameters, typed: a point of its kind's sweep, as `Kind.variants` made the dict the plan stores
    (and the cell id hashes). A kind reads its cells through `Kind.typed`, never the dict's strings. Keys a newer
    or older devicelab wrote into a stored cell are passed over."""

    model_config = ConfigDict(extra="ignore", frozen=True)


C = TypeVar("C", bound=CellParams)


# llama.cpp's KV cache types (-ctk/-ctv): a misspelt one is refused when the recipe loads, not on the device
KVType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


class SkipCell(Exception):
    """This device cannot run this cell (a reason, not an error): recorded as skipped."""


@dataclass
class RunOutput:
    """One payload run's pulled artifacts, as text: stdout lines prefixed with their arrival time on the
    device clock (run_payload.sh), stderr, and the run's [start, end] on that clock."""

    stdout: str = ""
    stderr: str = ""
    window: tuple[float, float] | None = None
    argv: list = field(default_factory=list)  # the command line it ran (argv.json)


@dataclass
class Artifacts:
    """Everything a parser may read: plain data, no files, no device."""

    params: dict
    runs: dict[str, RunOutput] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # JSON documents the cell stored (served.json, host.json)
    facts: dict = field(default_factory=dict)

    @property
    def main(self) -> RunOutput:
        return self.runs.get("main", RunOutput())


@dataclass
class Parsed:
    rows: list[Row]
    phases: list[Phase] = field(default_factory=list)
    context: dict = field(default_factory=dict)  # row columns only the output can tell


@dataclass
class Prepared:
    """What a device cell runs: named command lines ('main' first), their environment, the conditions
    it asks for (CPU quota in cores, busy co-runners) and provenance resolved while preparing."""

    runs: list[tuple[str, list[str]]]
    env: dict[str, str] = field(default_factory=dict)
    quota: float | None = None
    contention: int = 0
    provenance: dict = field(default_factory=dict)


class Kind(Generic[C]):
    """Override what differs; the defaults describe a per-model payload that runs on the device."""

    name: ClassVar[str]
    spec: ClassVar[type[Spec]]
    cell: type[C]  # its cells' parameters, typed
    per_model: ClassVar[bool] = True  # False: once per device (a property of the device, not a model)
    # the row columns that make two of its rows comparable (compare-llama-bench's KEY_PROPERTIES): `compare` pairs
    # rows equal on all of them except what is being compared
    key_properties: ClassVar[tuple[str, ...]] = (
        "device",
        "model",
        "quant",
        "backend",
        "n_gpu_layers",
        "test",
        "phase",
        "metric",
    )
    # those of them that say what was measured (a test's shape, its phase, the metric), not a choice a user compares
    # on one device: a precision target (precision.py) pairs rows on them, never across them
    shape_properties: ClassVar[tuple[str, ...]] = ("test", "phase", "metric")

    def typed(self, params: dict) -> C:
        """A cell's stored parameters as this kind's typed CellParams."""
        return self.cell.model_validate(params)

    def where(self, params: dict) -> str:
        return DEVICE

    def tools(self, params: dict) -> tuple[str, ...]:
        """llama.cpp tools the device's build must hold for this cell."""
        return ()

    def variants(self, spec: Spec) -> list[dict]:
        """The cells' params for one recipe payload (one per point of its sweep)."""
        return [spec.model_dump(exclude={"kind"})]

    def label(self, params: dict) -> str:
        return ""

    def check(self, spec: Spec, recipe_dir: Path) -> None:
        """Checks that need the file system, when the recipe loads (raise DevicelabError)."""

    def provenance(self, params: dict) -> dict:
        """Row columns that the cell's params give."""
        return {}

    def prepare(self, cx, cell) -> Prepared:  # device and served kinds
        raise NotImplementedError

    def drive(self, cx, cell, url: str) -> dict:  # served kinds: the host side, against the forwarded port
        raise NotImplementedError

    def on_host(self, cx, cell) -> dict:  # host kinds: the whole cell, on the host
        raise NotImplementedError

    def parse(self, a: Artifacts) -> Parsed:
        raise NotImplementedError

    def complete(self, run: str, out: RunOutput) -> bool:
        """Whether a run that exited 0 printed all its results. llama.cpp's tools log through a worker thread
        that the process does not wait for at exit (upstream issue 22142, in the pinned source): a fast run's
        last lines can be lost. A kind whose results are in those lines says so here, and the cell runs it
        again (a bounded number of times, recorded in the row's provenance)."""
        return True


REGISTRY: dict[str, Kind[Any]] = {}

# ---- the host-operation channel ----
# A kind's host work (base logits, a host eval, a payload built for the device's target…) is a named operation
# it registers here: `cx.host_op(NAME, *args)` asks for it; the run's shared host work makes it once per
# (name, args) on the host that holds that work (a cluster's head), under the host-CPU rule — the operation
# takes `host.cpu.work(label)` around what it computes. Its result comes back as what `result` says: a FILE
# (handed to other lab hosts by content hash), a TREE (a folder of small files, likewise) or JSON-able DATA.
# Nothing outside kinds/ names an operation.
FILE, TREE, DATA = "file", "tree", "data"


@dataclass(frozen=True)
class HostOp:
    name: str
    make: Callable[..., Any]  # make(host, *args): host is the run's HostWork (runner/host.py)
    result: str = DATA
    mode: int | None = None  # a FILE's mode where it lands (0o755: a program)


HOST_OPS: dict[str, HostOp] = {}


def host_op(name: str, result: str = DATA, mode: int | None = None):
    """Register `make(host, *args)` as the host operation `name`."""

    def deco(make):
        HOST_OPS[name] = HostOp(name, make, result, mode)
        return make

    return deco


def get_op(name: str) -> HostOp:
    try:
        return HOST_OPS[name]
    except KeyError:
        raise DevicelabError(f"unknown host operation {name!r}; available: {', '.join(sorted(HOST_OPS))}") from None


TEXT = "text"


@host_op(TEXT, FILE)
def _text(host, spec: str, what: str = "perplexity text"):
    """A text file a recipe names (relative to the recipe, or `llama.cpp:PATH` in the run's source)."""
    return host.resolve_text(spec, what)


def register(cls: type[Kind[Any]]) -> type[Kind[Any]]:
    REGISTRY[cls.name] = cls()
    return cls


def get(name: str) -> Kind[Any]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise DevicelabError(f"unknown payload kind {name!r}; available: {', '.join(sorted(REGISTRY))}") from None


def digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def timed_lines(stdout_tsv: str) -> list[tuple[float | None, str]]:
    """run_payload.sh's stdout.tsv ('time<TAB>line') or plain text, as (time, line)."""
    out: list[tuple[float | None, str]] = []
    for line in stdout_tsv.splitlines():
        t, sep, payload = line.partition("\t")
        if not sep:
            out.append((None, line))
            continue
        try:
            out.append((float(t), payload))
        except ValueError:
            out.append((None, line))
    return out


def plain(stdout_tsv: str) -> str:
    return "\n".join(line for _, line in timed_lines(stdout_tsv))


_GPU_LINES = (
    re.compile(r"ggml_vulkan: 0 = ([^|\n]+?)\s*(?:\||$)", re.M),  # Vulkan
    re.compile(r"^\S*\s*\S*\s*Device 0: ([^,\n]+)", re.M),  # CUDA (ggml_cuda_init)
    re.compile(r"using device \S+ \((.+?)\) (?:\(|-)"),
)  # any, at model load
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def log_safe_threads(facts: dict) -> int:
    """Threads for a payload whose results are its log lines (llama-perplexity's KLD and task scores, not a
    speed): one CPU left to llama.cpp's log thread, which the process does not wait for at exit (upstream
    issue 22142) and which a payload on every CPU starves until its last lines are lost."""
    n = facts.get("cpu_count") or 1
    return max(1, n - 1)


def gpu_from_log(text: str) -> dict:
    """A llama.cpp tool's own log lines about its GPU: the first device's name (ggml_vulkan: 0 = llvmpipe …,
    ggml_cuda_init: Device 0: NVIDIA H200 …) and 'offloaded N/M layers to GPU'. Empty on a CPU-only build."""
    out: dict = {}
    for pat in _GPU_LINES:
        m = pat.search(text)
        if m:
            out["gpu_device"] = m.group(1).strip()
            break
    m = _OFFLOADED.search(text)
    if m:
        out["n_gpu_layers"] = int(m.group(1))
    return out
