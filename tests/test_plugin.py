"""The pytest plugin as a host suite uses it: a subprocess pytest with --pcp-target on zoo
targets, judged from its JUnit XML, and the `pcpcheck` fixture under the host's hypothesis
profile and seed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

from pcpcheck_spec.names import (
    DCP,
    DRAFT,
    DRAFT_MIXED,
    HAZARD_REGIMES,
    PAD_HYGIENE,
    REPLICA,
    SHARD,
    SHARDED,
    UNIQUE,
)
from pcpcheck_spec.registry import (
    GATHER_IDS as IDS,  # `pcpcheck check`'s IDs (LAYOUT: pcpcheck vllm)
)

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "tests" / "zoo"

HOST_CONFTEST = '''
from hypothesis import settings
settings.register_profile("host", max_examples=40, derandomize=True, database=None)
settings.load_profile("host")
'''

HOST_TESTS = '''
import sys
import threading


def test_plugin_is_idle_without_targets(request):
    if not request.config.getoption("pcp_target"):
        assert "pcpcheck.api" not in sys.modules


def test_fixture_takes_the_host_profile_and_leaves_nothing_behind(pcpcheck):
    streams = sys.stdout, sys.stderr
    result = pcpcheck("impl", regimes=("replicated",))
    assert result.holds
    assert result.options.max_examples == 40  # the host profile's
    assert result.options.seed == EXPECTED_SEED
    assert (sys.stdout, sys.stderr) == streams
    assert not [t for t in threading.enumerate() if t.name.startswith("pcpcheck-ranks")]
'''


def _host_pytest(tmp_path: Path, *args: str, seed: int | None = None) -> tuple[subprocess.CompletedProcess, ET.Element]:
    (tmp_path / "conftest.py").write_text(HOST_CONFTEST)
    (tmp_path / "test_host.py").write_text(f"EXPECTED_SEED = {seed!r}\n" + HOST_TESTS)
    junit = tmp_path / "junit.xml"
    # The plugin by name, whether or not this checkout is pip-installed (its entry point would
    # load it a second time); hypothesis's plugin for --hypothesis-seed.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "pcpcheck.faces.pytest_plugin",
                          "-p", "_hypothesis_pytestplugin", "-p", "no:cacheprovider",
                          f"--junitxml={junit}", *args, *(
                              [f"--hypothesis-seed={seed}"] if seed is not None else [])],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert junit.exists(), run.stdout + run.stderr
    return run, ET.parse(junit).getroot()


def _outcomes(root: ET.Element) -> dict[tuple[str, str], tuple[str, str]]:
    """(classname, name) -> (passed | failed | skipped, failure text)."""
    outcomes = {}
    for case in root.iter("testcase"):
        state, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state, text = "failed", (child.get("message") or "") + (child.text or "")
            elif child.tag == "skipped":
                state, text = "skipped", child.get("message") or ""
        outcomes[case.get("classname"), case.get("name")] = (state, text)
    return outcomes


def test_each_regime_x_invariant_is_an_item_failing_with_its_counterexample(tmp_path):
    run, root = _host_pytest(tmp_path, f"--pcp-target={ZOO / 'bug03_nd_ownership.py'}",
                             f"--pcp-target={ZOO / 'upstream.py'}", "--pcp-regime", SHARDED,
                             "--pcp-regime", DRAFT_MIXED)
    assert run.returncode == 1, run.stdout
    outcomes = _outcomes(root)
    # item -> the ranks its minimal counterexample names (the peer's decode is lost on rank 1)
    expected_failures = {("pcpcheck:bug03_nd_ownership", f"{REPLICA}[{SHARDED}]"): [1],
                         ("pcpcheck:upstream", f"{REPLICA}[{DRAFT_MIXED}]"): [0, 1]}
    for target in ("pcpcheck:bug03_nd_ownership", "pcpcheck:upstream"):
        for regime in (SHARDED, DRAFT_MIXED):
            for invariant in IDS:
                key = (target, f"{invariant}[{regime}]")
                state, text = outcomes.pop(key)
                if key in expected_failures:
                    assert state == "failed", key
                    hazard = " [hazard]" if regime in HAZARD_REGIMES else ""
                    assert text.startswith(f"{invariant} violated{hazard} on rank(s) "
                                           f"{expected_failures[key]} (regime {regime})"), text
                    assert "replay: pcpcheck check" in text
                elif invariant == SHARD:
                    # the verdict table's footnote for it (render.report.not_applicable_reason)
                    assert state == "skipped" and f"{SHARD}: checked only with DCP" in text, key
                elif key[0].endswith("bug03_nd_ownership") and regime == SHARDED:
                    assert state in ("passed", "failed"), key  # may fail alongside REPLICA
                else:
                    assert state == "passed", (key, text)
    # what is left: the host suite's own tests, which pass
    assert {name: state for (_, name), (state, _) in outcomes.items()} == {
        "test_plugin_is_idle_without_targets": "passed",
        "test_fixture_takes_the_host_profile_and_leaves_nothing_behind": "passed"}


def test_baseline_turns_a_known_violation_into_an_xfail_and_a_correct_target_passes(tmp_path):
    baseline = tmp_path / "known.txt"
    baseline.write_text(f"# vLLM keeps T[:nd]\n{DRAFT_MIXED} {REPLICA}\n")
    run, root = _host_pytest(tmp_path, f"--pcp-target={ZOO / 'upstream.py'}",
                             f"--pcp-target={ZOO / 'correct.py'}", "--pcp-regime", DRAFT_MIXED,
                             "--pcp-regime", DCP, f"--pcp-baseline={baseline}", seed=1234)
    assert run.returncode == 0, run.stdout
    outcomes = _outcomes(root)
    state, text = outcomes["pcpcheck:upstream", f"{REPLICA}[{DRAFT_MIXED}]"]
    assert state == "skipped" and "known violation" in text  # JUnit records an xfail as skipped
    failed = [key for key, (state, _) in outcomes.items() if state == "failed"]
    assert not failed
    passed = {name for (target, name), (state, _) in outcomes.items()
              if target == "pcpcheck:correct" and state == "passed"}
    assert passed == {f"{i}[{r}]" for r in (DRAFT_MIXED, DCP) for i in IDS
                      if i != (SHARD if r == DRAFT_MIXED else REPLICA)}


def test_a_target_that_cannot_load_fails_its_items_with_one_line(tmp_path):
    run, root = _host_pytest(tmp_path, f"--pcp-target={tmp_path / 'missing.py'}",
                             "--pcp-regime", SHARDED, "-k", "RETURNS")
    texts = [text for (target, _), (state, text) in _outcomes(root).items()
             if target == "pcpcheck:missing" and state == "failed"]
    assert run.returncode == 1 and len(texts) == 1
    assert "cannot load target: " in texts[0] and "missing.py: no such file" in texts[0]


def test_plugin_is_declared_as_a_pytest11_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"pcpcheck": "pcpcheck.faces.pytest_plugin"}


def test_the_plugin_answers_each_item_as_the_command_line_answers_the_run(tmp_path, pcpcheck_check):
    """bug07 in draft: REPLICA fails beside UNIQUE and PAD_HYGIENE, never first. Listed alone it
    is known (an xfail) and the others still fail, as the command line exits 1; every violated
    invariant listed, both pass. The terminal counts the items it runs."""
    target = ZOO / "bug07_zero_pad.py"
    baseline = tmp_path / "known.txt"
    for listed, code in (((REPLICA,), 1), ((REPLICA, UNIQUE, PAD_HYGIENE), 0)):
        baseline.write_text("".join(f"{DRAFT} {i}\n" for i in listed))
        run, root = _host_pytest(tmp_path, f"--pcp-target={target}", "--pcp-regime", DRAFT,
                                 f"--pcp-baseline={baseline}")
        outcomes = _outcomes(root)
        mine = {name: state for (owner, name), (state, _) in outcomes.items()
                if owner == "pcpcheck:bug07_zero_pad"}
        assert mine[f"{REPLICA}[{DRAFT}]"] == "skipped"  # JUnit records an xfail as skipped
        assert "known violation" in outcomes["pcpcheck:bug07_zero_pad", f"{REPLICA}[{DRAFT}]"][1]
        assert mine[f"{UNIQUE}[{DRAFT}]"] == ("failed" if code else "skipped")
        assert run.returncode == code, run.stdout
        # the host profile's 40 examples, derandomized: the command line's same cases
        assert pcpcheck_check([target, "--regime", DRAFT, "--max-examples", "40",
                               "--baseline", baseline]) == code
        collected = re.search(r"^collected (\d+) items", run.stdout, re.M)
        assert collected and int(collected.group(1)) == len(outcomes), run.stdout
