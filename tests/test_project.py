"""Promises of the project itself: the main job's report covers SPEC.md, the README's commands
are what CI runs, and the three statements stay independent."""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from pathlib import Path

import pytest

from pcpcheck_spec.names import DEFAULT_REGIMES, PRECONDITIONS, REGIMES
from pcpcheck_spec.registry import GATHER_IDS, IDS, REGISTRY, applicable

ROOT = Path(__file__).resolve().parent.parent


def test_spec_md_states_exactly_the_ids_of_spec_names():
    headings = re.findall(r"^### (\w+)$", (ROOT / "spec" / "SPEC.md").read_text(), re.M)
    assert headings == list(IDS) + list(PRECONDITIONS)


def test_registry_regimes_are_those_spec_md_states():
    text = (ROOT / "spec" / "SPEC.md").read_text()
    for entry in REGISTRY:
        section = " ".join(text.split(f"### {entry.id}\n", 1)[1].split("\n#", 1)[0].split())
        stated = re.search(r"Regimes:\s+(all five|(?:`[\w-]+`,?\s*)+)", section).group(1)
        regimes = REGIMES if stated == "all five" else tuple(re.findall(r"`([\w-]+)`", stated))
        assert entry.regimes == regimes, entry.id


def test_main_job_reports_every_invariant_with_cases_in_every_regime_it_applies_to(tmp_path, pcpcheck_check,
                                                                                  capsys):
    verdict = tmp_path / "verdict.json"
    assert pcpcheck_check(["--max-examples", "25", "--json", verdict]) == 0
    printed = capsys.readouterr().out
    regimes = json.loads(verdict.read_text())["regimes"]
    assert list(regimes) == list(DEFAULT_REGIMES)
    for regime, result in regimes.items():
        applies = {entry.id for entry in applicable(regime)}
        for invariant in IDS:
            # counts come from predicates that ran: a judge skipping one leaves its count at 0
            checked = result["invariants"].get(invariant, {"checked": 0})["checked"]
            assert checked == (result["cases"] if invariant in applies else 0), (regime, invariant)
    for invariant in GATHER_IDS:  # LAYOUT is `pcpcheck vllm`'s (tests/test_vllm.py)
        assert re.search(rf"^{invariant} .*\b\d+ ok", printed, re.M), invariant


def test_ci_runs_the_readme_test_command():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = (ROOT / "README.md").read_text()
    assert command in readme
    assert "pip install torch==2.13.0 -e . && pcpcheck" in readme


def test_ci_runs_the_readme_test_command_in_a_fresh_virtual_environment():
    """As a newcomer runs it: nothing installed first (the extras of .ci/run's earlier stage, in
    the environment it was started in, would hide a test that fails without them)."""
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    venv = next(i for i, line in enumerate(lines) if re.match(r'python -m venv "\$(\w+)"$', line))
    name = re.match(r'python -m venv "\$(\w+)"$', lines[venv]).group(1)
    assert lines[venv + 1:] == [f'source "${name}/bin/activate"', lines[-1]], lines[venv:]
    assert not any("pip install" in line for line in lines[venv + 1:-1])


@pytest.mark.xdist_group("grouping-probe")
def test_xdist_groups_reach_the_scheduler(request):
    """pyproject's `--dist loadgroup` keeps the tests sharing an expensive module fixture (a venv, a
    build, the hostile runs) in one worker: pytest-xdist marks a grouped test's node id with
    `@group`, which the scheduler reads. Where pytest drops that mark (9.2 with xdist 3.8), every
    worker rebuilds every group's fixture and the suite costs twice the CPU."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("the groups are pytest-xdist's: this run has no workers")
    assert request.node.nodeid.endswith("@grouping-probe"), request.node.nodeid


def test_the_readme_is_a_newcomers_page_and_cites_no_internal_issue():
    """What a newcomer reads first stays short (the rest lives in docs/, linked from it); the
    project's own issue numbers mean nothing to a user."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for path in (ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")):
        assert not re.search(r"\bissues? \d+", path.read_text()), path.name
    for linked in re.findall(r"`(docs/[\w-]+\.md)`", readme):
        assert (ROOT / linked).is_file(), linked


def test_the_version_lives_in_pyproject_and_the_changelog_records_it():
    """One place for the version (pyproject.toml; --version and the JSON read the installed
    metadata, tests/test_packaging.py checks both from the wheel); CHANGELOG.md's newest
    released heading is that version."""
    import tomllib
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert [h for h in headings if h != "Unreleased"][:1] == [version]
    sources = [path for folder in ("pcpcheck", "spec", "reference", "impl")
               for path in (ROOT / folder).rglob("*.py")]
    assert not [path for path in sources if version in path.read_text()], "a second copy of the version"


# Each statement's folder and the name it installs under (pyproject.toml's package-dir).
IMPORT_NAME = {"spec": "pcpcheck_spec", "reference": "pcpcheck_reference", "impl": "pcpcheck_impl"}
# What each statement may import besides the standard library and itself: names, never logic.
ALLOWED = {
    "spec": ("pcpcheck_spec",),
    "reference": ("pcpcheck_reference", "numpy", "pcpcheck_spec.names"),
    "impl": ("pcpcheck_impl", "torch", "pcpcheck_spec.names"),
}
DYNAMIC = ("importlib", "__import__")  # imports the name-level check could not see


def _imported_names(path: Path, package: str) -> set[str]:
    """Every imported name, fully qualified (`from pcpcheck_spec import model` ->
    pcpcheck_spec.model), plus 'importlib' or '__import__' wherever either is used."""
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    module = ".".join([IMPORT_NAME[folder], *rest])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                parent = module.split(".")[: -node.level]
                base = ".".join(parent + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if base else alias.name for alias in node.names}
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name == "__import__":
                found.add(name)
    return found


def _allowed(name: str, package: str) -> bool:
    if name.split(".")[0] in DYNAMIC:
        return False
    if name.split(".")[0] in sys.stdlib_module_names or name.startswith("__future__"):
        return True
    return any(name == prefix or name.startswith(prefix + ".") for prefix in ALLOWED[package])


def _clashes(package: str) -> set[str]:
    return {f"{path.relative_to(ROOT)}: {name}" for path in (ROOT / package).rglob("*.py")
            for name in _imported_names(path, package) if not _allowed(name, package)}


def test_spec_reference_and_impl_share_only_spec_names():
    """Three independent statements: each may use spec.names, never another's logic, and no
    import hides from this check (importlib, __import__)."""
    for package in ALLOWED:
        assert not _clashes(package), f"{package}/ imports {sorted(_clashes(package))}"


def test_spec_names_holds_only_names_constants_and_plain_data():
    """No behaviour in the shared vocabulary: no function, no method or property on its types."""
    tree = ast.parse((ROOT / "spec" / "names.py").read_text())
    behaviour = [node.name for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                 or isinstance(node, ast.ClassDef) and node.decorator_list
                 and not all(_is_dataclass(d) for d in node.decorator_list)]
    assert not behaviour, f"spec/names.py defines behaviour: {behaviour}"


def _is_dataclass(decorator) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return getattr(target, "id", getattr(target, "attr", "")) == "dataclass"


def test_independence_check_sees_every_form_of_import(tmp_path, monkeypatch):
    """The check itself can fail: each hidden way of borrowing logic is caught."""
    for line in ("from pcpcheck_spec import model", "import pcpcheck_spec.invariants",
                 "from pcpcheck_spec.registry import IDS", "import importlib",
                 "x = __import__('pcpcheck_spec.model')", "from .. import impl",
                 "from spec import names", "import reference"):
        (tmp_path / "reference").mkdir(exist_ok=True)
        (tmp_path / "reference" / "leak.py").write_text(line + "\n")
        monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
        assert _clashes("reference"), line


def test_every_module_imports_first_in_a_fresh_interpreter():
    """No import cycle waits on the order a process happens to import modules in (torch stays
    loaded between imports: only the project's modules are fresh for each)."""
    import subprocess
    names = {"pcpcheck": "pcpcheck", **IMPORT_NAME}
    packages = tuple(names.values())
    modules = sorted(".".join([names[folder], *rest]).removesuffix(".__init__")
                     for folder in names for path in (ROOT / folder).rglob("*.py")
                     if path.name != "__main__.py"
                     for _, *rest in [path.relative_to(ROOT).with_suffix("").parts])
    script = f"""
import importlib, sys, torch
failed = []
for name in {modules!r}:
    for loaded in [m for m in sys.modules if m.split(".")[0] in {packages!r}]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{{name}}: {{type(exc).__name__}}: {{exc}}")
print("\\n".join(failed))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", done.stdout
    assert len(modules) > 30


def test_importing_impl_imports_no_part_of_the_checker():
    import subprocess
    done = subprocess.run([sys.executable, "-c", "import sys, pcpcheck_impl; print(sorted(m for m in "
                           "sys.modules if m == 'pcpcheck' or m.startswith('pcpcheck.')))"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_noqa_names_the_rule_it_waives_and_why():
    """`# noqa: RULE - why` (ruff's RUF100 keeps each one needed; this keeps each one explained)."""
    import tokenize
    unexplained = []
    for folder in ("pcpcheck", "spec", "reference", "impl", "tests", "benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            with path.open("rb") as handle:
                for token in tokenize.tokenize(handle.readline):
                    if (token.type == tokenize.COMMENT and "noqa" in token.string
                            and not re.search(r"noqa: [A-Z]+\d+(, ?[A-Z]+\d+)* - \S", token.string)):
                        unexplained.append(f"{path.relative_to(ROOT)}:{token.start[0]}: {token.string}")
    assert unexplained == []
