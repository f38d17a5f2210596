"""Coverage in every report: per regime, the cases whose ranks took each gather branch (A-E) and
the cases that exercised each layout feature, worked out from the case (pcpcheck.judge.coverage),
carried through the result, its JSON and its text, for a check (one driver or several), a replay
and a release; a feature no case reached is shown as 0."""

from __future__ import annotations

import json
import re

import pytest

from pcpcheck import api
from pcpcheck.judge import coverage
from pcpcheck.render import report
from pcpcheck.shared.case import Case
from pcpcheck_spec.names import DCP, DRAFT, DRAFT_MIXED, REPLICATED, SHARDED, Batch, Request

F = coverage


def _case(regime, pcp_size, requests, **batch) -> Case:
    """A case whose requests are (q, prefilling, context), blocks numbered in order."""
    span = batch.get("block_size", 16) * (pcp_size if regime == DCP else 1)
    made, next_block = [], 0
    for q, prefilling, context in requests:
        blocks = -(-(q + context) // span)
        made.append(Request(q, prefilling, context, tuple(range(next_block, next_block + blocks))))
        next_block += blocks
    return Case(Batch(regime, pcp_size, tuple(made), **batch))


# (case, branches, features): worked out by hand from docs/semantics.md sections 2 and 5
HAND_MADE = [
    # three decodes dealt round-robin to 2 ranks (counts [2, 1]): branch B, no padding
    (_case(SHARDED, 2, [(1, False, 0)] * 3, block_size=1), {"B"}, {F.ROUND_ROBIN}),
    # one decode: rank 1 owns nothing; graph size 3 pads past the widest rank (1 row)
    (_case(SHARDED, 2, [(1, False, 0)], block_size=1, graph_size=3), {"B"},
     {F.EMPTY_RANK, F.GRAPH_PADDING}),
    # a 7-token prefill on P = 2 (c = 2): rank 0 gets chunks 0 and 3 (head and tail)
    (_case(REPLICATED, 2, [(7, True, 0)], block_size=2), {"D"}, {F.SPLIT_HEAD_TAIL}),
    # a decode and a 4-token prefill (c = 1, every chunk one token): branch E, split head/tail
    (_case(REPLICATED, 2, [(1, False, 0), (4, True, 0)], block_size=1), {"E"},
     {F.SPLIT_HEAD_TAIL}),
    # decodes alone, replicated: branch C on both ranks
    (_case(REPLICATED, 2, [(1, False, 0), (2, False, 3)], block_size=4), {"C"}, set()),
    # dcp, a 3-token prefill on P = 2: (2P-1)*ceil(3/4) = 3 >= 3, replicated; interleave 2
    (_case(DCP, 2, [(3, True, 1)], block_size=2, interleave=2), {"D"},
     {F.SHORT_PREFILL_REPLICATED, F.INTERLEAVE_2}),
    # dcp, an 8-token prefill on P = 2 (c = 2): split, rank 0 gets head and tail
    (_case(DCP, 2, [(8, True, 0)], block_size=4), {"D"}, {F.SPLIT_HEAD_TAIL}),
    # draft with DP padding and a map padded to the rows: S = L = 4 > nd = 2
    (_case(DRAFT, 2, [(2, False, 0)], block_size=2, dp_pad=2, pad_slot_map=True), {"A"},
     {F.DP_PADDING, F.MAP_PAST_ND}),
    # draft, real-length map: S = nd, no padding
    (_case(DRAFT, 3, [(1, False, 0), (3, False, 1)], block_size=2), {"A"}, set()),
    # draft-mixed: a 2-token block classified prefill, nd = 0 < S = 2
    (_case(DRAFT_MIXED, 2, [(2, False, 0)], block_size=2, num_decode_tokens=0), {"A"},
     {F.MAP_PAST_ND}),
    # an empty step: every rank has zero rows, S = 0 <= L = 0: branch A
    (_case(SHARDED, 2, []), {"A"}, {F.EMPTY_RANK}),
]


@pytest.mark.parametrize("case, branches, features", HAND_MADE)
def test_branches_and_features_of_hand_made_cases_are_exact(case, branches, features):
    assert coverage.branches(case) == branches
    assert coverage.features(case) == features


def _table(text: str) -> dict[str, list[int]]:
    """The coverage table of a report: row name -> counts per regime ("n/a" where the run cannot
    reach the feature)."""
    lines = text[text.index("coverage (cases)"):].splitlines()[1:]
    rows: dict[str, list] = {}
    for line in lines:
        name, *counts = re.split(r"\s{2,}", line.strip())
        if not line or not all(n.isdigit() or n == "n/a" for n in counts):
            break
        rows[name] = [int(n) if n.isdigit() else n for n in counts]
    return rows


def test_a_replayed_case_reports_its_exact_coverage_with_every_zero(threads_backend):
    case, branches, features = HAND_MADE[1]
    result = api.replay_case("impl", case, runner=threads_backend)
    summary = result.regimes[0]
    assert dict(summary.branches) == {b: int(b in branches) for b in coverage.BRANCHES}
    # several KV groups: a release's alone (a gather is called once per case), and the
    # asynchronous protocol's starts (a synchronous run), left out: n/a
    assert dict(summary.features) == {f: int(f in features) for f in coverage.FEATURES
                                      if f not in (F.KV_GROUPS, *F.TRACE_FEATURES)}
    table = _table(report.result_text(result))
    assert table["branch B"] == [1] and table["branch E"] == [0]
    assert table[F.KV_GROUPS] == ["n/a"] and table[F.GRAPH_PADDING] == [1]
    assert table[F.ASYNC_STARTED] == ["n/a"]


def test_a_search_counts_coverage_in_every_rendering():
    """Counted per case in the driver (several drivers with --jobs: the counts cross processes),
    equal however many drivers ran; JSON round-trips them; a feature never exercised is 0."""
    result = api.check("impl", regimes=(SHARDED, DRAFT), max_examples=60, max_ranks=3, jobs=2)
    alone = api.check("impl", regimes=(SHARDED, DRAFT), max_examples=60, max_ranks=3, jobs=1)
    assert [(s.branches, s.features) for s in alone.regimes] == [
        (s.branches, s.features) for s in result.regimes]
    sharded, draft = result.summary(SHARDED), result.summary(DRAFT)
    assert sum(n for _, n in sharded.branches) == 60  # a well-formed case: one branch
    assert dict(draft.branches) == {"A": 60, "B": 0, "C": 0, "D": 0, "E": 0}
    assert dict(sharded.features)[F.ROUND_ROBIN] > 0 and dict(draft.features)[F.ROUND_ROBIN] == 0
    assert dict(sharded.features)[F.INTERLEAVE_2] == 0 and F.KV_GROUPS not in dict(sharded.features)
    again = api.CheckResult.from_json(result.to_json())
    assert again.regimes == result.regimes
    assert json.loads(result.to_json())["regimes"][DRAFT]["coverage"]["features"][F.DP_PADDING] \
        == dict(draft.features)[F.DP_PADDING]
    table = _table(report.result_text(result))
    assert table[F.INTERLEAVE_2] == [0, 0]
    assert table["branch A"] == [dict(sharded.branches)["A"], 60]


def test_a_release_check_reports_coverage():
    from tests.test_vllm import RELEASE_TREE
    result = api.check_release(RELEASE_TREE, regimes=(SHARDED,), max_examples=20, max_ranks=3)
    summary = result.summary(SHARDED)
    assert sum(n for _, n in summary.branches) == summary.cases
    # several KV groups: only in dcp, where a release's second KV group is replicated; no
    # asynchronous protocol on the release path
    assert [f for f, _ in summary.features] == [f for f in coverage.FEATURES
                                                if f not in (F.KV_GROUPS, *F.TRACE_FEATURES)]
    assert "coverage (cases)" in report.result_text(result)


def test_a_release_step_is_covered_in_the_layout_of_its_own_era():
    """0.26-0.29's manager splits a short DCP prefill that 0.30 on replicates on every rank: a
    step padded past the widest rank of its own era (as release_search.era_case pads it) is
    narrower than the current era's widest rank. Its coverage is worked out in its era's layout,
    the era its Prepared carries; the current era's layout refuses the step (pcpcheck vllm
    0.29.0 ended in that ValueError, out of the coverage count)."""
    from types import SimpleNamespace

    from pcpcheck.search.engine import RegimeResult, count_coverage
    from pcpcheck_reference import ERA_V026
    case = _case(DCP, 2, [(5, True, 0)], block_size=4, graph_size=4)
    with pytest.raises(ValueError, match="graph_size 4 below the largest rank-local count 5"):
        F.branches(case)
    result = RegimeResult(regime=DCP)
    count_coverage(result, SimpleNamespace(prepared=SimpleNamespace(case=case, era=ERA_V026),
                                           ranks=[]))
    assert (dict(result.branches), dict(result.features)) == ({"D": 1}, {F.GRAPH_PADDING: 1})
