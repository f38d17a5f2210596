"""Details of the report a vLLM reviewer reads: a coverage feature the kind of run cannot reach
is n/a (not 0) in the text, the HTML and the JSON; a regime's throughput is one labelled figure;
the Markdown summary counts violations and counterexamples in the text report's words; one bug
is one shown counterexample (REPLICA and SHARD are one check under two names); `pcpcheck vllm`
prints its verdict before the provenance of the release it judged; every n/a of a verdict table
gives its reason; the summary says where the rest of each counterexample is."""

from __future__ import annotations

import dataclasses
import html
import io
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from pcpcheck import api
from pcpcheck.api import assemble
from pcpcheck.faces.cli import main
from pcpcheck.judge import coverage
from pcpcheck.render import report
from pcpcheck.render.html import index_page
from pcpcheck.render.progress import LinePrinter
from pcpcheck.render.summary import summary_markdown
from pcpcheck.search.engine import RegimeResult
from pcpcheck.shared.case import Case, TensorSpec
from pcpcheck.shared.results import CheckResult, InvariantCount, RegimeSummary
from pcpcheck_spec.names import (
    DCP,
    DRAFT,
    PAD_HYGIENE,
    PAIRING,
    REPLICA,
    REPLICATED,
    SHARD,
    SHARDED,
    Batch,
    Request,
)
from tests.test_vllm import RELEASE_TREE, checkout

ZOO = Path(__file__).resolve().parent / "zoo"
KV_GROUPS = coverage.KV_GROUPS


def _coverage_row(text: str, name: str) -> list[str]:
    """One row of a report's coverage table: its cells, one per regime."""
    table = text[text.index("coverage (cases)"):]
    line = next(line for line in table.splitlines() if line.startswith(name + "  "))
    return line[len(name):].split()


def _step(regime=SHARDED) -> Case:
    return Case(Batch(regime, 2, (Request(1, False, 0, (0,)),), 1, graph_size=2),
                (TensorSpec((4,), "float32"),))


# --- 1. a feature the run cannot reach is n/a ---------------------------------------------------

def test_unreachable_features_are_those_of_the_kind_of_run():
    """A gather checked alone makes one call per case (one KV group); a release calls it again
    for its second KV group only in dcp, where that group is replicated."""
    synchronous = set(coverage.TRACE_FEATURES)  # no stream trace judged: no --async, no streams
    assert coverage.unreachable(SHARDED) == coverage.unreachable(DCP) == {KV_GROUPS, *synchronous}
    replicated_group = {"replicated_kv_group": True}
    assert coverage.unreachable(DCP, replicated_group) == synchronous
    assert coverage.unreachable(SHARDED, replicated_group) == {KV_GROUPS, *synchronous}
    assert coverage.unreachable(DCP, {"replicated_kv_group": False}) == {KV_GROUPS, *synchronous}
    # an asynchronous run counts all three, 0 included, once any of them is counted; a gather
    # whose streams are judged without a protocol, its two
    assert coverage.unreachable(SHARDED, None, {coverage.ASYNC_DECLINED: 1}) == {
        KV_GROUPS, *coverage.STREAM_FEATURES}
    assert coverage.unreachable(SHARDED, None, {coverage.MAIN_STREAM_ONLY: 1}) == {
        KV_GROUPS, *coverage.ASYNC_FEATURES}
    # reachable: counted, 0 included; unreachable: left out, unless a case did reach it
    dcp = RegimeResult(regime=DCP, cases=3)
    assert dict(assemble.summary(dcp, replicated_group).features)[KV_GROUPS] == 0
    assert KV_GROUPS not in dict(assemble.summary(dcp).features)
    dcp.features[KV_GROUPS] = 2
    assert dict(assemble.summary(dcp).features)[KV_GROUPS] == 2


def test_a_gather_check_shows_several_kv_groups_as_na_everywhere(threads_backend, tmp_path):
    result = api.replay_case("impl", _step(), runner=threads_backend)
    (summary,) = result.regimes
    features = dict(summary.features)
    assert KV_GROUPS not in features and features[coverage.GRAPH_PADDING] == 1
    assert set(features) == set(coverage.FEATURES) - {KV_GROUPS, *coverage.TRACE_FEATURES}
    text = report.result_text(result)
    assert _coverage_row(text, KV_GROUPS) == ["n/a"]
    assert _coverage_row(text, coverage.INTERLEAVE_2) == ["0"]  # reachable, not reached: 0
    # the JSON leaves the key out, and reads back the same
    document = json.loads(result.to_json())
    assert KV_GROUPS not in document["regimes"][SHARDED]["coverage"]["features"]
    assert CheckResult.from_json(result.to_json()).regimes == result.regimes
    page = index_page(result, [])
    assert f"<tr><th>{KV_GROUPS}</th><td>n/a</td></tr>" in page
    assert f"<tr><th>{coverage.INTERLEAVE_2}</th><td>0</td></tr>" in page


# --- 2. throughput once, labelled ---------------------------------------------------------------

def _summary(regime, cases=300, seconds=1.5, check_seconds=0.5, **kwargs) -> RegimeSummary:
    return RegimeSummary(regime=regime, cases=cases, seconds=seconds, check_seconds=check_seconds,
                         invariants=kwargs.pop("invariants", (InvariantCount(REPLICA, cases, 0),)),
                         budget_reached=False, **kwargs)


def test_a_regime_line_gives_one_throughput_labelled():
    stream = io.StringIO()
    LinePrinter(stream, live=False).finished(_summary(SHARDED))
    line = stream.getvalue().strip()
    assert line.count("cases/s") == 1, line
    assert re.search(r"300 cases in +1\.5 s: +200 cases/s end to end +holds$", line), line
    # the whole run's line, the regimes' times summed (a release: no wall clock of its own)
    assert report.rates(_summary(SHARDED), _summary(DCP)).count("cases/s") == 1
    assert report.rates(_summary(SHARDED), _summary(DCP)).endswith("200 cases/s end to end")


# --- 3. the summary's counts are the report's ---------------------------------------------------

@pytest.fixture(scope="module")
def bug07(threads_backend):
    """Padding rows zeroed: 13 FAIL cells over the four regimes, 6 counterexamples (one per
    invariant a regime violated first), 2 of them shown."""
    return api.check(ZOO / "bug07_zero_pad.py", max_examples=300, runner=threads_backend)


def _text_verdict(text: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith("all regimes: "))
    return line.split(" cases/s: ", 1)[1]


def _cells(result) -> list[tuple[str, str]]:
    return [(s.regime, c.invariant) for s in result.regimes for c in s.invariants if c.violated]


def test_the_summary_says_what_the_report_says(bug07):
    cells = _cells(bug07)
    shown = [c for c in bug07.counterexamples if c.folded_into is None]
    assert len(cells) > len(bug07.counterexamples) > len(shown)  # three different counts
    words = (f"{len(cells)} violation(s) (regime x invariant); {len(bug07.counterexamples)} "
             f"counterexample(s), {len(shown)} shown, "
             f"{len(bug07.counterexamples) - len(shown)} folded into them")
    text = report.result_text(bug07)
    assert _text_verdict(text) == words
    assert "\n".join(report.verdict_table(bug07.regimes)).count(" FAIL") == len(cells)
    assert text.count("\nCounterexample ") == len(shown)
    markdown = summary_markdown(bug07)
    assert markdown.splitlines()[0].endswith(f": {words}"), markdown
    assert markdown.count(" FAIL **new**") == len(cells)
    assert markdown.count("\n- `") == len(shown)


def test_known_violations_are_counted_as_cells_in_both(bug07, tmp_path, threads_backend):
    """A baseline listing every violated cell: no violation outside it, in the same words."""
    cells = _cells(bug07)
    baseline = tmp_path / "known"
    baseline.write_text("".join(f"{regime} {invariant}\n" for regime, invariant in cells))
    result = api.check(ZOO / "bug07_zero_pad.py", max_examples=300, baseline=baseline,
                       runner=threads_backend)
    assert result.holds
    words = _text_verdict(report.result_text(result))
    assert words.startswith(f"no violation outside the baseline ({len(cells)} known from it); ")
    assert summary_markdown(result).splitlines()[0].endswith(f": {words}")


# --- 4. one bug, one shown counterexample --------------------------------------------------------

def _observation(*invariants):
    return SimpleNamespace(violations=[SimpleNamespace(invariant=i, ranks=[0]) for i in invariants])


def test_replica_and_shard_fold_as_one_check():
    """REPLICA (D = 1) and SHARD (D > 1) compare every rank's cache with the spec's: a bug that
    loses KV is one in replicated and the other in dcp. Other IDs still fold only into a case
    that violates them too."""
    assert assemble.fold([(REPLICATED, _observation(REPLICA)), (DCP, _observation(SHARD))]) \
        == [None, 0]
    assert assemble.fold([(DCP, _observation(PAIRING, SHARD)), (REPLICATED, _observation(REPLICA))]) \
        == [None, 0]
    assert assemble.fold([(REPLICATED, _observation(PAD_HYGIENE, REPLICA)),
                          (REPLICATED, _observation(PAIRING, REPLICA)),
                          (DCP, _observation(PAIRING, SHARD)), (DCP, _observation(SHARD))]) \
        == [None, None, 1, 0]


def test_one_bug_in_two_regimes_is_one_shown_counterexample(threads_backend, tmp_path):
    """bug01 (a local block): REPLICA in replicated and SHARD in dcp, one bug: one shown, the
    other folded into it and named; --json lists both."""
    result = api.check(ZOO / "bug01_local_block.py", regimes=(REPLICATED, DCP), max_examples=300,
                       runner=threads_backend)
    assert [(c.regime, c.invariant, c.folded_into) for c in result.counterexamples] == [
        (REPLICATED, REPLICA, None), (DCP, SHARD, 0)]
    text = report.result_text(result)
    assert text.count("\nCounterexample ") == 1
    assert "(SHARD in dcp, REPLICA's check where D > 1)" in text
    document = json.loads(result.to_json())
    assert [c["folded_into"] for c in document["counterexamples"]] == [None, 0]


def test_the_zoo_shows_one_cache_counterexample_per_bug(threads_backend):
    """bug13 (a decode after a prefill): its SHARD in dcp is its REPLICA in replicated, folded,
    so the shown counterexamples are its two distinct first IDs."""
    result = api.check(ZOO / "bug13_decodes_not_prefix.py", regimes=(REPLICATED, DCP),
                       max_examples=300, runner=threads_backend)
    assert [c.invariant for c in result.counterexamples if c.folded_into is None] == [
        PAD_HYGIENE, PAIRING]
    assert {c.invariant for c in result.counterexamples} >= {REPLICA, SHARD}


# --- 5. `pcpcheck vllm`: the verdict first, then its provenance ---------------------------------

def test_release_verdict_comes_before_its_provenance(tmp_path, capsys):
    root = checkout(tmp_path, manager="bug13_decodes_not_prefix.py")
    assert main(["vllm", str(root), "--regime", REPLICATED, "--max-examples", "60",
                 "--max-ranks", "3"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("pcpcheck: checking ") and str(root) in lines[0]
    table = out.index("\ninvariant ")
    first = out.index("\nCounterexample 1: ")
    verdict = out.index("\nall regimes: ")
    provenance = out.index("\nwhat the verdict above rests on: ")
    assert table < first < verdict < provenance, out
    for part in ("  files read: ", "  layout model: ", "  path (real: ", "    manager  ",
                 "  stood in for (cannot run here): ", "  adapted: "):
        assert out.index(part) > provenance, part
    assert _coverage_row(out, KV_GROUPS) == ["n/a"]  # the fixture's second KV group is not run


def test_a_correct_release_reads_the_same_way(capsys):
    assert main(["vllm", str(RELEASE_TREE), "--regime", SHARDED, "--regime", DRAFT,
                 "--max-examples", "5", "--max-ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert out.index("\ninvariant ") < out.index("every invariant holds") \
        < out.index("  files read: ") < out.index("  path (real: ")
    # a real stage that ran on part of the steps says on how many and why, in its own row
    rows = out[out.index("  path (real: "):].splitlines()
    manager = next(i for i, row in enumerate(rows) if row.startswith("    manager "))
    assert rows[manager].split()[1] == "real", rows[manager]
    scope = " ".join(rows[manager + 1].split())  # the fixture's manager has no partition_batch
    assert scope.startswith("on 5 of 10 steps (sharded 5/5, draft 0/5): _build_batch_layout "
                            "alone (partition_batch not run: ") and scope.endswith(
        f"; {MANAGER_SCOPE}"), scope
    # every step enters through a wrapper, as the layers call them, and the gather: no count
    for stage in ("    wrapper ", "    gather "):
        row = next(i for i, row in enumerate(rows) if row.startswith(stage))
        assert not rows[row + 1].strip().startswith("on "), rows
    assert "steps run by the release's own code" not in out  # the rows carry the counts


# --- 6. every n/a of a verdict table says why -----------------------------------------------------

NO_SHARD_FLAG = "the gather has no shard_decode_requests parameter"
MANAGER_SCOPE = "expanded regimes; a later draft step runs on the global batch, which no manager lays out"


def _result(regimes, ids, *, counterexamples=(), release=None) -> CheckResult:
    """A result whose predicates ran where the registry applies them (30 cases each), none in a
    regime given as (regime, why it is not applicable)."""
    from pcpcheck.shared.results import Options
    from pcpcheck_spec.registry import BY_ID
    summaries = []
    for regime in regimes:
        regime, why = regime if isinstance(regime, tuple) else (regime, None)
        checked = {i: 0 if why or regime not in BY_ID[i].regimes else 30 for i in ids}
        summaries.append(_summary(regime, cases=0 if why else 30, not_applicable=why,
                                  invariants=tuple(InvariantCount(i, n, 0) for i, n in checked.items())))
    return CheckResult(version="0", target="t.py", target_name="t.py:gather", stand_ins=(),
                       options=Options(regimes=tuple(s.regime for s in summaries)),
                       regimes=tuple(summaries), counterexamples=tuple(counterexamples),
                       release=release)


def _table_cells(lines: list[str]) -> dict[str, list[str]]:
    """invariant -> its cells, from the text report's verdict table."""
    return {line.split()[0]: re.findall(r"n/a \[\d+\]|\d+/\d+ FAIL|\d+ ok|n/a", line[14:])
            for line in lines[1:]}


def test_every_na_cell_carries_its_reason_as_a_footnote_in_every_table():
    """A regime the target cannot reach, SHARD where D = 1 and REPLICA where D > 1: each n/a is
    `n/a [k]`, [k] below the table giving the reason, the same in the text, the Markdown summary,
    the HTML index and JUnit; the text's columns stay aligned."""
    from pcpcheck.render.junit import skip_reason
    from pcpcheck_spec.registry import GATHER_IDS
    result = _result([(SHARDED, NO_SHARD_FLAG), REPLICATED, DCP, DRAFT], GATHER_IDS)
    text = report.result_text(result).splitlines()
    table = text[1:2 + len(GATHER_IDS)]
    assert len({len(line) for line in table}) == 1, table  # aligned
    cells = _table_cells(table)
    assert cells[PAIRING] == ["n/a [1]", "30 ok", "30 ok", "30 ok"]
    assert cells[REPLICA] == ["n/a [1]", "30 ok", "n/a [2]", "30 ok"]
    assert cells[SHARD] == ["n/a [1]", "n/a [3]", "30 ok", "n/a [3]"]
    notes = [f"[1] regime {SHARDED} is not applicable to this target: {NO_SHARD_FLAG}",
             f"[2] {REPLICA}: checked only where every rank holds the whole cache (D = 1); "
             f"{SHARD} covers DCP (D > 1)",
             f"[3] {SHARD}: checked only with DCP (D > 1); {REPLICA} covers D = 1"]
    assert text[2 + len(GATHER_IDS):5 + len(GATHER_IDS)] == notes
    markdown = summary_markdown(result).splitlines()
    assert f"| {SHARD} | n/a [1] | n/a [3] | 30 ok | n/a [3] |" in markdown
    assert [f"- {note}" for note in notes] == [line for line in markdown if line.startswith("- [")]
    page = index_page(result, [])
    assert f'<tr><th>{SHARD}</th><td class="na">n/a <a href="#note-1">[1]</a></td>' in page
    for number, note in enumerate(notes, 1):
        assert f'<p class="note" id="note-{number}">{html.escape(note)}</p>' in page
    # JUnit's skipped case and the pytest item give the footnote's words
    assert skip_reason(result, result.summary(DCP), REPLICA, "n/a") == notes[1][4:]
    assert skip_reason(result, result.summary(SHARDED), REPLICA, "n/a") == notes[0][4:]


def test_layout_under_draft_says_from_the_path_table_that_no_map_was_the_releases():
    """A release's LAYOUT under draft, checked on no step: the reason is its path table's slot
    mapping stage (no speculator call of its own, or no kernels: the reference's map)."""
    import dataclasses

    from pcpcheck.shared.protocol import SLOT_MAPPING
    from pcpcheck.shared.results import PathStage, ReleaseRecord
    from pcpcheck_spec.names import LAYOUT
    from pcpcheck_spec.registry import RELEASE_IDS
    why = "triton is not installed: the reference formula (semantics section 3)"
    slots = PathStage(stage=SLOT_MAPPING, status="modeled", file=None, sha256=None, reason=why)
    release = ReleaseRecord(release="0.34.0", kind="wheel", location="w.whl", files=(),
                            adapted=(), layout_model="0.30", paths=(slots,))
    result = _result([SHARDED, DRAFT], RELEASE_IDS, release=release)
    draft = result.summary(DRAFT)
    unchecked = tuple(InvariantCount(c.invariant, 0 if c.invariant == LAYOUT else c.checked, 0)
                      for c in draft.invariants)
    result = dataclasses.replace(result, regimes=(result.regimes[0], dataclasses.replace(
        draft, invariants=unchecked)))
    reason = (f"{LAYOUT} under {DRAFT}: no manager lays a draft step out, and none of its maps "
              f"was the release's own (path table, {SLOT_MAPPING}: modeled, {why})")
    assert report.not_applicable_reason(result, result.summary(DRAFT), LAYOUT) == reason
    markdown = summary_markdown(result)
    assert f"| {LAYOUT} | 30 ok | n/a [1] |" in markdown and f"- [1] {reason}\n" in markdown


def test_a_release_report_gives_layout_under_draft_its_reason(capsys):
    assert main(["vllm", str(RELEASE_TREE), "--regime", SHARDED, "--regime", DRAFT,
                 "--max-examples", "5", "--max-ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^LAYOUT +\d+ ok +n/a \[(\d)\]$", out, re.M), out
    assert re.search(r"^\[\d\] LAYOUT under draft: no manager lays a draft step out, and none "
                     r"of its maps was the release's own \(path table, block tables / slot "
                     r"mapping: (real|modeled), ", out, re.M), out


# --- 7. the summary says where the rest of each counterexample is -------------------------------

def _violated() -> CheckResult:
    from pcpcheck.shared.results import Counterexample, ViolationRecord
    first = f"{REPLICA} violated on rank(s) [1] (regime {REPLICATED})"
    counterexample = Counterexample(regime=REPLICATED, violations=(ViolationRecord(REPLICA, (1,)),),
                                    case="{}", replay="pcpcheck check t.py --replay '{}'",
                                    report=first + "\n  batch: ...", known=False)
    result = _result([REPLICATED], (REPLICA,), counterexamples=[counterexample])
    summary = dataclasses.replace(result.regimes[0], invariants=(InvariantCount(REPLICA, 30, 2),))
    return dataclasses.replace(result, regimes=(summary,))


def test_the_summary_names_the_artifacts_only_in_github_actions(monkeypatch, tmp_path):
    result = _violated()
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    assert "Counterexamples (the whole report, JSON and pages are in the artifacts):" \
        in summary_markdown(result, {"json": "out.json"})
    monkeypatch.delenv("GITHUB_ACTIONS")
    markdown = summary_markdown(result)
    assert "artifacts" not in markdown
    assert "Counterexamples (the whole report is the command's output):" in markdown
    # what this run wrote, as the command wrote it (a --json to stdout is the command's output)
    from pcpcheck.render.outputs import write_outputs
    args = SimpleNamespace(json=str(tmp_path / "out.json"), html=str(tmp_path / "pages"),
                           summary=str(tmp_path / "s.md"), junit=None, repro_dir=None)
    write_outputs(args, result)
    assert (f"Counterexamples (each in full in `{args.json}` and the pages from "
            f"`{tmp_path / 'pages' / 'index.html'}`):") in (tmp_path / "s.md").read_text()
    args.json, args.html, args.json_stream = "-", None, io.StringIO()
    write_outputs(args, result)
    assert "Counterexamples (the whole report is the command's output):" \
        in (tmp_path / "s.md").read_text()
