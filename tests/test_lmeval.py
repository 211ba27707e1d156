"""The two lm-eval routes, for real: generation tasks through llama-server (pinned build) on the device
with lm-eval's API client over the transport's forwarded port, and log-likelihood tasks on the host in-process
through llama-cpp-python, on SmolLM2-135M's ladder. The task files are tiny ones of our own making
(recipes/tasks/lm-eval): they exercise the routes; they do not measure real-benchmark accuracy."""

import importlib.util
import json
import sqlite3
import subprocess
import sys

import pytest
from conftest import REPO, devicelab

from devicelab import lmeval
from devicelab.errors import DevicelabError
from devicelab.ledger import ledger_path

TASKS = REPO / "recipes" / "tasks" / "lm-eval"


def test_declared_output_types_of_our_task_files():
    types = lmeval.declared_output_types(TASKS)
    assert types == {"devicelab_copy": "generate_until", "devicelab_mc": "multiple_choice"}


@pytest.mark.parametrize(
    "route,task,needle",
    [
        ("server-generate", "devicelab_mc", "no prompt logprobs"),
        ("host-loglikelihood", "devicelab_copy", "use route: server-generate"),
        ("server-generate", "hellaswag", "no prompt logprobs"),  # lm-eval's own task, from its index
    ],
)
def test_a_route_that_cannot_score_a_task_is_refused_before_anything_runs(tmp_path, route, task, needle):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(
        f"name: bad\nmodels: [{{name: smollm2-135m}}]\nquants: [q8_0]\npayloads:\n"
        f"  - {{kind: eval, route: {route}, include: {TASKS}, lm_tasks: [{task}]}}\n"
    )
    lab = tmp_path / "lab"
    p = devicelab("run", recipe, "--lab-dir", lab)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "payloads.0" in err[0], p.stderr
    assert not (ledger_path(lab)).exists()  # refused before a ledger or a build exists
    if task.startswith("devicelab_"):
        with pytest.raises(DevicelabError, match=needle):
            lmeval.check_tasks(route, [task], lmeval.declared_output_types(TASKS))


def test_route_fields_are_checked(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\npayloads:\n  - {kind: eval, route: server-generate, data: x.txt}\n")
    p = devicelab("run", recipe, "--lab-dir", tmp_path / "lab")
    assert p.returncode != 0 and "lm_tasks" in p.stderr and len(p.stderr.strip().splitlines()) == 1


RECIPE = f"""
name: lmeval-routes
devices: [local]
models: [{{name: smollm2-135m}}]
quants: [q8_0, q2_k]
payloads:
  - {{kind: eval, route: server-generate, include: {TASKS}, lm_tasks: [devicelab_copy], slots: 2, ctx: 256}}
  - {{kind: eval, route: host-loglikelihood, include: {TASKS}, lm_tasks: [devicelab_mc], ctx: 256}}
recommend: {{context: 1024, max_kld_mean: 1, max_ppl_ratio: 5, min_accuracy: 0.3}}
"""


@pytest.fixture(scope="module")
def routes(tmp_path_factory, host_build, smol_path):
    pytest.importorskip("lm_eval")
    if importlib.util.find_spec("llama_cpp") is None:  # found, not imported: a lab binds its library (build/library.py)
        pytest.skip("llama-cpp-python is not installed")
    d = tmp_path_factory.mktemp("lmeval")
    (d / "r.yaml").write_text(RECIPE)
    p = devicelab("run", d / "r.yaml", "--lab-dir", d / "lab", timeout=3600)
    assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    return d, Ledger(ledger_path(d / "lab")).rows_frame()


def test_generation_task_through_llama_server_on_the_device(routes):
    _, r = routes
    acc = r[(r.metric == "accuracy") & (r.eval_route == "server-generate")].set_index("quant")
    assert set(acc.index) == {"q8_0", "q2_k"}
    assert (acc.test == "lm-eval:devicelab_copy:exact_match").all()
    assert (acc.n.astype(int) == 20).all()
    # copying a word after two examples: q8_0 of a 135M model gets it (a broken route scores ~0)
    assert acc.value["q8_0"] >= 0.7, acc.value
    gen = r[(r.metric == "tokens_generated")].set_index("quant").value
    assert (gen >= 20).all()  # llama-server's own counter: every document generated
    assert r[r.metric == "eval_gen_tps"].value.gt(0).all()
    assert set(r[r.payload == "eval"].eval_engine.dropna()) >= {"llama-server + lm-eval"}
    # the server ran under the sampler like any payload: its peak RSS is that of a loaded model
    rss = r[(r.metric == "peak_rss") & (r.eval_route == "server-generate")].value
    assert (rss > 50e6).all()


def test_loglikelihood_task_on_the_host_through_llama_cpp_python(routes, host_build):
    from devicelab.ledger import Ledger

    d, r = routes
    acc = r[(r.metric == "accuracy") & (r.eval_route == "host-loglikelihood")].set_index("quant")
    assert set(acc.index) == {"q8_0", "q2_k"}
    assert (acc.n.astype(int) == 12).all() and acc.stddev.notna().all()
    assert acc.value["q8_0"] > 0.5, acc.value  # easy items, chance is 25%
    # llama-cpp-python's bindings called the host build's own library (the lab's default source is the tree it
    # vendors): the rows name that build, as a device's rows name theirs
    assert acc.eval_engine.str.startswith(f"llama-cpp-python 0.3.36 on the host build {host_build.key}").all()
    assert (acc.build_key == host_build.key).all() and (acc.build_commit == host_build.manifest["commit"]).all()
    # cached per (file, task files, engine): another lab (or device) with the same cell does not re-score
    only = d / "host-only.yaml"
    only.write_text("\n".join(l for l in RECIPE.splitlines() if "server-generate" not in l))
    again = devicelab("run", only, "--lab-dir", d / "lab2", timeout=3600, check=True)
    assert "on the host (llama-cpp-python)" not in again.stdout
    r2 = Ledger(ledger_path(d / "lab2")).rows_frame()
    a2 = r2[r2.metric == "accuracy"].set_index("quant").value
    assert a2.to_dict() == acc.value.to_dict()


def test_recommendation_uses_the_route_accuracies(routes):
    d, _ = routes
    rec = json.loads(
        devicelab("recommend", "--lab-dir", d / "lab", "--recipe", d / "r.yaml", "--json", check=True).stdout
    )[0]
    assert {c["quant"] for c in rec["candidates"]} == {"q8_0", "q2_k"}
    assert all(c["accuracy"] is not None for c in rec["candidates"])
    con = sqlite3.connect(ledger_path(d / "lab"))
    assert con.execute("select count(*) from rows where eval_route is not null").fetchone()[0] >= 4


def test_a_server_that_cannot_start_fails_its_cell_with_the_reason(tmp_path, host_build, smol_path):
    """A KV cache of 8M tokens (184 GB) cannot be allocated: llama-server exits during startup; the cell fails with
    llama-server's own words, the run goes on to the next cell and nothing else is lost."""
    pytest.importorskip("lm_eval")
    r = tmp_path / "r.yaml"
    r.write_text(
        f"name: dies\nmodels: [{{name: smollm2-135m}}]\nquants: [q4_0]\npayloads:\n"
        f"  - {{kind: eval, route: server-generate, include: {TASKS}, lm_tasks: [devicelab_copy], "
        "ctx: 8000000, limit: 2}\n"
        "  - {kind: bench, prompt: [8], gen: [4], threads: [1], repetitions: 1}\n"
    )
    p = devicelab("run", r, "--lab-dir", tmp_path / "lab", timeout=900)
    assert p.returncode == 1, p.stdout + p.stderr
    con = sqlite3.connect(ledger_path(tmp_path / "lab"))
    st = dict(con.execute("SELECT payload, status FROM cells").fetchall())
    assert st == {"eval": "failed", "bench": "done"}, st
    err = con.execute("SELECT error FROM cells WHERE payload='eval'").fetchone()[0]
    assert "llama-server exited before it was ready" in err and "\n" not in err.strip()


def test_the_host_builds_objects_are_the_library_llama_cpp_python_calls(host_build, tmp_path):
    """The host build's static archives, linked whole into libllama.so (build/library.py): llama-cpp-python, in a
    process of its own, binds that file (not a library of its own) and scores with it; a llama.cpp that is not the
    tree the bindings vendor is refused with the reason."""
    from devicelab.build import library
    from devicelab.build.source import SourceTree

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    lib = library.ensure(host_build)
    assert lib.path == host_build.dir / "lib" / "libllama.so" and lib.build_key == host_build.key
    assert library.ensure(host_build) == lib  # linked once: the second asks finds it
    code = (
        "import sys; from pathlib import Path; from devicelab.build import library; "
        "lib = library.Library(Path(sys.argv[1]), 'x', 'k', 'c'); ll = library.load(lib); "
        "print(ll.llama_cpp._lib._name); print(ll.llama_print_system_info().decode())"
    )
    p = subprocess.run([sys.executable, "-c", code, str(lib.path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    bound, info = p.stdout.splitlines()[:2]
    assert bound == str(lib.path) and "CPU :" in info, p.stdout
    other = SourceTree(path=tmp_path, commit="0" * 40, origin="git:elsewhere@0", dirty=False)
    why = library.mismatch(other)
    assert why and "is not the one llama-cpp-python 0.3.36 vendors" in why, why
