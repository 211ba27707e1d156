"""The shape of the house, read from the source with `ast` (nothing of devicelab is run to find a violation):

- no import cycle in host/devicelab (module- and function-level imports count, relative ones resolved,
  `if TYPE_CHECKING:` blocks do not: they never run);
- no function or method longer than MAX_FUNCTION_LINES;
- each name that selects a unit is written only in that unit: a payload kind's name only in kinds/, a
  transport's only in transports/, a backend's only in build/backends.py, a telemetry source's only in its one
  module under telemetry/sources/.

Names are string constants of the code (docstrings and comments are prose, not naming). A kind, transport or
backend is named by a literal that EQUALS its name (`kind == "kld"`, `{"ssh": ...}`); a word inside a sentence
("runs on the local host") names nothing, and a name that is also another thing's (AMBIGUOUS: "local" is also
the default device) names the unit only beside a word that says so (`d.transport == "local"`). A telemetry
source is named by a literal that CONTAINS its token (`"nvidia-smi --query-gpu=..."`, `"/sys/class/hwmon/"`),
case-insensitive, not preceded by a letter (so "integrated" is not Tegra).

Each check is run on a small synthetic package too, so that each can be seen to fail.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "host" / "devicelab"
PACKAGE = "devicelab"

MAX_FUNCTION_LINES = 80

# the backends build/backends.py knows (its BACKENDS tuple is read from the source, these are the fallback)
BACKENDS = ("cpu", "vulkan", "opencl", "metal", "cuda")
# telemetry sources: a token each source's commands, files or tools carry
SOURCE_TOKENS = (
    "nvidia-smi",
    "powermetrics",
    "ioreg",
    "pmset",
    "dumpsys",
    "rapl",
    "hwmon",
    "kgsl",
    "devfreq",
    "tegra",
    "thermal_zone",
    "cpufreq",
    "ina3221",
)

# Explicit exemptions, (path relative to host/devicelab, the literal): each with why. Keep this short.
EXEMPT: dict[tuple[str, str], str] = {
    ("build/backends.py", "nvidia-smi"): "the CUDA build asks the host's nvidia-smi for its GPUs' compute "
    "capabilities (CMAKE_CUDA_ARCHITECTURES): a build fact, not telemetry",
    ("budget.py", "dumpsys meminfo"): "the RAM budget reads Android's meminfo service: memory, not a telemetry source",
    ("budget.py", "mem.dumpsys_free"): "the facts key of that meminfo reading",
    ("build/harness.py", "ios"): "ggml's GGML_METAL_TARGET_OS value for the harness's iOS build (the Metal "
    "shaders' -mtargetos): a build flag, not the transport",
}
# whole folders whose names are data, not branches
EXEMPT_FOLDERS: dict[str, str] = {
    "captures/": "the readers of raw captures (the corpus of real captures, doctor's bundles): each format's folder "
    "name is the name of what the device printed (dumpsys battery, ioreg, nvidia-smi …), and each reader hands the "
    "capture to that unit's own parser",
}


# ---------------------------------------------------------------------------------------------------------------
# reading the package


@dataclass
class Module:
    name: str  # dotted: devicelab.kinds.kld
    rel: str  # path relative to the package folder: kinds/kld.py
    tree: ast.Module
    is_package: bool


@functools.cache
def the_package() -> dict[str, Module]:
    return read_package(SRC)


def read_package(root: Path, package: str = PACKAGE, sources: dict[str, str] | None = None) -> dict[str, Module]:
    """Every module under `root` (or, for the self-tests, `sources`: {relative path: text})."""
    if sources is None:
        sources = {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))}
    mods = {}
    for rel, text in sources.items():
        parts = rel[:-3].split("/")
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join([package, *parts])
        mods[name] = Module(name, rel, ast.parse(text, filename=rel), is_package)
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST):
    """ast.walk, without the bodies of `if TYPE_CHECKING:` (their `else:` runs, so it stays)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, ast.If) and _is_type_checking(n.test):
            todo.extend([n.test, *n.orelse])
            continue
        todo.extend(ast.iter_child_nodes(n))


# ---------------------------------------------------------------------------------------------------------------
# import cycles


def imports_of(mod: Module, known: set[str]) -> set[str]:
    """The package's modules `mod` imports. `from a import b` depends on a.b when that is a module, else on a;
    parent packages that Python initialises on the way are not counted (as import-linter and pydeps do)."""
    out = set()
    for n in _walk(mod.tree):
        if isinstance(n, ast.Import):
            for alias in n.names:
                out.add(alias.name)
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
                base = base[: len(base) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
            else:
                target = n.module or ""
            for alias in n.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    found = set()
    for name in out:  # `import a.b.c` of a module: the longest prefix that is one of ours
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != mod.name:
            found.add(name)
    return found


def import_graph(mods: dict[str, Module]) -> dict[str, set[str]]:
    known = set(mods)
    return {name: imports_of(m, known) for name, m in mods.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Per strongly connected component of more than one module: a shortest cycle through its first module (a
    path back to its start), then the component's other modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan; the package is a few dozen modules, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return [_cycle_in(comp, graph) + sorted(set(comp) - set(_cycle_in(comp, graph))) for comp in comps]


def _cycle_in(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first back to it)."""
    start, members = comp[0], set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp  # not reached: a component of more than one module has a cycle


def cycle_violations(mods: dict[str, Module]) -> list[str]:
    by_name = {m.name: m.rel for m in mods.values()}
    out = []
    for found in import_cycles(import_graph(mods)):
        end = found.index(found[0], 1) + 1
        cycle, others = found[:end], found[end:]
        out.append(
            f"{by_name[cycle[0]]}: import cycle "
            + " -> ".join(cycle)
            + (f" (the same knot: {', '.join(others)})" if others else "")
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
# long functions


def long_functions(mods: dict[str, Module], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []

    def visit(node: ast.AST, qual: str, rel: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{qual}{child.name}"
                length = child.end_lineno - child.lineno + 1
                if length > limit:
                    out.append(f"{rel}:{child.lineno}: {name} is {length} lines (at most {limit})")
                visit(child, f"{name}.", rel)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{qual}{child.name}.", rel)
            else:
                visit(child, qual, rel)

    for m in mods.values():
        visit(m.tree, "", m.rel)
    return out


# ---------------------------------------------------------------------------------------------------------------
# names written outside their unit


def string_constants(tree: ast.Module) -> list[ast.Constant]:
    """Every string constant of the code, in line order: docstrings left out, f-strings' literal parts in."""
    docstrings = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.body:
            first = n.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.add(id(first.value))
    found = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _literal_tuple(tree: ast.Module, target: str) -> tuple[str, ...] | None:
    """The strings of a module-level `TARGET = (...)` / `TARGET: ... = (...)` tuple, list or set."""
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        value = n.value if any(isinstance(t, ast.Name) and t.id == target for t in targets) else None
        if isinstance(value, ast.Tuple | ast.List | ast.Set):
            return tuple(e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return None


def _class_names(mods: dict[str, Module], folder: str) -> tuple[str, ...]:
    """`name = "..."` at class level in the modules of `folder` (how a kind or a transport names itself)."""
    names = []
    for m in mods.values():
        if not m.rel.startswith(folder + "/"):
            continue
        for cls in (n for n in m.tree.body if isinstance(n, ast.ClassDef)):
            for n in cls.body:
                if (
                    isinstance(n, ast.Assign | ast.AnnAssign)
                    and isinstance(n.value, ast.Constant)
                    and isinstance(n.value.value, str)
                ):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    if any(isinstance(t, ast.Name) and t.id == "name" for t in targets):
                        names.append(n.value.value)
    return tuple(sorted(set(names)))


def kind_names(mods: dict[str, Module]) -> tuple[str, ...]:
    return _class_names(mods, "kinds")


def transport_names(mods: dict[str, Module]) -> tuple[str, ...]:
    """The transports' names: the `transport: Literal["ssh"]` each transport's settings declare (transports/)."""
    names = []
    for m in mods.values():
        if not m.rel.startswith("transports/"):
            continue
        for n in ast.walk(m.tree):
            if (
                isinstance(n, ast.AnnAssign)
                and isinstance(n.target, ast.Name)
                and n.target.id == "transport"
                and isinstance(n.annotation, ast.Subscript)
            ):
                names += [
                    c.value
                    for c in ast.walk(n.annotation.slice)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ]
    return tuple(sorted(set(names)))


def backend_names(mods: dict[str, Module]) -> tuple[str, ...]:
    m = next((m for m in mods.values() if m.rel == "build/backends.py"), None)
    return (m and _literal_tuple(m.tree, "BACKENDS")) or BACKENDS


# Names that are also other things' names: such a literal names the unit only where its neighbourhood says so
# (compared with, assigned to, passed as or keyed by something called after the unit: `d.transport == "local"`,
# `{"transport": "local"}`, `default_backend = "cpu"`, `kind="eval"`), or listed beside another of the unit's
# names (`("cpu", "vulkan")`). Each with why it is ambiguous:
AMBIGUOUS = {
    "local": "also the default device's name (`devices: [local]`) and the host build target's (`--target local`)",
    "cpu": "also a CPU energy part, a facts key and a thermal zone's type",
    "eval": "also the phase of lm-eval's rows",
}


@dataclass
class Rule:
    what: str  # "kind"
    names: tuple[str, ...]
    home: str  # the path prefix where the names may be written
    words: tuple[str, ...] = ()  # what an identifier beside an ambiguous name says when it names the unit
    contains: bool = False  # a literal containing the token names it (telemetry sources)
    patterns: dict[str, re.Pattern] = field(default_factory=dict)

    def named(self, node: ast.Constant, parents: dict[int, ast.AST]) -> list[str]:
        value = node.value
        if self.contains:
            if not self.patterns:
                self.patterns = {t: re.compile(rf"(?<![a-z]){re.escape(t)}", re.I) for t in self.names}
            return [t for t, p in self.patterns.items() if p.search(value)]
        if value not in self.names:
            return []
        if value in AMBIGUOUS and not self._in_context(node, parents):
            return []
        return [value]

    def _in_context(self, node: ast.AST, parents: dict[int, ast.AST]) -> bool:
        near, siblings = _neighbourhood(node, parents)
        return any(w in n.lower() for n in near for w in self.words) or bool(
            siblings & (set(self.names) - {node.value})
        )


def _ident(e: ast.AST | None) -> str:
    """What an expression is called: x, a.x, a["x"], x(...)."""
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Attribute):
        return e.attr
    if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, str):
        return e.slice.value
    if isinstance(e, ast.Call):
        return _ident(e.func)
    return ""


def _neighbourhood(node: ast.AST, parents: dict[int, ast.AST]) -> tuple[set[str], set[str]]:
    """(the identifiers a literal is compared with, assigned to, passed as or keyed by; the string constants
    listed beside it), climbing out of the collections and conditional expressions that hold it."""
    siblings: set[str] = set()
    child, p = node, parents.get(id(node))
    while isinstance(p, ast.Tuple | ast.List | ast.Set | ast.IfExp | ast.BinOp | ast.Starred | ast.BoolOp) or (
        isinstance(p, ast.Subscript) and p.slice is child
    ):
        if isinstance(p, ast.Tuple | ast.List | ast.Set):
            siblings |= {e.value for e in p.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        child, p = p, parents.get(id(p))
    near: set[str] = set()
    if isinstance(p, ast.Compare):
        near |= {_ident(e) for e in [p.left, *p.comparators] if e is not child}
    elif isinstance(p, ast.keyword):
        near.add(p.arg or "")
    elif isinstance(p, ast.Dict) and child in p.values:
        near.add(_ident(ast.Subscript(slice=p.keys[p.values.index(child)])))
    elif isinstance(p, ast.Assign):
        near |= {_ident(t) for t in p.targets}
    elif isinstance(p, ast.AnnAssign | ast.AugAssign):
        near.add(_ident(p.target))
    elif isinstance(p, ast.Call):
        near.add(_ident(p.func))
    elif isinstance(p, ast.arguments):
        args = [*p.posonlyargs, *p.args]
        pairs = [
            *zip(args[len(args) - len(p.defaults) :], p.defaults, strict=True),
            *zip(p.kwonlyargs, p.kw_defaults, strict=True),
        ]
        near |= {a.arg for a, d in pairs if d is child}
    elif isinstance(p, ast.Return):
        while p is not None and not isinstance(p, ast.FunctionDef | ast.AsyncFunctionDef):
            p = parents.get(id(p))
        near.add(p.name if p is not None else "")
    return near - {""}, siblings


def naming_rules(mods: dict[str, Module]) -> list[Rule]:
    return [
        Rule("kind", kind_names(mods), "kinds/", ("kind", "payload")),
        Rule("transport", transport_names(mods), "transports/", ("transport",)),
        Rule("backend", backend_names(mods), "build/backends.py", ("backend",)),
        Rule("telemetry source", SOURCE_TOKENS, "telemetry/sources/", contains=True),
    ]


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}


def naming_violations(mods: dict[str, Module], exempt: dict[tuple[str, str], str] = EXEMPT) -> list[str]:
    rules = naming_rules(mods)
    out = []
    units: dict[str, set[str]] = {}  # a telemetry source's token: the modules of sources/ that write it
    for m in sorted(mods.values(), key=lambda m: m.rel):
        if exempt is EXEMPT and m.rel.startswith(tuple(EXEMPT_FOLDERS)):
            continue
        parents = _parents(m.tree)
        for node in string_constants(m.tree):
            if (m.rel, node.value) in exempt:
                continue
            for rule in rules:
                for name in rule.named(node, parents):
                    if m.rel.startswith(rule.home):
                        if rule.contains:  # the registry (sources/__init__.py) is no source's unit either
                            units.setdefault(name, set()).add(m.rel)
                        continue
                    out.append(f"{m.rel}:{node.lineno}: {rule.what} {name!r} named outside {rule.home}: {node.value!r}")
    for token, where in sorted(units.items()):
        if len(where) > 1:  # a source's unit is one module: two modules writing its token share it
            out.append(f"{', '.join(sorted(where))}: telemetry source {token!r} named in more than one unit")
    return out


# ---------------------------------------------------------------------------------------------------------------
# the checks on host/devicelab


def _report(title: str, lines: list[str]) -> str:
    return f"{title} ({len(lines)}):\n  " + "\n  ".join(lines)


def all_violations(mods: dict[str, Module] | None = None) -> dict[str, list[str]]:
    mods = mods if mods is not None else the_package()
    return {
        "import cycles": cycle_violations(mods),
        "long functions": long_functions(mods),
        "names outside their unit": naming_violations(mods),
    }


def test_no_import_cycle():
    found = cycle_violations(the_package())
    assert not found, _report("import cycles", found)


def test_no_long_function():
    found = long_functions(the_package())
    assert not found, _report("functions over the limit", found)


def test_names_live_in_their_unit():
    found = naming_violations(the_package())
    assert not found, _report("names outside their unit", found)


def test_the_registries_are_read():
    """The names come from the code: if the registries move, the checks must not silently check nothing."""
    from devicelab.build.backends import BACKENDS as backends
    from devicelab.kinds import REGISTRY

    mods = the_package()
    assert set(kind_names(mods)) == set(REGISTRY) >= {"bench", "kld", "membw", "batched", "eval"}
    assert {"local", "ssh", "adb"} <= set(transport_names(mods))
    assert set(backend_names(mods)) == set(backends) >= set(BACKENDS)


def test_exemptions_are_still_needed():
    """An exemption whose literal is gone from its file is stale."""
    mods = {m.rel: m for m in the_package().values()}
    stale = [
        f"{rel}: {value!r}"
        for rel, value in EXEMPT
        if rel not in mods or value not in {n.value for n in string_constants(mods[rel].tree)}
    ]
    assert not stale, _report("stale exemptions", stale)


# ---------------------------------------------------------------------------------------------------------------
# each check can fail

SYNTHETIC = {
    "__init__.py": '"""A package."""\n',
    "a.py": "from . import b\n",
    "b.py": "def f():\n    from .sub import c  # function-level: counts\n",
    "sub/__init__.py": "",
    "sub/c.py": "from ..a import thing\n",
    "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import e\n",
    "e.py": "import devicelab.d\n",
    "f.py": "from . import g\n",
    "g.py": "from . import h\n",
    "h.py": "from . import f, g\n",
    "kinds/__init__.py": "",
    "kinds/kld.py": 'class KLD:\n    name = "kld"\n',
    "kinds/eval.py": 'class Eval:\n    name = "eval"\n',
    "transports/__init__.py": "",
    "transports/ssh.py": 'class SSHSettings:\n    transport: Literal["ssh"]\n',
    "transports/local.py": 'class LocalSettings:\n    transport: Literal["local"] = "local"\n',
    "build/__init__.py": "",
    "build/backends.py": 'BACKENDS = ("cpu", "vulkan", "metal")\n',
    "telemetry/__init__.py": "",
    "telemetry/sources/__init__.py": "",
    "telemetry/sources/nvidia.py": 'TOOL = "nvidia-smi"\n',
    "telemetry/sources/other.py": 'EXE = "/usr/bin/nvidia-smi"\n',
    "user.py": (
        '"""A docstring may say kld, ssh, vulkan and nvidia-smi."""\n'
        "def run(kind, tools, transport):\n"
        '    """So may this one: "kld"."""\n'
        '    if kind == "kld":  # a comment may say "ssh" too\n'
        "        return 1\n"
        '    if "nvidia-smi" in tools:\n'
        "        return 2\n"
        '    if transport == "ssh" and f"{kind}-vulkan" != "vulkan":\n'
        "        return 3\n"
        '    raise ValueError("not on the local host, nor on an integrated GPU")\n'
        "def ambiguous(d, phase):\n"
        '    devices, parts, row = ["local"], ("cpu", "gpu"), dict(phase="eval")\n'
        '    if d.transport == "local" or d.target == "local":\n'
        '        default_backend = "cpu"\n'
        '    return dict(kind="eval"), ("cpu", "metal")\n'
    ),
    "long.py": "def long():\n" + "    x = 1\n" * 80 + "\ndef short():\n" + "    x = 1\n" * 79,
}


def test_checks_can_fail():
    mods = read_package(Path("/nonexistent"), sources=SYNTHETIC)
    cycles = cycle_violations(mods)
    assert cycles == [
        "a.py: import cycle devicelab.a -> devicelab.b -> devicelab.sub.c -> devicelab.a",
        "f.py: import cycle devicelab.f -> devicelab.g -> devicelab.h -> devicelab.f",
    ], cycles

    long = long_functions(mods)
    assert long == ["long.py:1: long is 81 lines (at most 80)"], long

    names = naming_violations(mods)
    assert names == [
        "user.py:4: kind 'kld' named outside kinds/: 'kld'",
        "user.py:6: telemetry source 'nvidia-smi' named outside telemetry/sources/: 'nvidia-smi'",
        "user.py:8: transport 'ssh' named outside transports/: 'ssh'",
        "user.py:8: backend 'vulkan' named outside build/backends.py: 'vulkan'",
        "user.py:13: transport 'local' named outside transports/: 'local'",
        "user.py:14: backend 'cpu' named outside build/backends.py: 'cpu'",
        "user.py:15: kind 'eval' named outside kinds/: 'eval'",
        "user.py:15: backend 'cpu' named outside build/backends.py: 'cpu'",
        "user.py:15: backend 'metal' named outside build/backends.py: 'metal'",
        "telemetry/sources/nvidia.py, telemetry/sources/other.py: telemetry source 'nvidia-smi' named in more "
        "than one unit",
    ], names

    exempt = {("user.py", "kld"): "synthetic"}
    assert not any("'kld'" in v for v in naming_violations(mods, exempt))


def test_method_names_are_qualified():
    src = {"m.py": "class C:\n    def f(self):\n" + "        x = 1\n" * 80}
    assert long_functions(read_package(Path("/nonexistent"), sources=src)) == ["m.py:2: C.f is 81 lines (at most 80)"]


if __name__ == "__main__":  # `python tests/test_structure.py`: every violation, one per line
    for title, lines in all_violations().items():
        print(_report(title, lines) if lines else f"{title}: none")
