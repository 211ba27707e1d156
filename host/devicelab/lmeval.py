"""lm-eval task evals, the two routes that go through lm-eval (EleutherAI's lm-evaluation-harness).

- 'server-generate': generation tasks (GSM8K-style, HumanEval-style: output_type generate_until) against
  llama-server running *on the device*, reached through a port the transport forwards; lm-eval's
  `local-completions` / `local-chat-completions` clients, `num_concurrent` = the server's parallel slots.
- 'host-loglikelihood': log-likelihood tasks (HellaSwag, MMLU, ARC, TruthfulQA MC: output_type
  multiple_choice / loglikelihood) in-process on the host through llama-cpp-python on the same GGUF file.

The combination "log-likelihood task through llama-server" is refused: llama-server's completions return
no prompt logprobs, so lm-eval scores those tasks at chance there.

Offline by design: tasks are lm-eval YAML files in a folder the recipe names (`include`), with their data
as local files (`dataset_path: json`, `data_files` relative to that folder) or in the user's HF cache;
HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set unless the user set them.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import yaml

from .errors import DevicelabError
from .schema import Row, missing

if TYPE_CHECKING:
    from .build.library import Library

GENERATE = {"generate_until"}
LOGLIKELIHOOD = {"multiple_choice", "loglikelihood"}
ROLLING = {"loglikelihood_rolling"}


def _offline() -> None:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # devicelab's own progress is the one shown
    import logging

    for name in ("lm_eval", "lm-eval", "datasets"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _lm_eval():
    _offline()
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager  # noqa: F401
    except ImportError as e:
        raise DevicelabError(
            f"the lm-eval routes need lm-eval ({e.name} is missing): pip install 'devicelab[evals]'"
        ) from None
    return lm_eval


class _Loader(yaml.SafeLoader):
    """lm-eval YAMLs use `!function module.name` tags: read them as plain strings here."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)


def declared_output_types(include: Path) -> dict[str, str | None]:
    """task name → output_type for the task YAMLs in `include` (following `include:` for inherited
    defaults), without importing lm-eval: the recipe is checked before anything runs."""
    out: dict[str, str | None] = {}

    def read(p: Path, depth: int = 0) -> dict:
        try:
            d = yaml.load(p.read_text(), Loader=_Loader) or {}
        except (OSError, yaml.YAMLError):
            return {}
        if not isinstance(d, dict):
            return {}
        inc = d.get("include")
        if isinstance(inc, str) and depth < 5:
            base = read((p.parent / inc), depth + 1)
            d = {**base, **d}
        return d

    for p in sorted(include.rglob("*.y*ml")):
        d = read(p)
        names = d.get("task")
        for n in names if isinstance(names, list) else [names]:
            if isinstance(n, str):
                out[n] = d.get("output_type")
    return out


def builtin_output_types(tasks: Iterable[str]) -> dict[str, str | None]:
    """Output types of lm-eval's built-in tasks from its task index (YAML only: no dataset is loaded);
    {} when lm-eval is not installed (the run then says so)."""
    try:
        _lm_eval()
        from lm_eval.tasks import TaskManager
    except DevicelabError:
        return {}
    idx = TaskManager().task_index
    return {t: (getattr(idx.get(t), "cfg", None) or {}).get("output_type") for t in tasks if t in idx}


def route_problem(route: str, task: str, output_type: str | None) -> str | None:
    """Why `task` (of `output_type`) cannot be scored honestly on `route`; None when it can."""
    if output_type is None:
        return None
    if route == "server-generate" and output_type in LOGLIKELIHOOD | ROLLING:
        return (
            f"task {task} is {output_type} (log-likelihood): llama-server's completions return no prompt "
            "logprobs, so lm-eval through it scores such tasks at chance; use route: host-loglikelihood "
            "(llama-cpp-python on the host) or route: device-mc (llama-perplexity on the device)"
        )
    if route == "host-loglikelihood" and output_type in GENERATE:
        return (
            f"task {task} is a generation task (generate_until): use route: server-generate, which runs "
            "it against llama-server on the device"
        )
    if route == "host-loglikelihood" and output_type in ROLLING:
        return (
            f"task {task} is a rolling log-likelihood (perplexity) task: use the kld payload, which runs "
            "llama-perplexity on the device against host base logits"
        )
    return None


def check_tasks(route: str, tasks: Iterable[str], output_types: Mapping[str, str | None]) -> None:
    for t in tasks:
        why = route_problem(route, t, output_types.get(t))
        if why:
            raise DevicelabError(why)


@contextlib.contextmanager
def _in(folder: Path | None):
    """lm-eval hands `data_files` to `datasets` as given: relative paths are read from the task folder."""
    if folder is None:
        yield
        return
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


def _task_manager(include: Path | None, tasks: list[str]):
    from lm_eval.tasks import TaskManager

    own = declared_output_types(include) if include else {}
    # lm-eval's ~10k built-in task YAMLs are indexed only when a task is not one of the user's own
    tm = TaskManager(include_path=str(include) if include else None, include_defaults=not all(t in own for t in tasks))
    missing_tasks = [t for t in tasks if t not in tm.all_tasks]
    if missing_tasks:
        where = f" in {include}" if include else ""
        raise DevicelabError(
            f"lm-eval task(s) {', '.join(missing_tasks)} not found{where}; "
            "name tasks defined by the YAML files of `include:` or built into lm-eval"
        )
    return tm


def _loaded_output_types(tm, tasks: list[str]) -> dict[str, str]:
    """Output types as lm-eval itself resolves them: from its task index (no dataset is loaded), and for
    tasks whose type comes from an `include:` or a group, from the loaded task objects."""
    out: dict[str, str] = {}
    rest = []
    for t in tasks:
        e = tm.task_index.get(t) if hasattr(tm, "task_index") else None
        ot = (getattr(e, "cfg", None) or {}).get("output_type") if e is not None else None
        if ot:
            out[t] = ot
        else:
            rest.append(t)
    if rest:
        from lm_eval.tasks import get_task_dict

        def walk(d):
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(v)
                elif v is not None and hasattr(v, "OUTPUT_TYPE"):
                    name = getattr(v, "task_name", None) or getattr(v, "config", {}).get("task", str(k))
                    out[str(name)] = v.OUTPUT_TYPE

        try:
            walk(get_task_dict(rest, tm))
        except Exception as e:  # datasets' offline/missing errors: one line
            raise DevicelabError(
                f"lm-eval could not load {', '.join(rest)}: {type(e).__name__}: {str(e)[:200]} "
                "(offline: the dataset must be in your HF cache, or give local data_files)"
            ) from e
    return out


def evaluate(route: str, lm, tasks: list[str], include: Path | None, limit: int | None, seed: int = 1234) -> dict:
    """Run lm-eval on `lm` (a model name + args string, or an LM object) and return its results dict."""
    lm_eval = _lm_eval()
    with _in(include):
        tm = _task_manager(include, tasks)
        check_tasks(route, tasks, _loaded_output_types(tm, tasks))
        model, model_args = (lm, None) if not isinstance(lm, tuple) else lm
        try:
            res = lm_eval.simple_evaluate(
                model=model,
                model_args=model_args,
                tasks=tasks,
                task_manager=tm,
                limit=limit,
                log_samples=False,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
                bootstrap_iters=1000,
            )
        except DevicelabError:
            raise
        except Exception as e:  # lm-eval, datasets, the HTTP client: one line for the cell
            raise DevicelabError(
                f"lm-eval failed on {', '.join(tasks)} ({route}): {type(e).__name__}: {str(e).strip()[:240]}"
            ) from e
    if not res or not res.get("results"):
        raise DevicelabError("lm-eval returned no results (no task ran)")
    return res


def server_client(route_url: str, chat: bool, slots: int, model_name: str) -> tuple[str, str]:
    """lm-eval's OpenAI-compatible client against llama-server: no tokenizer (the server tokenizes)."""
    if chat:
        name, url = "local-chat-completions", f"{route_url}/v1/chat/completions"
    else:
        name, url = "local-completions", f"{route_url}/v1/completions"
    args = {
        "base_url": url,
        "model": model_name,
        "tokenizer_backend": None,
        "tokenized_requests": False,
        "num_concurrent": slots,
        "max_retries": 2,
        "timeout": 600,
    }
    return name, ",".join(f"{k}={v}" for k, v in args.items())


def _primary(cfg: dict) -> tuple[str, str]:
    """(metric, filter) lm-eval reports first for a task: what a person would quote."""
    ml = cfg.get("metric_list") or [{}]
    metric = ml[0].get("metric", "acc")
    fl = cfg.get("filter_list") or []
    filt = fl[0].get("name", "none") if fl and isinstance(fl[0], dict) else "none"
    return metric, filt


def rows(res: dict, route: str) -> list[Row]:
    """One `accuracy` row per task (its primary metric, in [0, 1]), stderr as stddev, n = samples scored."""
    out: list[Row] = []
    for task, r in sorted(res["results"].items()):
        cfg = res.get("configs", {}).get(task)
        if cfg is None:
            continue  # a group's aggregate: its tasks have rows of their own
        metric, filt = _primary(cfg)
        key = f"{metric},{filt}"
        n = (res.get("n-samples", {}).get(task) or {}).get("effective")
        kw: dict[str, Any] = dict(test=f"lm-eval:{task}:{metric}", phase="eval", ctx=None, n=n)
        v = r.get(key)
        if not isinstance(v, (int, float)):
            out.append(missing("accuracy", f"lm-eval reported no {key} for {task} ({route})", **kw))
            continue
        se = r.get(f"{metric}_stderr,{filt}")
        out.append(
            Row(metric="accuracy", value=float(v), stddev=float(se) if isinstance(se, (int, float)) else None, **kw)
        )
    return out


# ---------------------------------------------------------------------------- host route: llama-cpp-python
def _refused(task: str, output_type: str) -> DevicelabError:
    """A request of a kind the host route does not score (route_problem has its reason)."""
    why = route_problem("host-loglikelihood", task, output_type)
    assert why is not None, f"the host route scores {output_type}"
    return DevicelabError(why)


def host_lm(model_path: Path, n_ctx: int, threads: int, lib: Library | None):
    """An lm-eval LM that scores log-likelihoods in-process with llama-cpp-python on the GGUF file, its bindings
    calling `lib` (the host build's own libllama.so; None: llama-cpp-python's own library)."""
    import importlib.util

    from .build import library

    _lm_eval()
    if importlib.util.find_spec("llama_cpp") is None:
        raise DevicelabError("route host-loglikelihood needs llama-cpp-python: pip install 'devicelab[evals]'")
    llama_cpp = library.load(lib)
    import numpy as np
    from lm_eval.api.model import LM

    class LlamaCppLM(LM):
        def __init__(self):
            super().__init__()
            self.llm = llama_cpp.Llama(
                model_path=str(model_path),
                n_ctx=n_ctx,
                n_batch=min(512, n_ctx),
                n_threads=threads,
                logits_all=True,
                verbose=False,
                seed=1234,
            )
            self.n_ctx = n_ctx
            self.bos = self.llm.token_bos()

        def _tok(self, text: str, bos: bool) -> list[int]:
            return self.llm.tokenize(text.encode("utf-8"), add_bos=bos, special=False)

        def _score(self, context: str, cont: str) -> tuple[float, bool]:
            n_sp = len(context) - len(context.rstrip())
            if n_sp:  # lm-eval's convention: trailing space belongs to the continuation
                cont, context = context[-n_sp:] + cont, context[:-n_sp]
            ctx_t = self._tok(context, True) if context else []
            whole = self._tok(context + cont, True)
            if ctx_t and whole[: len(ctx_t)] == ctx_t:
                cont_t = whole[len(ctx_t) :]
            else:
                cont_t = self._tok(cont, False)
                whole = ctx_t + cont_t
            if not cont_t:
                return 0.0, True
            if len(whole) == len(cont_t):
                whole = [self.bos] + whole  # something to predict the first token from
            whole = whole[-self.n_ctx :]
            n = min(len(cont_t), len(whole) - 1)
            cont_t = cont_t[-n:]
            self.llm.reset()
            self.llm.eval(whole)
            logits = np.asarray(self.llm.scores[len(whole) - n - 1 : len(whole) - 1], dtype=np.float64)
            mx = logits.max(axis=1, keepdims=True)
            lse = (mx + np.log(np.exp(logits - mx).sum(axis=1, keepdims=True)))[:, 0]
            idx = np.asarray(cont_t)
            lp = logits[np.arange(n), idx] - lse
            return float(lp.sum()), bool((logits.argmax(axis=1) == idx).all())

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            return [self._score(*r.args[:2]) for r in requests]

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            raise _refused("(rolling)", "loglikelihood_rolling")

        def generate_until(self, requests, disable_tqdm: bool = False):
            raise _refused("(generation)", "generate_until")

    lm = LlamaCppLM()
    build = lib.build_key if lib is not None else None
    lm.provenance = {
        "eval_engine": f"llama-cpp-python {llama_cpp.__version__}"
        + (f" on the host build {build}" if build else " (its own library)"),
        "eval_engine_system_info": _system_info(),
        **(lib.provenance() if lib is not None else {}),
    }
    return lm


def _system_info() -> str | None:
    """llama.cpp's system info line of the library llama-cpp-python calls (its CPU features)."""
    try:
        import llama_cpp

        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        return info.strip()[:200] or None
    except Exception:  # purely informational
        return None


def versions() -> dict[str, str | None]:
    """lm-eval's and llama-cpp-python's versions (part of a cached host eval's key and provenance)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist, key in (("lm-eval", "lm_eval"), ("llama-cpp-python", "llama_cpp_python")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    return out
