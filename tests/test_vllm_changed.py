"""`pcpcheck vllm TREE --changed-against BASE`: the lines a change touched, against the lines the
run's steps executed (pcpcheck.api.changed_against, pcpcheck.shared.changed,
pcpcheck.render.changed_lines): per file of the path, the changed lines that ran and those no step ran
(not exercised, with the regimes and scope tried), in the text report, the JSON, the Markdown
summary, the HTML lines page and the pytest plugin's terminal summary.

The trees are built at test time from the 0.34.0 wheel (nothing of vLLM is committed): a git
checkout whose last commit changes a line of `PCPManager.sync_drafts` (no step runs it: it
broadcasts a speculative step's drafts), a comment beside it, a line every step's gather runs
(`local_num_tokens`, the same value), a comment of `vllm/envs.py` (the run reads it: its lines are
not recorded) and a line of `vllm/collect_env.py` (the path never reads it); BASE is that commit's
parent, or the wheel's files as a second tree.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pcpcheck.api import check_release
from pcpcheck.api.changed_against import lines_changed
from pcpcheck.api.merge import merge
from pcpcheck.faces.cli import main
from pcpcheck.render.report import result_text
from pcpcheck.shared.changed import NOT_COUNTED, NOT_EXERCISED, OUTSIDE, PATH, RAN, READ
from pcpcheck.shared.results import CheckResult
from pcpcheck.shared.source import GATHERS, MANAGER
from pcpcheck.worker.release_lines import LineRecorder
from pcpcheck.worker.runner import ThreadRunner
from pcpcheck_spec.names import SHARDED
from tests.test_api import _schema, conforms
from tests.test_vllm_kernels import checkout
from tests.test_vllm_lines import _tree

pytestmark = pytest.mark.xdist_group("vllm_0_34_0_wheel")

GATHER = GATHERS[0]
ENVS, COLLECT_ENV = "vllm/envs.py", "vllm/collect_env.py"
# (file, old, new): each once in its file
UNRUN = (MANAGER, "        pcp_group.broadcast(draft_tokens, src=0)\n",
         "        pcp_group.broadcast(draft_tokens, src=0 * 1)\n")
COMMENT = (MANAGER, "# Draft logits are indexed by persistent request slots.",
           "# Draft logits are indexed by their persistent request slots.")
EVERY_STEP = (GATHER, "    local_num_tokens = tensors[0].shape[0]\n",
              "    local_num_tokens = len(tensors[0])\n")
READ_ONLY = (ENVS, "    return factors\n", "    return factors  # the same\n")
UNREAD = (COLLECT_ENV, 'print("Collecting environment information...")',
          'print("Collecting the environment information...")')
CHANGES = (UNRUN, COMMENT, EVERY_STEP, READ_ONLY, UNREAD)
STEPS = 20
SEARCH = ("--regime", SHARDED, "--max-examples", str(STEPS), "--max-ranks", "2")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=pcpcheck", "-c",
                    "user.email=pcpcheck@localhost", "-c", "commit.gpgsign=false", *args],
                   check=True, capture_output=True, timeout=300)


def _line_of(root: Path, change: tuple[str, str, str]) -> int:
    """The line of `change`'s new text in the tree's file."""
    relpath, _, new = change
    text = (root / relpath).read_text()
    return text[:text.index(new)].count("\n") + 1


@pytest.fixture(scope="module")
def trees(wheel_0_34, tmp_path_factory):
    """(BASE: the wheel's files as a checkout; the pull request: a git checkout of them whose
    last commit makes CHANGES)."""
    root = tmp_path_factory.mktemp("changed")
    base = checkout(wheel_0_34, root / "base")
    pr = checkout(wheel_0_34, root / "pr")
    _git(pr, "init", "-q")
    _git(pr, "add", "-A")
    _git(pr, "commit", "-qm", "base")
    for relpath, old, new in CHANGES:
        text = (pr / relpath).read_text()
        assert text.count(old) == 1, (relpath, old)
        (pr / relpath).write_text(text.replace(old, new))
    _git(pr, "commit", "-qam", "the pull request")
    return base, pr


@pytest.fixture(scope="module")
def against_revision(trees):
    _, pr = trees
    return check_release(pr, regimes=(SHARDED,), max_examples=STEPS, max_ranks=2,
                         changed_against="HEAD~1")


def _reach(result) -> dict[str, tuple[str, dict[int, str | None]]]:
    return {entry.file: (entry.where, {line.line: reach for line, reach in entry.lines})
            for entry in result.release.changed()}


@pytest.mark.kernels
def test_a_changed_line_no_step_runs_is_not_exercised_and_the_gathers_ran(trees, against_revision):
    _, pr = trees
    result = against_revision
    unrun, comment, every = (_line_of(pr, change) for change in (UNRUN, COMMENT, EVERY_STEP))
    reach = _reach(result)
    assert reach[MANAGER] == (PATH, {unrun: NOT_EXERCISED, comment: NOT_COUNTED})
    assert reach[GATHER] == (PATH, {every: RAN})
    assert reach[ENVS][0] == READ and reach[COLLECT_ENV][0] == OUTSIDE
    record = result.release
    # exact: with a changed line not run, every step was traced
    assert record.lines_traced == record.lines_steps == STEPS
    text = result_text(result)
    assert f"{MANAGER}:{unrun} in PCPManager.sync_drafts" in text, text[-3000:]
    assert f"NOT EXERCISED, changed lines of the path's functions that no step ran (all {STEPS} " \
           f"traced); tried: regimes {SHARDED} {STEPS} steps; random, --max-examples {STEPS}, " \
           "P 2..2, derandomized" in text, text[-3000:]
    assert f"1 ran ({every})" in text and f"{COLLECT_ENV} (1 line)" in text, text[-3000:]
    assert text.index("path (real:") < text.index("changed lines against HEAD~1 (git revision")
    assert result.exit_code == 0  # information: the verdict's exit code
    document = json.loads(result.to_json())
    assert conforms(document, _schema("pcpcheck check result")) == []
    assert {"line": unrun, "statement": unrun, "function": "PCPManager.sync_drafts",
            "reach": NOT_EXERCISED} in document["release"]["changes"]["files"][MANAGER]["lines"]
    assert CheckResult.from_json(result.to_json()) == result


@pytest.mark.kernels
def test_a_merge_of_shards_says_a_changed_line_ran_where_any_part_ran_it(trees, against_revision):
    _, pr = trees
    every, record = _line_of(pr, EVERY_STEP), against_revision.release
    gather = record.file_lines(GATHER)
    parts = [dataclasses.replace(against_revision, options=dataclasses.replace(
        against_revision.options, shard=(k + 1, 2)), release=dataclasses.replace(record, lines=(
            dataclasses.replace(gather, run=run),))) for k, run in enumerate(
        (tuple(n for n in gather.run if n != every), gather.run))]
    assert _reach(parts[0])[GATHER][1] == {every: NOT_EXERCISED}
    assert _reach(merge(parts))[GATHER][1] == {every: RAN}


@pytest.fixture(scope="module")
def against_tree(trees, tmp_path_factory):
    """`pcpcheck vllm PR --changed-against BASE_DIR` with its outputs: (exit code, stdout, the
    output folder)."""
    base, pr = trees
    out = tmp_path_factory.mktemp("outputs")
    code = main(["vllm", str(pr), *SEARCH, "--changed-against", str(base), "--summary",
                 str(out / "summary.md"), "--json", str(out / "result.json"), "--html",
                 str(out / "html")])
    return code, out


@pytest.mark.kernels
def test_base_may_be_a_second_tree(trees, against_tree, capsys):
    base, pr = trees
    code, out = against_tree
    assert code == 0
    result = CheckResult.from_json((out / "result.json").read_text())
    assert result.release.changes.base == f"vLLM 0.34.0 (checkout {base})"
    reach = _reach(result)
    assert reach[MANAGER][1][_line_of(pr, UNRUN)] == NOT_EXERCISED
    assert reach[GATHER][1] == {_line_of(pr, EVERY_STEP): RAN}
    # the lines page marks the changed line no step ran, and the one that ran
    page = (out / "html" / "lines.html").read_text()
    assert f'<tr class="unexercised changed"><td class="n">{_line_of(pr, UNRUN)}</td>' in page
    assert f'<tr class="run changed"><td class="n">{_line_of(pr, EVERY_STEP)}</td>' in page


@pytest.mark.kernels
def test_the_summary_markdown_lists_the_line_not_exercised(trees, against_tree):
    _, pr = trees
    _, out = against_tree
    summary = (out / "summary.md").read_text()
    assert f"- `{MANAGER}:{_line_of(pr, UNRUN)}` in `PCPManager.sync_drafts`" in summary, summary
    assert f"| `{MANAGER}` | 2 | 0 | 1 | 1 |" in summary, summary
    assert "Outside the path pcpcheck runs (no claim either way): " \
           f"{COLLECT_ENV} (1 line)" in summary, summary


@pytest.mark.parametrize("base", ["no-such-revision", "-n", "0.25.0", "/no/such/tree"])
def test_a_base_that_is_neither_a_revision_nor_a_tree_exits_2_with_one_line(base, tmp_path,
                                                                           capsys):
    tree = tmp_path / "tree"
    (tree / MANAGER).parent.mkdir(parents=True)
    (tree / MANAGER).write_text("")  # a checkout as `pcpcheck vllm` finds one; never run
    assert main(["vllm", str(tree), f"--changed-against={base}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--changed-against {base}" in err, err


def test_a_git_revision_needs_a_git_checkout_to_check(tmp_path, capsys):
    wheel = tmp_path / "vllm-0.34.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MANAGER, "")
    assert main(["vllm", str(wheel), "--changed-against", "HEAD~1"]) == 2
    err = capsys.readouterr().err
    assert f"{wheel} is a wheel, not a git checkout" in err, err


def test_changed_lines_are_those_added_or_replaced_and_where_lines_were_deleted():
    before = ["a", "b", "c", "d", "e"]
    assert lines_changed(before, ["a", "B", "c", "d", "e"]) == [2]  # replaced
    assert lines_changed(before, ["a", "b", "x", "c", "d", "e"]) == [3]  # added
    assert lines_changed(before, ["a", "b", "d", "e"]) == [3]  # "c" deleted: the line after it
    assert lines_changed(before, ["a", "b", "c"]) == [3]  # deleted at the end: the last line
    assert lines_changed([], ["a", "b"]) == [1, 2]  # a new file


def test_a_changed_statement_keeps_every_step_traced_until_it_runs(tmp_path):
    """The recorder traces ever fewer steps once they run no new line, but not while a watched
    (changed) statement of the path's functions has not run: a line reported not exercised ran
    on no step."""
    source, modules = _tree(tmp_path)
    never = 8  # first.py's `never` body, which no step below calls

    def traced(watch) -> list[bool]:
        recorder = LineRecorder(source, ["vllm/first.py"], watch=watch)
        flags = []
        for _ in range(6):
            with recorder.step():
                ThreadRunner().run(1, lambda rank: modules["first"].before(1))
            recorder.take()
            flags.append(recorder.traced)
        return flags

    assert traced(None) == [True, True, False, True, False, False]
    assert traced({"vllm/first.py": [[never, never]]}) == [True] * 6
    assert traced({"vllm/first.py": [[2, 2]]}) == [True, True, False, True, False, False]


@pytest.mark.kernels
def test_the_pytest_plugin_surfaces_the_lines_not_exercised(trees, tmp_path):
    _, pr = trees
    summary = tmp_path / "step-summary.md"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pcp-only", "--pcp-vllm",
         ".", "--pcp-regime", SHARDED, "--pcp-max-examples", str(STEPS),
         "--pcp-changed-against", "HEAD~1"], cwd=pr, capture_output=True, text=True,
        timeout=600, env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    line = f"{MANAGER}:{_line_of(pr, UNRUN)}"
    assert "pcpcheck: changed lines of" in done.stdout and \
        f"{line} in PCPManager.sync_drafts" in done.stdout, done.stdout[-3000:]
    assert f"- `{line}` in `PCPManager.sync_drafts`" in summary.read_text()
