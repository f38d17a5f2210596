"""The layers of docs/architecture.md, checked on the import graph derived from the source: every
import (module level and inside functions, `importlib.import_module("...")` with a literal, the
package's lazy exports), with each imported module's parent packages. No circle, and no import
that crosses the layers the wrong way."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> import name (pyproject.toml's package-dir)
PACKAGES = {"pcpcheck": "pcpcheck", "spec": "pcpcheck_spec", "reference": "pcpcheck_reference",
            "impl": "pcpcheck_impl"}

# Each module's layer (the first pattern that matches), from the faces down.
LAYERS = {
    "face": ("pcpcheck", "pcpcheck.__main__", "pcpcheck.cli", "pcpcheck.options",
             "pcpcheck.pytest_plugin", "pcpcheck.torchrun", "pcpcheck.torchrun.*"),
    "render": ("pcpcheck.progress", "pcpcheck.outputs", "pcpcheck.html", "pcpcheck.junit",
               "pcpcheck.summary", "pcpcheck.repro"),
    "api": ("pcpcheck.api", "pcpcheck.runs", "pcpcheck.releases", "pcpcheck.assemble"),
    "search": ("pcpcheck.engine", "pcpcheck.minimize", "pcpcheck.exhaustive", "pcpcheck.jobs",
               "pcpcheck.vllm.verdict", "pcpcheck.vllm.steps"),
    "text": ("pcpcheck.report",),
    "judge": ("pcpcheck.judge", "pcpcheck.coverage", "pcpcheck.compare", "pcpcheck.vllm.judge", "pcpcheck.baseline"),
    "cases": ("pcpcheck.cases", "pcpcheck.reduce", "pcpcheck.scope"),
    "results": ("pcpcheck.results",),
    "transport": ("pcpcheck.backends", "pcpcheck.backends.*"),
    "worker": ("pcpcheck.worker", "pcpcheck.worker.*", "pcpcheck.vllm.release",
               "pcpcheck.vllm.step", "pcpcheck.vllm.kernels", "pcpcheck.vllm.excerpts",
               "pcpcheck.vllm.paths", "pcpcheck.vllm.record"),  # record: runs inside vLLM
    "shared": ("pcpcheck.shared", "pcpcheck.shared.*", "pcpcheck.vllm", "pcpcheck.vllm.source",
               "pcpcheck.vllm.inputs", "pcpcheck.vllm.recording"),
    "names": ("pcpcheck_spec", "pcpcheck_spec.names"),  # the vocabulary every statement shares
    "spec": ("pcpcheck_spec", "pcpcheck_spec.*"),  # the judge's predicates, registry and model
    "reference": ("pcpcheck_reference", "pcpcheck_reference.*"),
    "impl": ("pcpcheck_impl", "pcpcheck_impl.*"),
}
_MODELS = ("names", "spec", "reference")
# Who may import whom (besides the standard library and third parties). The worker side (where
# a target runs) holds neither the judge nor the driver's transport; only the transport reaches
# it (the fork server preloads it); both sides share `shared`.
MAY_IMPORT = {
    "face": {"face", "render", "api", "results", "text", "shared", *_MODELS},
    "render": {"render", "api", "results", "text", "cases", "shared", *_MODELS},
    "api": {"api", "search", "text", "judge", "cases", "results", "transport", "shared", *_MODELS},
    "search": {"search", "text", "judge", "cases", "results", "shared", *_MODELS},
    "text": {"text", "cases", "shared", *_MODELS},
    "judge": {"judge", "cases", "results", "shared", *_MODELS},
    "cases": {"cases", "shared", *_MODELS},
    "results": {"results"},
    "transport": {"transport", "worker", "shared", "names"},
    "worker": {"worker", "shared", "names", "reference", "impl"},
    "shared": {"shared", "names", "reference"},
    "names": {"names"},
    "spec": {"spec", "names"},
    "reference": {"reference", "names"},
    "impl": {"impl", "names"},
}
# pcpcheck/__init__.py imports nothing when it runs (its names load on first use), so importing
# any pcpcheck.* module does not pull the faces in: it is no parent edge (tested below).
LAZY_ROOT = "pcpcheck"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project by import name."""
    found = {}
    for folder, name in PACKAGES.items():
        for path in (root / folder).rglob("*.py"):
            parts = [name, *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(name: str, known) -> str | None:
    """The project module an imported name is, or lies in (`from pkg import name` of a
    function gives pkg); None outside the project."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, path: Path, known, text: str | None = None) -> set[str]:
    """Every project module `module` imports, anywhere in its file (or in `text`, its source as
    edited), with their parent packages."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    named = set()
    tree = ast.parse(path.read_text() if text is None else text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            named |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                      for alias in node.names}
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            named.add(str(node.args[0].value))
        elif (module == LAZY_ROOT and isinstance(node, ast.Assign)
              and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets)):
            named |= {value.value for value in node.value.values}
    # a module's own parent packages are imported before it: importing them is no edge
    own = {module.rsplit(".", k)[0] for k in range(module.count(".") + 1)}
    found = set()
    for name in named:
        target = _resolve(name, known)
        while target and target != LAZY_ROOT and target not in own:
            found.add(target)
            target = target.rpartition(".")[0]
    return found


def layer(module: str) -> str | None:
    return next((name for name, patterns in LAYERS.items()
                 if any(fnmatch.fnmatchcase(module, p) for p in patterns)), None)


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {module: imports(module, path, known) for module, path in known.items()}


def wrong_way(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, targets in edges.items()
                  for b in targets if layer(b) not in MAY_IMPORT.get(layer(a), ()))


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer(m) is None] == []


def test_no_import_circle():
    assert circles(graph()) == []


def test_no_import_crosses_the_layers_the_wrong_way():
    assert wrong_way(graph()) == []


def test_the_package_root_imports_nothing_when_it_runs():
    """What makes it no parent edge: no import statement outside a function."""
    tree = ast.parse((ROOT / "pcpcheck" / "__init__.py").read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                and getattr(n, "module", None) != "__future__"]


def test_the_worker_side_holds_no_judge():
    """The modules a worker imports (from the worker's own entry, transitively) include no
    judge, search, API or transport."""
    edges = graph()
    seen, todo = set(), ["pcpcheck.worker.main"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += edges[module]
    assert {layer(m) for m in seen} <= {"worker", "shared", "names", "reference", "impl"}, sorted(
        m for m in seen if layer(m) not in ("worker", "shared", "names", "reference", "impl"))
    assert "pcpcheck.vllm.step" in seen and "pcpcheck.worker.loader" in seen


@pytest.mark.parametrize("where, line, finds", [
    ("pcpcheck/worker/runner.py", "from pcpcheck.judge import judge", "wrong way"),
    ("pcpcheck/worker/main.py", "def f():\n    import pcpcheck.backends.base", "wrong way"),
    ("pcpcheck/shared/case.py", "import pcpcheck_spec.model", "wrong way"),
    ("pcpcheck/judge.py", "from pcpcheck import api", "wrong way"),
    ("pcpcheck/cli.py", "from pcpcheck.engine import search", "wrong way"),
    ("pcpcheck/progress.py", "from pcpcheck.judge import run_cases", "wrong way"),
    ("pcpcheck/api.py", "def f():\n    from pcpcheck.worker import loader", "wrong way"),
    ("pcpcheck/reduce.py", "def f():\n    from pcpcheck import engine", "wrong way"),
    ("pcpcheck/cases.py", "def f():\n    from . import reduce", "circle"),
    ("pcpcheck/shared/wire.py", "def f():\n    import importlib\n"
                                "    importlib.import_module('pcpcheck.shared.messages')", "circle"),
])
def test_the_check_finds_a_circle_or_a_wrong_way_import_put_in_by_hand(where, line, finds):
    known = modules()
    module = next(m for m, path in known.items() if path == ROOT / where)
    edges = graph()
    assert not circles(edges) and not wrong_way(edges)
    edges[module] = imports(module, known[module], known,
                            (ROOT / where).read_text() + "\n\n" + line + "\n")
    if finds == "circle":
        assert circles(edges), line
    else:
        assert wrong_way(edges), line
