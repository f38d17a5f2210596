"""The layers of docs/architecture.md are the folders of pcpcheck/, checked on the import graph
derived from the source: every import (module level, inside functions and under TYPE_CHECKING,
`importlib.import_module("...")` with a literal, the package's lazy exports), with each imported
module's parent packages. A folder imports only itself and the folders below it; no circle of
modules or of folders; the worker side holds no judge; no module imports another's private
name. Each finding names the file and line of the import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> import name (pyproject.toml's package-dir)
PACKAGES = {"pcpcheck": "pcpcheck", "spec": "pcpcheck_spec", "reference": "pcpcheck_reference",
            "impl": "pcpcheck_impl"}

# pcpcheck's folders from the top down, as docs/architecture.md draws them: each may import
# itself and any folder after it.
FOLDERS = ("faces", "render", "api", "search", "judge", "backends", "worker", "shared")
# The modules directly in pcpcheck/ and what each may import.
ROOT_MODULES = {
    "pcpcheck": ("api", "shared"),  # the public names, loaded on first use
    "pcpcheck.__main__": ("faces",),  # python -m pcpcheck
    "pcpcheck.vllm_plugin": ("shared",),  # the recorder plugin: runs inside vLLM, no judge
}
# The three statements (spec/, reference/, impl/). Only the judge and what drives it may read
# the spec's logic (predicates, registry, model); its names are everyone's. impl is a target:
# only the worker loads it.
SPEC_LOGIC = ("faces", "render", "api", "search", "judge")
IMPL_USERS = ("worker",)
# a statement's own imports (tests/test_project.py checks them name by name)
MODELS_MAY_IMPORT = {"spec": {"spec", "names"}, "names": {"names"},
                     "reference": {"reference", "names"}, "impl": {"impl", "names"}}
LAZY_ROOT = "pcpcheck"  # imports nothing when it runs: importing pcpcheck.x is no edge to it


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


def _named(module: str, path: Path, known, tree: ast.AST):
    """(imported name, line, the names it imports from it) of every import in the tree."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full, node.lineno, ()) if full in known else (base, node.lineno, (alias.name,))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            yield str(node.args[0].value), node.lineno, ()
        elif (module == LAZY_ROOT and isinstance(node, ast.Assign)
              and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets)):
            for key, value in zip(node.value.keys, node.value.values):
                yield value.value, node.lineno, (key.value,)


def imports(module: str, path: Path, known, text: str | None = None) -> dict[str, int]:
    """Every project module `module` imports, anywhere in its file (or in `text`, its source as
    edited), with their parent packages: module -> the line of its first import."""
    tree = ast.parse(path.read_text() if text is None else text)
    # a module's own parent packages are imported before it: importing them is no edge
    own = {module.rsplit(".", k)[0] for k in range(module.count(".") + 1)}
    found: dict[str, int] = {}
    for name, line, _ in sorted(_named(module, path, known, tree), key=lambda item: item[1]):
        target = _resolve(name, known)
        while target and target != LAZY_ROOT and target not in own:
            found.setdefault(target, line)
            target = target.rpartition(".")[0]
    return found


def layer(module: str) -> str | None:
    """A module's layer: its folder under pcpcheck/, "root" for a module directly in it, or the
    statement it belongs to (spec's names apart from its logic)."""
    top, _, rest = module.partition(".")
    if top == "pcpcheck":
        if module in ROOT_MODULES:
            return "root"
        folder = rest.partition(".")[0]
        return folder if folder in FOLDERS else None
    if module in ("pcpcheck_spec", "pcpcheck_spec.names"):  # the package's __init__ is empty
        return "names"
    return {"pcpcheck_spec": "spec", "pcpcheck_reference": "reference",
            "pcpcheck_impl": "impl"}.get(top)


def may_import(importer: str, imported: str) -> bool:
    a, b = layer(importer), layer(imported)
    if a == "root":
        return b in ROOT_MODULES[importer] or b == "names"
    if a in FOLDERS:
        if b in FOLDERS:
            return FOLDERS.index(b) >= FOLDERS.index(a)
        return (b in ("names", "reference") or (b == "spec" and a in SPEC_LOGIC)
                or (b == "impl" and a in IMPL_USERS))
    return b in MODELS_MAY_IMPORT.get(a, ())


def graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    known = modules(root)
    return {module: imports(module, path, known) for module, path in known.items()}


def _where(module: str, line: int) -> str:
    return f"{modules()[module].relative_to(ROOT)}:{line}"


def wrong_way(edges: dict[str, dict[str, int]]) -> list[str]:
    return sorted(f"{_where(a, line)}: {a} ({layer(a)}) imports {b} ({layer(b)})"
                  for a, targets in edges.items() for b, line in targets.items()
                  if not may_import(a, b))


def circles(edges) -> list[list[str]]:
    """Every strongly connected set of more than one node (Tarjan), each sorted."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found: list = []

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


def folder_edges(edges) -> dict[str, dict[str, str]]:
    """Folder -> folder it imports -> one import that makes the edge (FILE:LINE)."""
    folders: dict[str, dict[str, str]] = {}
    for a, targets in edges.items():
        for b, line in targets.items():
            fa, fb = layer(a), layer(b)
            if fa in FOLDERS and fb in FOLDERS and fa != fb:
                folders.setdefault(fa, {}).setdefault(fb, _where(a, line))
    return folders


def folder_circles(edges) -> list[str]:
    """Each circle of folders, with the imports that close it."""
    folders = folder_edges(edges)
    return [", ".join(f"{a} -> {b} ({folders[a][b]})" for a in circle for b in circle
                      if b in folders.get(a, {}))
            for circle in circles(folders)]


def private_imports(root: Path = ROOT) -> list[str]:
    """Each `from pcpcheck... import _name` of another module's private name, or `mod._name`
    read through an imported project module."""
    known = modules(root)
    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text())
        for name, line, names in _named(module, path, known, tree):
            if _resolve(name, known) and _resolve(name, known) != module:
                found += [f"{path.relative_to(root)}:{line}: imports {name}.{each}"
                          for each in names if each.startswith("_") and not each.startswith("__")]
        aliases = {}  # a name bound to another project module -> that module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                aliases.update({alias.asname or alias.name: f"{node.module}.{alias.name}"
                                for alias in node.names if f"{node.module}.{alias.name}" in known})
            elif isinstance(node, ast.Import):
                aliases.update({alias.asname: alias.name for alias in node.names
                                if alias.asname and alias.name in known})
        aliases = {name: target for name, target in aliases.items() if target != module}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                found.append(f"{path.relative_to(root)}:{node.lineno}: reads "
                             f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_every_module_lies_in_a_layer_folder():
    assert [m for m in modules() if layer(m) is None] == []


def test_about_ten_modules_lie_directly_in_pcpcheck():
    direct = [path.name for path in (ROOT / "pcpcheck").glob("*.py")]
    assert sorted(f"pcpcheck.{name[:-3]}".replace(".__init__", "") for name in direct) == sorted(ROOT_MODULES)
    assert sorted(p.name for p in (ROOT / "pcpcheck").iterdir()
                  if p.is_dir() and p.name != "__pycache__") == sorted(FOLDERS)


def test_no_two_modules_are_named_alike():
    """No twin names across the layers: no two modules of one name, or of names that differ by
    a plural (release.py / releases.py)."""
    stems = [path.stem for path in (ROOT / "pcpcheck").rglob("*.py") if path.stem != "__init__"]
    singular = [stem[:-1] if stem.endswith("s") else stem for stem in stems]
    assert len(set(singular)) == len(singular), sorted(
        s for s in stems if singular.count(s[:-1] if s.endswith("s") else s) > 1)


def test_each_public_name_is_defined_once():
    """A public function or class is defined by one module of pcpcheck/ (each face's `main`, its
    entry point by convention, aside)."""
    where: dict[str, list[str]] = {}
    for path in (ROOT / "pcpcheck").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert {name: places for name, places in where.items() if len(places) > 1 and name != "main"} == {}


def test_no_import_circle():
    assert circles(graph()) == []


def test_no_folder_circle():
    assert folder_circles(graph()) == []


def test_no_import_crosses_the_layers_the_wrong_way():
    assert wrong_way(graph()) == []


def test_no_module_imports_another_modules_private_name():
    assert private_imports() == []


def test_the_package_root_imports_nothing_when_it_runs():
    """What makes it no parent edge: no import statement outside a function."""
    tree = ast.parse((ROOT / "pcpcheck" / "__init__.py").read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                and getattr(n, "module", None) != "__future__"]


def test_the_worker_side_holds_no_judge():
    """The modules a worker imports (from the worker's own entry, transitively) include no
    judge, search, API or transport, nor the spec's logic."""
    edges = graph()
    seen, todo = set(), ["pcpcheck.worker.main"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += edges[module]
    assert {layer(m) for m in seen} <= {"worker", "shared", "names", "reference", "impl"}, sorted(
        m for m in seen if layer(m) not in ("worker", "shared", "names", "reference", "impl"))
    assert "pcpcheck.worker.release_step" in seen and "pcpcheck.worker.loader" in seen


def test_the_worker_protocol_is_built_and_read_in_one_module():
    """Every operation's message is built and read by pcpcheck.shared.protocol: no other module
    writes or reads a message's "op"."""
    elsewhere = [f"{path.relative_to(ROOT)}:{number}"
                 for path in (ROOT / "pcpcheck").rglob("*.py") if path.name != "protocol.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1) if '"op"' in line]
    assert elsewhere == []


def _edited(where: str, line: str):
    known = modules()
    module = next(m for m, path in known.items() if path == ROOT / where)
    edges = graph()
    assert not circles(edges) and not wrong_way(edges) and not folder_circles(edges)
    edges[module] = imports(module, known[module], known,
                            (ROOT / where).read_text() + "\n\n" + line + "\n")
    return edges


@pytest.mark.parametrize("where, line", [
    ("pcpcheck/worker/runner.py", "from pcpcheck.judge.verdict import judge"),
    ("pcpcheck/worker/main.py", "def f():\n    import pcpcheck.backends.base"),
    ("pcpcheck/shared/case.py", "import pcpcheck_spec.model"),
    ("pcpcheck/judge/verdict.py", "from pcpcheck import api"),
    ("pcpcheck/search/engine.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from pcpcheck.render.report import result_text"),
    ("pcpcheck/api/common.py", "def f():\n    from pcpcheck.faces import options"),
    ("pcpcheck/backends/threads.py", "from pcpcheck.judge import run"),
    ("pcpcheck/shared/wire.py", "import importlib\nimportlib.import_module('pcpcheck.worker.main')"),
    ("pcpcheck/judge/prepare.py", "import pcpcheck_impl"),
    ("pcpcheck/vllm_plugin.py", "from pcpcheck.worker import loader"),
])
def test_the_check_finds_an_import_from_a_lower_folder_up_put_in_by_hand(where, line):
    found = wrong_way(_edited(where, line))
    assert found and all(finding.startswith(f"{where}:") for finding in found), found


def test_the_check_finds_a_folder_circle_put_in_by_hand():
    """A lower folder importing a higher one closes a circle of folders, named with the imports
    that make it."""
    found = folder_circles(_edited("pcpcheck/shared/errors.py",
                                   "def f():\n    from pcpcheck.judge import verdict"))
    assert found and "judge -> " in found[0] and "shared -> judge (pcpcheck/shared/errors.py:" in found[0]


@pytest.mark.parametrize("where, line", [
    ("pcpcheck/search/draw.py", "def f():\n    from pcpcheck.search import reduce"),
    ("pcpcheck/shared/wire.py", "def f():\n    import importlib\n"
                                "    importlib.import_module('pcpcheck.shared.protocol')"),
])
def test_the_check_finds_a_module_circle_put_in_by_hand(where, line):
    assert circles(_edited(where, line))


def test_the_check_finds_a_private_name_imported_by_hand(tmp_path):
    """On a copy of the tree with one module edited: a private name imported, and one read
    through an imported module."""
    for folder in PACKAGES:
        if folder != "pcpcheck":
            (tmp_path / folder).symlink_to(ROOT / folder)
    for path in (ROOT / "pcpcheck").rglob("*.py"):
        copy = tmp_path / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text())
    assert private_imports(tmp_path) == []
    exhaustive = tmp_path / "pcpcheck" / "search" / "exhaustive.py"
    exhaustive.write_text(exhaustive.read_text() + "\nfrom pcpcheck.search.engine import _size\n"
                          "from pcpcheck.shared import wire\nwire._FRAME\n")
    found = private_imports(tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == ["imports pcpcheck.search.engine._size",
                                                    "reads pcpcheck.shared.wire._FRAME"], found
