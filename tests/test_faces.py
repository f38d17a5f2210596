"""The faces render the API's result and keep no logic of their own: one answer per regime x
invariant (the terminal, the exit code, JSON, HTML, JUnit, the pytest plugin in
tests/test_plugin.py), `diff` on the same search and regimes as `check`, a fast `--version`,
where each output went, errors in words."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pcpcheck.faces.cli import main
from pcpcheck_spec.names import DRAFT, PAD_HYGIENE, REPLICA, REPLICATED, SHARDED, UNIQUE

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "tests" / "zoo"
# draft: zero padding rows paired with slot 0; every counterexample is reported under UNIQUE or
# PAD_HYGIENE, and REPLICA fails beside them (never first)
ZERO_PAD = ZOO / "bug07_zero_pad.py"
LEGACY = ZOO / "legacy_no_shard.py"  # a gather of an era without shard_decode_requests


@pytest.fixture(scope="module")
def zero_pad_draft(tmp_path_factory, threads_backend):
    """`check bug07 --regime draft --baseline 'draft REPLICA'` with every output, once."""
    import pcpcheck
    base = tmp_path_factory.mktemp("zero-pad")
    baseline = base / "known.txt"
    baseline.write_text(f"{DRAFT} {REPLICA}\n")
    return pcpcheck.check(ZERO_PAD, regimes=(DRAFT,), max_examples=300, baseline=baseline,
                          runner=threads_backend), baseline


def test_a_listed_invariant_violated_beside_another_is_found_not_gone(zero_pad_draft, tmp_path,
                                                                       pcpcheck_check, capsys):
    result, baseline = zero_pad_draft
    violated = result.summary(DRAFT).violated
    assert violated[REPLICA] and violated[UNIQUE]
    assert REPLICA not in {c.invariant for c in result.counterexamples}  # never reported first
    assert result.baseline.known == ((DRAFT, REPLICA),) and result.baseline.fixed == ()
    assert result.outcome(DRAFT, REPLICA)[0] == "known"
    assert result.outcome(DRAFT, UNIQUE)[0] == "failed" and result.exit_code == 1
    assert not any(c.known for c in result.counterexamples)  # each also shows an unlisted one
    code = pcpcheck_check([ZERO_PAD, "--regime", DRAFT, "--max-examples", "300",
                           "--baseline", baseline])
    assert code == 1 and "no longer found" not in capsys.readouterr().out
    # every violated invariant listed: the run holds, as the table says
    baseline.write_text("".join(f"{DRAFT} {i}\n" for i in violated))
    assert pcpcheck_check([ZERO_PAD, "--regime", DRAFT, "--max-examples", "300",
                           "--baseline", baseline]) == 0
    assert "no violation outside the baseline" in capsys.readouterr().out


def test_every_violated_invariant_cites_a_counterexample_that_shows_it(zero_pad_draft):
    result, _ = zero_pad_draft
    for regime, invariant in result.failures + result.baseline.known:
        state, cited = result.outcome(regime, invariant)
        assert cited is not None and invariant in {v.invariant for v in cited.violations}


def test_html_index_gives_the_table_cells_the_terminal_gives(zero_pad_draft, tmp_path):
    from pcpcheck.render import report
    from pcpcheck.render.html import write_html
    result, _ = zero_pad_draft
    write_html(str(tmp_path), result)
    index = (tmp_path / "index.html").read_text()
    count = result.summary(DRAFT).count(REPLICA)
    # each cell marked by its outcome: REPLICA is baselined (known), the others new violations
    assert re.search(rf'<td class="known"[^>]*>{count.violated}/{count.checked} FAIL</td>', index)
    table = "\n".join(report.verdict_table(result.regimes))
    for invariant, state in ((REPLICA, "known"), (UNIQUE, "fail"), (PAD_HYGIENE, "fail")):
        count = result.summary(DRAFT).count(invariant)
        cell = report.cell(count.checked, count.violated)
        assert re.search(rf'<td class="{state}"[^>]*>{cell}</td>', index) and cell in table


def test_junit_gives_a_regime_the_target_cannot_reach_its_reason(tmp_path, pcpcheck_check):
    junit = tmp_path / "junit.xml"
    assert pcpcheck_check([LEGACY, "--regime", SHARDED, "--regime", REPLICATED,
                           "--max-examples", "30", "--junit", junit]) == 0
    skipped = {case.get("name"): case.find("skipped").get("message")
               for case in ET.parse(junit).getroot().iter("testcase")
               if case.get("classname") == f"pcpcheck.{SHARDED}"}
    assert skipped and all(m.startswith(f"regime {SHARDED} is not applicable to this target: the "
                                        "gather has no shard_decode_requests parameter")
                           for m in skipped.values()), skipped


def test_diff_does_not_search_a_regime_check_finds_not_applicable(tmp_path, capsys):
    out = tmp_path / "diff.json"
    assert main(["diff", str(LEGACY), str(ZOO / "correct.py"), "--regime", SHARDED,
                 "--regime", REPLICATED, "--max-examples", "50", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(rf"^  {SHARDED} +not applicable: old \({re.escape(str(LEGACY))}\): the "
                     "gather has no shard_decode_requests parameter", printed, re.M), printed
    regimes = {r["regime"]: r for r in json.loads(out.read_text())["regimes"]}
    assert regimes[SHARDED]["cases"] == 0 and regimes[SHARDED]["case"] is None
    assert regimes[REPLICATED]["not_applicable"] is None and regimes[REPLICATED]["cases"] == 50


def test_diff_finds_a_difference_with_the_checks_search(tmp_path):
    """The smallest differing case, shrunk by the engine (P = 2, one 2-token prefill: the
    truncated slot map drops rank 1's row)."""
    from pcpcheck.api import diff
    result = diff(ZOO / "correct.py", ZOO / "bug04_truncated_slots.py", regimes=(REPLICATED,),
                  max_examples=300)
    (found,) = result.regimes
    assert result.exit_code == 1 and found.case is not None
    case = json.loads(found.case)["batch"]
    assert case["pcp_size"] == 2 and sum(r["num_tokens"] for r in case["requests"]) <= 2
    assert f"new = {ZOO / 'bug04_truncated_slots.py'}: violates REPLICA" in found.report


def test_version_answers_without_importing_torch_numpy_or_hypothesis():
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "pcpcheck", "--version"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("pcpcheck ")
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "pcpcheck" in imported and not imported & {"torch", "numpy", "hypothesis"}, imported


def test_the_run_says_where_each_output_went(tmp_path, pcpcheck_check, capsys):
    paths = {"--json": tmp_path / "out.json", "--junit": tmp_path / "out.xml",
             "--html": tmp_path / "pages", "--repro-dir": tmp_path / "repros"}
    code = pcpcheck_check([ZERO_PAD, "--regime", DRAFT, "--max-examples", "100",
                           *[str(part) for pair in paths.items() for part in pair]])
    out = capsys.readouterr().out
    assert code == 1
    assert f"--json: wrote {paths['--json']}" in out and f"--junit: wrote {paths['--junit']}" in out
    pages = re.search(r"^--html: wrote (\d+) page\(s\), start at (\S+)$", out, re.M)
    assert pages and Path(pages.group(2)) == paths["--html"] / "index.html"
    assert int(pages.group(1)) == len(list(paths["--html"].iterdir()))
    repros = re.search(r"^--repro-dir: wrote (\d+) reproducer\(s\) into (\S+)$", out, re.M)
    assert repros and int(repros.group(1)) == len(list(paths["--repro-dir"].iterdir())) > 0


@pytest.mark.parametrize("argv", [
    ["check", "does/not/exist.py"],
    ["check", "--regime", "sideways"],
    ["vllm", "/nonexistent/checkout"],
    ["check", "impl", "--replay", '{"batch": 1}'],
])
def test_errors_are_words_not_class_names(argv, capsys):
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert re.match(r"^pcpcheck: [a-z][a-zA-Z ]+: \S", line), line
    assert not re.search(r"\b\w*(Error|Drift): ", line), line


def test_a_release_without_a_pcp_path_is_refused_before_any_download(monkeypatch, capsys):
    from pcpcheck.shared import source

    def no_download(*args, **kwargs):
        raise AssertionError("fetched a wheel")

    monkeypatch.setattr(source, "fetch_release", no_download)
    assert main(["vllm", "0.25.0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "pcpcheck: cannot read the vLLM source: vLLM 0.25.0 has no PCP path to check: "
        "vllm/v1/worker/gpu/pcp_manager.py first ships in 0.26.0")


def test_a_reproducer_runs_from_any_directory(tmp_path):
    """A relative target (`pcpcheck check my_pcp.py --repro-dir repros`) is named relative to the
    reproducer's own file: run from repros/ or from elsewhere, it fails with the invariant, not
    with "no such file"."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_pcp.py").write_text((ZOO / "bug04_truncated_slots.py").read_text())
    done = subprocess.run([sys.executable, "-m", "pcpcheck", "check", "my_pcp.py", "--regime",
                           REPLICATED, "--max-examples", "100", "--repro-dir", "repros"],
                          cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr
    (reproducer,) = (work / "repros").iterdir()
    assert "Needs pcpcheck and pytest installed" in reproducer.read_text()
    for cwd in (work / "repros", tmp_path):
        ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              str(reproducer)], cwd=cwd, capture_output=True, text=True,
                             timeout=300)
        assert ran.returncode == 1, ran.stdout[-2000:] + ran.stderr
        assert "REPLICA violated" in ran.stdout and "LoadError" not in ran.stdout, ran.stdout[-2000:]
