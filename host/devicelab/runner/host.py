"""Host-side shared work, done once per key however many lanes ask at once: the llama.cpp builds made
here, model files, quant ladders, and the kinds' own host operations (kinds/base.py: base logits, host
evals, …). And the host's own
CPUs as a resource: a device that measures on them (this machine) measures alone, while other lanes'
host-side steps wait; every cell records what else the lab ran on the host during it."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import kinds, paths, recipe_paths
from ..build import cache as buildcache
from ..build import library, targets
from ..build import source as sourcemod
from ..errors import DevicelabError
from ..models import convert, gguf_info, store
from ..models.ladder import Ladder, QuantFile


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU-seconds the whole machine has been busy, steal included — time a VM's neighbours took —, CPU-seconds
    of this process and its reaped children): /proc/stat's first line and getrusage. None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    usage = (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    own = sum(u.ru_utime + u.ru_stime for u in usage)
    return (sum(v) - idle) / hz, own


@dataclass
class Measurement:
    """What a measurement on this host's CPUs learns of the host beside it: `others_cpus`, the CPUs other
    processes kept busy on average while it ran (whatever the lab did not start: another user's job, a
    leftover process, a VM neighbour's steal), None where the host cannot tell."""

    others_cpus: float | None = None


@contextmanager
def measured():
    """A Measurement of the host beside this process (and its children) while the block runs."""
    m, t0, c0 = Measurement(), time.monotonic(), cpu_seconds()
    try:
        yield m
    finally:
        c1, wall = cpu_seconds(), time.monotonic() - t0
        if c0 is not None and c1 is not None and wall > 0:
            m.others_cpus = round(max(0.0, (c1[0] - c0[0]) - (c1[1] - c0[1])) / wall, 3)


@dataclass
class _Use:
    """One use of the host's CPUs, logged: what, and when it began and ended (None: still going), host time."""

    label: str
    start: float
    end: float | None = None


class HostCPUs:
    """Readers/writer lock over this machine's CPUs. `measure(who)`: a device that measures on these CPUs
    runs its payload alone. `work(label)`: a host-side step (build, quantize, base logits, host eval) —
    several may run together, never while a measurement holds the CPUs. Every use is logged, so a cell can
    say what else ran on the host during it.

    The rule holds between processes too (two runs in two terminals, the lanes of a lab host that are each their
    own process): once granted here, a measurement takes an exclusive flock on the home's `locks/host-cpus.lock`
    and host work a shared one, released by the kernel when a process dies. A use that has to wait for another
    process says so through `note`, naming it."""

    def __init__(self, note: Callable[[str], None] | None = None) -> None:
        self._note = note
        self._cancel = threading.Event()
        self._cv = threading.Condition()
        self._measuring: str | None = None
        self._workers = 0
        self._waiting_measures = 0
        self._log: list[_Use] = []

    def _enter(self, label: str) -> _Use:
        entry = _Use(label, time.time())
        self._log.append(entry)
        return entry

    @contextmanager
    def measure(self, who: str):
        """Measure alone on these CPUs; yields a Measurement filled in when the block ends."""
        with self._cv:
            self._waiting_measures += 1
            self._cv.wait_for(lambda: self._measuring is None and self._workers == 0)
            self._waiting_measures -= 1
            self._measuring = who
            entry = self._enter(who)
        try:
            with self._machine(True, who), measured() as m:
                yield m
        finally:
            with self._cv:
                entry.end = time.time()
                self._measuring = None
                self._cv.notify_all()

    @contextmanager
    def work(self, label: str):
        with self._cv:
            self._cv.wait_for(lambda: self._measuring is None and self._waiting_measures == 0)
            self._workers += 1
            entry = self._enter(label)
        try:
            with self._machine(False, label):
                yield
        finally:
            with self._cv:
                entry.end = time.time()
                self._workers -= 1
                self._cv.notify_all()

    @contextmanager
    def _machine(self, exclusive: bool, label: str):
        """This machine's CPUs between processes: exclusive to measure, shared for host work. Host work that
        waits goes before the next measurement (it holds `host-cpus.wanted` while it waits, and a measurement
        first waits for that to be free): a run measuring cell after cell would otherwise starve another run's
        bounded host work, whose cells wait on it."""
        import fcntl

        locks = paths.sub("locks")
        with open(locks / "host-cpus.lock", "a") as fh, open(locks / "host-cpus.wanted", "a") as want:
            if exclusive:  # another process's host work that waits goes first
                paths.flock(want, fcntl.LOCK_EX, self._cancel, "another run's host work")
                fcntl.flock(want, fcntl.LOCK_UN)
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            try:
                fcntl.flock(fh, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if self._note:
                    who = ", ".join(paths.describe_pid(p) for p in paths.lock_holders(fh)) or "another process"
                    use = "is using them" if exclusive else "measures on them"
                    self._note(f"{label}: waiting for this host's CPUs, which {who} {use}")
                if not exclusive:
                    paths.flock(want, fcntl.LOCK_SH, self._cancel, "this host's CPUs")
                paths.flock(fh, mode, self._cancel, "this host's CPUs")
                fcntl.flock(want, fcntl.LOCK_UN)
            yield

    def cancel(self) -> None:
        """The run is stopping: a wait for another process's use of the CPUs ends (RetryableError)."""
        self._cancel.set()

    @contextmanager
    def activity(self, label: str):
        """Log something that uses the host without excluding a measurement (a remote lane's payload run:
        the host only relays it)."""
        with self._cv:
            entry = self._enter(label)
        try:
            yield
        finally:
            with self._cv:
                entry.end = time.time()

    def spans(self, label: str) -> list[tuple[float, float]]:
        """(start, end) of every finished use logged under `label`."""
        with self._cv:
            return [(u.start, u.end) for u in self._log if u.label == label and u.end is not None]

    def during(self, start: float, end: float, exclude: str = "") -> list[str]:
        with self._cv:
            out = {
                u.label for u in self._log if u.start < end and (u.end is None or u.end > start) and u.label != exclude
            }
        return sorted(out)


class HostWork:
    """What every lane shares; thread-safe, each piece made once per key."""

    def __init__(
        self,
        source_spec: str | None,
        models: dict[str, str],
        recipe_dir: Path,
        events,
        jobs=None,
        imatrix: dict | None = None,
        lora: dict | None = None,
    ):
        self.source_spec, self.model_specs, self.recipe_dir = source_spec, models, recipe_dir
        self.imatrix_specs = imatrix or {}  # model -> recipes.ImatrixSpec
        self.lora_specs = lora or {}  # model -> a LoRA adapter source
        self.ev, self.jobs = events, jobs
        self.cpu = HostCPUs(note=events.stage)
        self._locks: dict = {}
        self._done: dict = {}
        self._guard = threading.Lock()
        self._src: sourcemod.SourceTree | None = None

    # ---- once per key ----
    def _lock(self, key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def once(self, key, make):
        with self._lock(key):
            if key not in self._done:
                self._done[key] = make()
            return self._done[key]

    # ---- source and models ----
    @property
    def src(self) -> sourcemod.SourceTree:
        return self.once("source", lambda: sourcemod.resolve(self.source_spec))

    def model_source(self, name: str) -> store.ModelSource:
        def make():
            with self.cpu.work(f"model {name}"):  # a conversion or a download: host work
                ms = store.resolve_model(self.model_specs[name], self.src, progress=self.ev.progress)
            lora = self.lora_specs.get(name)
            if not lora:
                return ms
            if ms.checkpoint is None:
                raise DevicelabError(
                    f"model {name}: a LoRA adapter goes on a safetensors checkpoint (a Hugging Face "
                    "folder or an hf: repo of one), not on a GGUF file"
                )
            folder, prov = store.resolve_adapter(lora)
            # its tool first: a build is host work of its own, not inside this
            export_lora = self.host_build("llama-export-lora").tool("llama-export-lora")
            with self.cpu.work(f"LoRA into {name}"):
                self.ev.stage(f"merging the LoRA adapter {folder.name} into {name}")
                merged = convert.merge_lora(ms.path, convert.lora_to_gguf(folder, ms.checkpoint, self.src), export_lora)
            return store.ModelSource(merged, {**ms.provenance, "lora": prov}, ms.checkpoint)

        return self.once(("model", name), make)

    def model_path(self, name: str) -> Path:
        return self.model_source(name).path

    def model_sha(self, name: str) -> str:
        return self.once(("model-sha", name), lambda: gguf_info.content_sha256(self.model_path(name)))

    def resolve_text(self, spec: str, what: str = "perplexity text") -> Path:
        return recipe_paths.resolve_text(spec, self.src, self.recipe_dir, what)

    # ---- builds made here ----
    def build(self, tgt: targets.Target) -> buildcache.Build:
        def make():
            hit = buildcache.find(self.src, tgt)  # a cached build is no work: no waiting for the CPUs
            if hit:
                return hit
            self.ev.stage(f"llama.cpp build for {tgt.name}")
            with self.cpu.work(f"build {tgt.name}"):
                return buildcache.ensure(self.src, tgt, jobs=self.jobs, progress=self.ev.build_progress)

        return self.once(("build", tgt.name, json.dumps(tgt.cmake_flags(), sort_keys=True), tgt.tools), make)

    def host_build(self, *tools: str) -> buildcache.Build:
        """This host's build holding `tools` (its target's whole list when none is named): a run builds the host
        tools it uses, and a later run adds what it needs to the same build."""
        tgt = targets.local_native()
        return self.build(dataclasses.replace(tgt, tools=tools) if tools else tgt)

    def eval_library(self) -> library.Library | None:
        """The libllama.so llama-cpp-python calls for host evals: the host build's own, linked from its objects
        (build/library.py), where this lab's llama.cpp is the one the bindings vendor; elsewhere
        llama-cpp-python's own library (None), or one line saying neither can serve."""

        def make():
            if library.bindings_version() is None:
                raise DevicelabError("route host-loglikelihood needs llama-cpp-python: pip install 'devicelab[evals]'")
            why = library.mismatch(self.src)
            if why is None:
                b = self.host_build("llama-quantize")  # the archives a ladder's quantizing makes anyway
                with self.cpu.work(f"link {library.NAME}"):
                    return library.ensure(b)
            if library.own() is None:
                raise DevicelabError(
                    f"route host-loglikelihood: {why}, and {library.BINDINGS} has no library of its own (installed "
                    f"with -DLLAMA_BUILD=OFF): run with the default source, or reinstall {library.BINDINGS} with "
                    "its own library"
                )
            return None

        return self.once(("eval-library",), make)

    # ---- ladders ----
    def ladder(self, model: str) -> Ladder:
        def make():
            # the host build is made when a file has to be quantized (a ladder already made needs none): its key
            # names it before it exists
            key, _ = buildcache.build_key(self.src, targets.local_native())

            def quantize() -> Path:
                return self.host_build("llama-quantize").tool("llama-quantize")

            return Ladder(model, self.model_path(model), quantize, {"quantized_with_build": key})

        return self.once(("ladder", model), make)

    def imatrix(self, model: str):
        """The model's importance matrix (once; None when the recipe gives it none)."""
        spec = self.imatrix_specs.get(model)
        if spec is None:
            return None
        lad = self.ladder(model)

        def make():
            text = self.resolve_text(spec.text, "imatrix calibration text")
            self.base(model)
            tool = self.host_build("llama-imatrix").tool("llama-imatrix")  # a build is host work of its own
            with self.cpu.work(f"imatrix {model}"):
                self.ev.stage(f"importance matrix of {model} ({spec.chunks} chunks of {spec.ctx} from {text.name})")
                return lad.imatrix(tool, text, spec.chunks, spec.ctx)

        return self.once(("imatrix", model), make)

    def quant(self, model: str, quant: str) -> QuantFile:
        lad = self.ladder(model)
        im = self.imatrix(model)

        def make():
            if lad.is_made(quant, im):
                return lad.quant(quant, imatrix=im)
            self.host_build("llama-quantize")  # a build is host work of its own, not inside this
            with self.cpu.work(f"quantize {model} {quant}"):
                return lad.quant(quant, imatrix=im)

        with self._lock(("ladder-ops", model)):  # base and quants of one model share files
            return self.once(("quant", model, quant), make)

    def base(self, model: str) -> QuantFile:
        lad = self.ladder(model)
        with self._lock(("ladder-ops", model)):

            def make():
                if lad.has_base():
                    return lad.base()
                self.host_build("llama-quantize")
                with self.cpu.work(f"F16 base of {model}"):
                    return lad.base()

            return self.once(("base", model), make)

    # ---- the kinds' own host work ----
    def op(self, name: str, *args: Any) -> Any:
        """A kind's host operation (kinds/base.py), made once per (name, args) here."""
        o = kinds.get_op(name)
        key = ("op", name, json.dumps(args, sort_keys=True, default=str))
        return self.once(key, lambda: o.make(self, *args))
