"""Promises of the project itself: the main job's report covers SPEC.md, the README's commands
are what CI runs, and the three statements stay independent."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from pcpcheck.cli import main
from spec.names import DCP, INVARIANTS, LAYOUT, PRECONDITIONS, REGIMES, REPLICA, SHARD

ROOT = Path(__file__).resolve().parent.parent


def test_spec_md_states_exactly_the_ids_of_spec_names():
    headings = re.findall(r"^### (\w+)$", (ROOT / "spec" / "SPEC.md").read_text(), re.M)
    assert headings == [LAYOUT, *INVARIANTS, *PRECONDITIONS]  # LAYOUT: pcpcheck vllm only


def test_main_job_reports_every_invariant_with_cases_in_every_regime_it_applies_to(tmp_path, capsys):
    verdict = tmp_path / "verdict.json"
    assert main(["--max-examples", "25", "--json", str(verdict)]) == 0
    printed = capsys.readouterr().out
    regimes = json.loads(verdict.read_text())["regimes"]
    assert list(regimes) == list(REGIMES)
    for regime, result in regimes.items():
        not_applicable = REPLICA if regime == DCP else SHARD
        for invariant in INVARIANTS:
            checked = result["invariants"].get(invariant, {"checked": 0})["checked"]
            assert (checked > 0) == (invariant != not_applicable), (regime, invariant)
    for invariant in INVARIANTS:
        assert re.search(rf"^{invariant} .*\b\d+ ok", printed, re.M), invariant


def test_ci_runs_the_readme_test_command():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = (ROOT / "README.md").read_text()
    assert command in readme
    assert "pip install torch==2.13.0 -e . && pcpcheck" in readme


def _imports(package: str) -> set[str]:
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module)
    return found


def test_spec_reference_and_impl_share_only_spec_names():
    """Three independent statements: each may use spec.names, never another's logic."""
    for package, foreign in (("spec", ("numpy", "torch", "reference", "impl", "pcpcheck")),
                             ("reference", ("spec.model", "spec.invariants", "impl", "pcpcheck", "torch")),
                             ("impl", ("spec.model", "spec.invariants", "reference", "pcpcheck",
                                       "numpy"))):
        imported = _imports(package)
        clashes = {m for m in imported for f in foreign if m == f or m.startswith(f + ".")}
        assert not clashes, f"{package}/ imports {sorted(clashes)}"
