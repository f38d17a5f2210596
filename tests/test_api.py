"""pcpcheck.check (the API function) and what CI reads from it: the immutable, JSON-round-tripping result and its
documented schema, JUnit, baselines, budgets, progress, output paths checked before the run,
reproducers that can be pointed elsewhere, `diff --json/--seed`, and no `.hypothesis/` in the
caller's directory."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import pcpcheck
import pcpcheck_impl as impl
from pcpcheck.api import diff
from pcpcheck.faces import cli
from pcpcheck.judge.baseline import parse_baseline
from pcpcheck.render import outputs
from pcpcheck.render.progress import LinePrinter
from pcpcheck_spec.names import DRAFT_MIXED, REPLICA, REPLICATED, SHARD, SHARDED
from pcpcheck_spec.registry import (
    GATHER_IDS as IDS,  # `pcpcheck check`'s IDs (LAYOUT: pcpcheck vllm)
)

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "tests" / "zoo"
UPSTREAM = ZOO / "upstream.py"  # fails draft-mixed with REPLICA, holds elsewhere


@pytest.fixture(scope="module")
def upstream_result(threads_backend):
    return pcpcheck.check(UPSTREAM, regimes=(SHARDED, DRAFT_MIXED), max_examples=100,
                          runner=threads_backend)


# --- the result ---------------------------------------------------------------------------------

def _schema(title: str) -> dict:
    text = (ROOT / "docs" / "json-schema.md").read_text()
    for block in re.findall(r"```json\n(.*?)```", text, re.S):
        schema = json.loads(block)
        if schema["title"] == title:
            return schema
    raise AssertionError(f"no schema titled {title!r} in docs/json-schema.md")


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
          "integer": int, "number": (int, float)}


def conforms(value, schema: dict, where: str = "$") -> list[str]:
    """The JSON Schema keywords docs/json-schema.md uses, by hand (jsonschema is not a dependency)."""
    problems = []
    if "const" in schema and value != schema["const"]:
        return [f"{where}: {value!r} is not {schema['const']!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} not in {schema['enum']}"]
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(isinstance(value, _TYPES[n]) and not (isinstance(value, bool) and n in ("integer", "number"))
                 for n in names)
        if not ok:
            return [f"{where}: {type(value).__name__} is not {names}"]
    if "pattern" in schema and not re.search(schema["pattern"], value):
        return [f"{where}: {value!r} does not match {schema['pattern']!r}"]
    if isinstance(value, dict):
        problems += [f"{where}: missing {key}" for key in schema.get("required", ()) if key not in value]
        for key, item in value.items():
            if key in schema.get("properties", {}):
                problems += conforms(item, schema["properties"][key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                problems.append(f"{where}: unexpected {key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                problems += conforms(item, schema["additionalProperties"], f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += conforms(item, schema["items"], f"{where}[{index}]")
    return problems


def test_result_is_immutable_and_round_trips_through_json(upstream_result):
    with pytest.raises(dataclasses.FrozenInstanceError):
        upstream_result.counterexamples[0].known = True
    text = upstream_result.to_json()
    again = pcpcheck.CheckResult.from_json(text)
    assert again == upstream_result and again.to_json() == text
    assert again.counterexamples[0].observation is None  # the live observation stays in memory


def test_json_document_follows_the_documented_schema(upstream_result):
    document = json.loads(upstream_result.to_json())
    assert conforms(document, _schema("pcpcheck check result")) == []
    assert document["version"] == pcpcheck.api.version() and document["verdict"] == "violated"
    assert document["options"]["regimes"] == [SHARDED, DRAFT_MIXED]
    [counterexample] = document["counterexamples"]
    assert (counterexample["regime"], counterexample["invariant"], counterexample["ranks"]) == \
        (DRAFT_MIXED, REPLICA, [0, 1])
    assert counterexample["violations"][0] == {"invariant": REPLICA, "ranks": [0, 1]}
    assert document["stand_ins"] == ["vllm.distributed.parallel_state.get_pcp_group"]  # its import
    # the checker itself: a wrong document is caught
    broken = dict(document, verdict="maybe")
    del broken["options"]["seed"]
    assert len(conforms(broken, _schema("pcpcheck check result"))) == 2


def test_a_release_result_follows_the_documented_schema_and_round_trips():
    """`pcpcheck vllm`'s result: the same document, with the release, its files and the
    regimes it cannot reach (the fixture's manager rejects nothing: every regime is searched)."""
    result = pcpcheck.api.check_release(ROOT / "tests" / "vllmlike" / "release",
                                        regimes=(REPLICATED,), max_examples=5, max_ranks=2)
    document = json.loads(result.to_json())
    assert conforms(document, _schema("pcpcheck check result")) == []
    assert document["release"]["layout_model"] == "0.30" and document["release"]["files"]
    assert document["regimes"][REPLICATED]["invariants"]["LAYOUT"]["checked"] == 5
    assert pcpcheck.CheckResult.from_json(result.to_json()) == result


def test_a_callable_target_is_checked_by_its_importable_name():
    result = pcpcheck.check(impl.gather_prefill_cache_inputs, regimes=(REPLICATED,), max_examples=20)
    assert result.holds and result.target == "pcpcheck_impl.gather:gather_prefill_cache_inputs"
    with pytest.raises(pcpcheck.UsageError, match="module-level function importable by name"):
        pcpcheck.check(lambda tensors, slots, nd: None)


def test_bad_options_raise_usage_errors_naming_them():
    with pytest.raises(pcpcheck.UsageError, match="--max-ranks must be between 2 and 8"):
        pcpcheck.check("impl", max_ranks=9)
    with pytest.raises(pcpcheck.UsageError, match="regimes must be among"):
        pcpcheck.check("impl", regimes=("nope",))
    with pytest.raises(pcpcheck.LoadError, match="no such file"):
        pcpcheck.check("missing/pcp.py")


# --- JUnit, version -------------------------------------------------------------------------

def test_junit_has_a_case_per_regime_and_invariant(tmp_path, pcpcheck_check):
    junit = tmp_path / "out.xml"
    assert pcpcheck_check([UPSTREAM, "--regime", DRAFT_MIXED, "--max-examples", "60",
                           "--junit", junit]) == 1
    suite = ET.parse(junit).getroot()
    states = {case.get("name"): [child.tag for child in case] for case in suite.iter("testcase")}
    assert set(states) == set(IDS)
    assert states.pop(REPLICA) == ["failure"] and states.pop(SHARD) == ["skipped"]
    assert all(children == [] for children in states.values())
    failure = suite.find("testcase[@name='REPLICA']/failure")
    assert failure.get("message").startswith("REPLICA violated [hazard] on rank(s) [0, 1]")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("9", "1", "1")


def test_summary_is_the_verdict_table_in_markdown(tmp_path, pcpcheck_check, capsys):
    summary = tmp_path / "summary.md"
    assert pcpcheck_check([UPSTREAM, "--regime", DRAFT_MIXED, "--max-examples", "60",
                           "--summary", summary]) == 1
    assert f"--summary: wrote {summary}" in capsys.readouterr().out
    lines = summary.read_text().splitlines()
    assert lines[0].endswith(": 1 violation(s) (regime x invariant), 1 in hazard regimes; "
                             "1 counterexample(s), 1 shown")
    assert lines[2] == f"| invariant | {DRAFT_MIXED} (hazard) |"
    rows = dict(re.fullmatch(r"\| (\w+) \| (.*) \|", line).groups() for line in lines[4:4 + len(IDS)])
    assert set(rows) == set(IDS) and rows[SHARD] == "n/a [1]"
    assert f"- [1] {SHARD}: checked only with DCP (D > 1); {REPLICA} covers D = 1" in lines
    assert re.fullmatch(r"\d+/\d+ FAIL \*\*new\*\*", rows.pop(REPLICA))
    assert all(re.fullmatch(r"\d+ ok", cell) for invariant, cell in rows.items() if invariant != SHARD)
    assert any(line.startswith("- `REPLICA violated [hazard]") for line in lines)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"pcpcheck {pcpcheck.api.version()}"


# --- baseline -------------------------------------------------------------------------------

def test_baseline_accepts_known_violations_and_reports_the_ones_gone(tmp_path, threads_backend,
                                                                     pcpcheck_check, capsys):
    baseline = tmp_path / "known.txt"
    baseline.write_text(f"# upstream keeps T[:nd]\n{DRAFT_MIXED} {REPLICA}  # bug class 10\n"
                        f"\n{SHARDED} {REPLICA}\n")
    code = pcpcheck_check([UPSTREAM, "--regime", SHARDED, "--regime", DRAFT_MIXED,
                           "--max-examples", "100", "--baseline", baseline])
    out = capsys.readouterr().out
    assert code == 0
    assert "Counterexample 1 (known: in the baseline): REPLICA violated" in out
    assert f"no longer found, remove from {baseline}: {SHARDED} {REPLICA}" in out
    # the same baseline does not hide a new violation
    baseline.write_text(f"{SHARDED} {REPLICA}\n")
    result = pcpcheck.check(UPSTREAM, regimes=(DRAFT_MIXED,), max_examples=100, baseline=baseline,
                            runner=threads_backend)
    assert not result.holds and result.exit_code == 1
    assert result.baseline.fixed == ()  # sharded was not checked: nothing to say about it


@pytest.mark.parametrize("text, message", [
    ("sharded\n", "known.txt:1: expected 'REGIME INVARIANT'"),
    ("# ok\nsharded NOPE\n", "known.txt:2: unknown invariant 'NOPE'"),
    ("nope REPLICA\n", "known.txt:1: unknown regime 'nope'"),
])
def test_bad_baseline_lines_are_named(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_baseline(text, "known.txt")


# --- jobs: regimes searched by several driver processes -------------------------------------

def _without_times(result) -> dict:
    document = json.loads(result.to_json())
    document.pop("seconds")
    for regime in document["regimes"].values():
        for timed in ("seconds", "check_seconds", "slowest_call", "mean_call"):
            regime.pop(timed)
    return document


def test_jobs_do_not_change_the_result():
    target, regimes = ZOO / "bug01_local_block.py", (SHARDED, REPLICATED, "dcp")
    alone = pcpcheck.check(target, regimes=regimes, max_examples=150, jobs=1)
    together = pcpcheck.check(target, regimes=regimes, max_examples=150, jobs=2)
    assert not alone.holds and [s.cases for s in alone.regimes] == [s.cases for s in together.regimes]
    assert _without_times(together) == _without_times(alone)


def test_a_driver_process_that_cannot_load_the_target_is_one_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('no such thing')\n")
    with pytest.raises(pcpcheck.LoadError, match="broken.py"):
        pcpcheck.check(broken, regimes=(SHARDED, REPLICATED), max_examples=5, jobs=2)


# --- budget and progress --------------------------------------------------------------------

def test_budget_stops_every_regime_and_says_how_far_each_got():
    started = time.monotonic()
    result = pcpcheck.check("impl", regimes=(SHARDED, REPLICATED), max_examples=10**6, budget_s=1.5)
    assert time.monotonic() - started < 10
    assert [s.budget_reached for s in result.regimes] == [True, True]
    assert all(s.cases > 0 for s in result.regimes) and result.holds


SLOW_AND_WRONG = """
import time


def gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    time.sleep(0.1)  # each case takes >= 0.2 s: the budget runs out while it shrinks
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # writes nothing
"""


def test_budget_line_of_the_report_gives_the_cases_per_regime(pcpcheck_check, capsys):
    assert pcpcheck_check(["--regime", SHARDED, "--regime", REPLICATED,
                           "--max-examples", "1000000", "--budget", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"budget of 1 s reached; cases per regime: {SHARDED} \d+, {REPLICATED} \d+", out)
    assert out.count("(budget reached)") == 2


def test_budget_keeps_the_violations_found_before_it_ran_out(tmp_path, threads_backend):
    target = tmp_path / "slow.py"
    target.write_text(SLOW_AND_WRONG)
    result = pcpcheck.check(target, regimes=(REPLICATED,), max_examples=10**6, budget_s=2,
                            runner=threads_backend)
    assert result.regimes[0].budget_reached
    assert [c.invariant for c in result.counterexamples] == [REPLICA]


def test_progress_is_live_on_a_terminal_and_silent_otherwise(threads_backend):
    live, piped = io.StringIO(), io.StringIO()
    for printer in (LinePrinter(live, live=True), LinePrinter(piped)):
        pcpcheck.check("impl", regimes=(REPLICATED,), max_examples=20, progress=printer,
                       runner=threads_backend)
    assert re.search(r"\r\x1b\[K  replicated +\d+ cases +\d+ cases/s  0 violation", live.getvalue())
    assert "\r" not in piped.getvalue() and "replicated" in piped.getvalue()


# --- outputs never mask the verdict ---------------------------------------------------------

@pytest.mark.parametrize("option", ["--json", "--junit", "--summary", "--repro-dir", "--html"])
def test_unusable_output_path_is_refused_before_the_run(option, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    started = time.monotonic()
    code = cli.main(["check", str(UPSTREAM), option, str(blocker / "out")])
    captured = capsys.readouterr()
    assert code == 2 and option in captured.err and "checking" not in captured.out
    assert time.monotonic() - started < 5


def test_a_write_that_fails_after_the_run_leaves_the_verdict(tmp_path, monkeypatch, pcpcheck_check,
                                                             capsys):
    def refuse(path, text):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(outputs, "_write_text", refuse)
    code = pcpcheck_check([UPSTREAM, "--regime", DRAFT_MIXED, "--max-examples", "60",
                           "--json", tmp_path / "out.json"])
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot write" in err and "the verdict above stands (exit 1)" in err


def test_no_hypothesis_directory_where_pcpcheck_runs(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # a violation, so that hypothesis runs (it shrinks what the generation found)
    run = subprocess.run([sys.executable, "-m", "pcpcheck", "check", str(UPSTREAM), "--regime",
                          DRAFT_MIXED, "--max-examples", "60"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert not (tmp_path / ".hypothesis").exists()
    assert [p.name for p in tmp_path.iterdir()] in ([], ["cache"])  # nothing in the working dir


# --- reproducers ----------------------------------------------------------------------------

def test_reproducer_names_the_target_relative_to_itself_and_can_be_pointed_elsewhere(
        tmp_path, monkeypatch, pcpcheck_check):
    monkeypatch.chdir(ROOT)
    target = "tests/zoo/bug04_truncated_slots.py"
    assert pcpcheck_check([target, "--regime", SHARDED, "--max-examples", "100",
                           "--repro-dir", tmp_path]) == 1
    [reproducer] = tmp_path.glob("test_repro_*.py")
    relative = os.path.relpath(ROOT / target, tmp_path)  # to the reproducer's own folder
    assert f"__file__)), {relative!r}))" in reproducer.read_text()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def pytest_run(**extra):
        # -n 0: one test, not the pytest-xdist workers this project's addopts would start
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                               str(reproducer)], cwd=ROOT, env={**env, **extra},
                              capture_output=True, text=True, timeout=120)

    broken = pytest_run()
    assert broken.returncode == 1 and "REPLICA violated" in broken.stdout
    fixed = pytest_run(PCPCHECK_TARGET=str(ZOO / "correct.py"))
    assert fixed.returncode == 0, fixed.stdout


# --- diff -----------------------------------------------------------------------------------

def test_diff_writes_json_and_honours_the_seed(tmp_path):
    out = tmp_path / "diff.json"
    bug = str(ZOO / "bug01_local_block.py")
    assert cli.main(["diff", "impl", bug, "--regime", REPLICATED, "--max-examples", "50",
                     "--seed", "2", "--json", str(out)]) == 1
    document = json.loads(out.read_text())
    assert conforms(document, _schema("pcpcheck diff result")) == []
    assert document["verdict"] == "different" and document["options"]["seed"] == 2
    runs = {seed: diff("impl", bug, regimes=(REPLICATED,), max_examples=50, seed=seed).regimes[0]
            for seed in (1, 2)}
    assert document["regimes"][0]["cases"] == runs[2].cases
    assert runs[1] != runs[2]  # another seed draws other cases
