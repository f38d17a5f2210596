"""`pcpcheck diff OLD NEW` for two vLLM trees: the same steps through both whole PCP paths,
compared stage by stage (pcpcheck.api.tree_diff). The trees are built at test time from the
cached wheels (nothing of vLLM is committed): the 0.34.0 release against copies of it, each
changed one way, and 0.33.0 against 0.34.0.

- a refactor (a helper of the gather's extracted and called twice, a method of the manager
  renamed with its callers): no difference, exit 0;
- the sharded gather returning its rows and its slot map reversed alike: the same caches, every
  invariant holding on both sides, a difference at the gather's output: exit 4;
- a slot off by one in the sharded gather: a violation on the new side: exit 1.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from pcpcheck.faces.cli import main
from pcpcheck.judge.tree_compare import (
    COMPARED_STAGES,
    LAYOUT_STAGE,
    OUTPUT_STAGE,
    first_difference,
)
from pcpcheck.render.html import DIFFERENT_BANNER
from pcpcheck.shared.results import EXIT_DIFFERENT, EXIT_HOLDS, EXIT_USAGE, EXIT_VIOLATION
from pcpcheck.shared.source import GATHERS, MANAGER
from pcpcheck_spec.names import PAIRING, SHARDED
from tests.test_api import _schema, conforms
from tests.test_html import _browse, decode_png
from tests.test_vllm_kernels import checkout

pytestmark = pytest.mark.xdist_group("vllm_0_34_0_wheel")

GATHER = GATHERS[0]
SHARDED_RETURN = "        return gathered_inputs, gathered_slot_mapping\n"
# (file, text, its replacement, how many times it is there)
REFACTOR = (
    (GATHER, "def _gather_prefill_cache_inputs(",
     "def _all_gather_each(pcp_group, tensors):\n"
     "    return tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)\n\n\n"
     "def _gather_prefill_cache_inputs(", 1),
    (GATHER, "        gathered_inputs = tuple(\n"
             "            pcp_group.all_gather(tensor.contiguous(), dim=0) for tensor in tensors\n"
             "        )\n",
     "        gathered_inputs = _all_gather_each(pcp_group, tensors)\n", 1),
    (GATHER, "    gathered_prefills = tuple(\n"
             "        pcp_group.all_gather(tensor[num_decode_tokens:].contiguous(), dim=0)\n"
             "        for tensor in tensors\n"
             "    )\n",
     "    gathered_prefills = _all_gather_each(\n"
     "        pcp_group, tuple(tensor[num_decode_tokens:] for tensor in tensors)\n"
     "    )\n", 1),
    (MANAGER, "_iter_rank_chunks(", "_rank_chunk_spans(", 3),  # the method and its two callers
)
# the sharded gather's rows and slots in reverse, alike: every row still meets its slot
REVERSED_ALIKE = ((GATHER, SHARDED_RETURN,
                   "        order = torch.arange(gathered_slot_mapping.shape[0] - 1, -1, -1)\n"
                   "        return tuple(t[order] for t in gathered_inputs), "
                   "gathered_slot_mapping[order]\n", 1),)
# every real slot of the sharded gather's map one too far
SLOT_OFF_BY_ONE = ((GATHER, SHARDED_RETURN,
                    "        return gathered_inputs, torch.where(gathered_slot_mapping >= 0, "
                    "gathered_slot_mapping + 1, gathered_slot_mapping)\n", 1),)
OPTIONS = ("--regime", SHARDED, "--max-examples", "20", "--max-ranks", "2")


def changed_tree(wheel: Path, root: Path, edits) -> Path:
    """The release's Python files as a checkout, each edit (file, text, replacement, count)
    made where the text is, exactly `count` times."""
    checkout(wheel, root)
    for relpath, old, new, count in edits:
        text = (root / relpath).read_text()
        assert text.count(old) == count, f"{old!r} is not {count} time(s) in {relpath}"
        (root / relpath).write_text(text.replace(old, new))
    return root


def diff(*argv) -> tuple[int, str]:
    """`pcpcheck diff ARGV` in this process: its exit code and what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["diff", *map(str, argv)])
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def reversed_alike(wheel_0_34, tmp_path_factory):
    """The diff of the release against its copy whose sharded gather reverses rows and slots
    alike: (exit code, output, the --json document, the --html directory)."""
    where = tmp_path_factory.mktemp("reversed")
    tree = changed_tree(wheel_0_34, where / "tree", REVERSED_ALIKE)
    code, out = diff(wheel_0_34, tree, *OPTIONS, "--json", where / "diff.json",
                     "--html", where / "html")
    return code, out, json.loads((where / "diff.json").read_text()), where / "html"


def test_a_refactor_is_no_difference(wheel_0_34, tmp_path):
    """Code moved and renamed with its callers: every stage means the same on every step."""
    tree = changed_tree(wheel_0_34, tmp_path / "tree", REFACTOR)
    code, out = diff(wheel_0_34, tree, *OPTIONS)
    assert code == EXIT_HOLDS, out
    assert re.search(rf"{SHARDED} +\d+ steps: the same at every stage; both hold every invariant",
                     out), out
    assert "no difference: the two paths agree at every stage on every step (exit 0)" in out


def test_rows_and_slots_reordered_alike_differ_at_the_gather_output(reversed_alike):
    """The caches are the same and both sides hold every invariant: a difference, not a
    violation (exit 4), first at the gather's output, its smallest step side by side with a
    replay line that reruns it on both trees."""
    code, out, document, _ = reversed_alike
    assert code == EXIT_DIFFERENT, out
    assert conforms(document, _schema("pcpcheck tree diff result")) == []
    assert document["verdict"] == "different"
    [regime] = document["regimes"]
    assert regime["differing"] > 0 and regime["first_stages"] == {OUTPUT_STAGE: regime["differing"]}
    assert regime["violated"] == {"old": {}, "new": {}} and regime["violations"] == []
    smallest = regime["differences"][0]
    assert smallest["stage"] == OUTPUT_STAGE
    assert smallest["old_violations"] == smallest["new_violations"] == []
    # rank 0 of the smallest step: the new side's rows and slots are the old's, reversed
    old, new = smallest["old_value"][0][0], smallest["new_value"][0][0]
    assert new["rows"] == [rows[::-1] for rows in old["rows"]] and new["slots"] == old["slots"][::-1]
    assert smallest["ranks"][0]["old"] != smallest["ranks"][0]["new"]
    assert "the paths differ, both sides holding every invariant (exit 4)" in out

    replay = smallest["replay"].split()
    assert replay[:2] == ["pcpcheck", "diff"] and "--replay" in replay
    again, printed = diff(*replay[2:4], "--replay", json.dumps(smallest["case"]))
    assert again == EXIT_DIFFERENT and f"first difference at {OUTPUT_STAGE}" in printed


def test_a_planted_bug_is_a_violation_on_the_new_side(wheel_0_34, tmp_path):
    """A slot one too far: the new side violates PAIRING where the old holds (exit 1, a
    violation, never the 4 of a mere difference); the new side's counterexample is shown."""
    tree = changed_tree(wheel_0_34, tmp_path / "tree", SLOT_OFF_BY_ONE)
    code, out = diff(wheel_0_34, tree, *OPTIONS, "--json", tmp_path / "diff.json")
    assert code == EXIT_VIOLATION, out
    document = json.loads((tmp_path / "diff.json").read_text())
    assert document["verdict"] == "violated"
    [regime] = document["regimes"]
    assert regime["violated"]["old"] == {} and PAIRING in regime["violated"]["new"]
    smallest = regime["differences"][0]
    assert smallest["old_violations"] == [] and PAIRING in smallest["new_violations"]
    assert smallest["new_report"].startswith(f"{smallest['new_violations'][0]} violated")
    assert "new's violation on this step:" in out and "an invariant is violated on the new side (exit 1)" in out


def test_two_releases_on_the_same_steps(wheel, wheel_0_34, tmp_path):
    """0.33.0 against 0.34.0 (their managers, batch orders and splits are different files, the
    gather the same): the same at every stage on the same steps, both holding."""
    code, out = diff(wheel, wheel_0_34, *OPTIONS)
    assert code == EXIT_HOLDS, out
    assert re.search(rf"{SHARDED} +\d+ steps: the same at every stage", out), out


def test_the_page_shows_the_difference_side_by_side(reversed_alike, tmp_path):
    """--html: the verdict's banner drawn in the difference's colour, the first differing stage
    and both sides' values in a real browser's DOM."""
    _, _, document, html = reversed_alike
    page = html / "index.html"
    dom = _browse(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.search(r'<div class="banner" id="verdict"[^>]*>DIFFERENT', dom.stdout)
    assert f"first difference at {OUTPUT_STAGE}" in dom.stdout
    first = document["regimes"][0]["differences"][0]["ranks"][0]
    assert first["old"] in dom.stdout and first["new"] in dom.stdout
    shot = _browse(page, tmp_path, f"--screenshot={tmp_path / 'page.png'}")
    assert shot.returncode == 0, shot.stderr[-2000:]
    _, _, rows = decode_png((tmp_path / "page.png").read_bytes())
    orange = bytes(int(DIFFERENT_BANNER[i:i + 2], 16) for i in (1, 3, 5))
    top = [row[i:i + 3] for row in rows[:120] for i in range(0, len(row), 3)]
    assert sum(p == orange for p in top) > 0.4 * len(top), "the verdict's banner is not drawn"


def test_a_field_only_one_side_reports_is_no_difference():
    """0.26-0.29's managers have no `replicated_requests`: their view lacks `replicated`, which
    says nothing about what their path does; a field both report that differs is a difference."""
    stages = {stage: [None, None] for stage in COMPARED_STAGES}
    view = {"rows": [[0], [1]], "width": 1}
    old = dict(stages, **{LAYOUT_STAGE: [view, view]})
    new = dict(stages, **{LAYOUT_STAGE: [dict(view, replicated=[True])] * 2})
    assert first_difference(old, new) is None
    new[LAYOUT_STAGE][1] = dict(view, rows=[[0], [0]])
    assert first_difference(old, new) == (LAYOUT_STAGE, [1])


def test_a_tree_against_a_gather_target_is_a_usage_error(wheel_0_34, capsys):
    assert main(["diff", str(wheel_0_34), "impl"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a vLLM tree, impl a gather target" in err
    assert main(["diff", "impl", "impl", "--html", "pages"]) == EXIT_USAGE
    assert "--html applies where OLD and NEW are vLLM trees" in capsys.readouterr().err
