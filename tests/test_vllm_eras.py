"""The reference's layout eras (docs/semantics.md section 9): golden examples of the 0.26-0.29
manager's layout, next to the layout of docs/semantics.md section 2 (0.30 on) for the same steps,
and the release's batch order the steps are drawn in."""

from __future__ import annotations

import pytest

import pcpcheck_reference as reference
from pcpcheck.judge.release_case import reference_view
from pcpcheck.search.release_search import release_order
from pcpcheck_spec.names import DCP, REPLICATED, SHARDED, Batch, Request

OLD, NEW = reference.ERA_V026, reference.ERA_CURRENT


def rows(batch: Batch, era: str) -> list[list[int]]:
    return reference_view(batch, era)["rows"]


def test_pure_prefill_head_goes_last_on_0_26_not_decodes_first_on_0_30():
    # t0 decode; t1..t7 a fresh 7-token prefill, c = 2: rank 0 head [t1 t2], tail [t7];
    # rank 1 chunks [t3 t4] and [t5 t6]. 0.26 moves only chunks starting at position 0 last.
    batch = Batch(REPLICATED, 2, (Request(1, False, 3, (0,)), Request(7, True, 0, (1,))), 16)
    assert rows(batch, OLD) == [[0, 7, 1, 2], [0, 3, 4, 5, 6]]
    assert rows(batch, NEW) == [[0, 1, 2, 7], [0, 3, 4, 5, 6]]
    old = reference.layout(batch, era=OLD)
    assert (old.width, old.num_decode_tokens) == (5, [1, 1])
    assert old.wmask.tolist() == [True, True, True, True, False, False, True, True, True, True]


def test_continued_prefill_before_a_decode_makes_0_26_decode_counts_disagree():
    # The release's order puts a 1-token continued prefill among the decodes; 0.26 keeps it
    # there on rank 0 (its only chunk), so rank 0 leads with a prefill row: nd 0 vs 1.
    batch = Batch(REPLICATED, 2, (Request(1, True, 4, (0,)), Request(1, False, 2, (1,))), 16)
    old, new = reference.layout(batch, era=OLD), reference.layout(batch, era=NEW)
    assert rows(batch, OLD) == [[0, 1], [1]] and old.num_decode_tokens == [0, 1]
    assert rows(batch, NEW) == [[1, 0], [1]] and new.num_decode_tokens == [1, 1]


def test_short_prefill_split_under_dcp_on_0_26_replicated_on_0_30():
    # P = 2, q = 3: c = 1 and the last of the four chunks is empty: (2P-1)*c >= q.
    batch = Batch(DCP, 2, (Request(3, True, 5, (0, 1, 2, 3, 4)),), 2)
    assert rows(batch, OLD) == [[0], [1, 2]]
    assert reference_view(batch, OLD)["replicated"] == [False]
    assert rows(batch, NEW) == [[0, 1, 2], [0, 1, 2]]
    assert reference_view(batch, NEW)["replicated"] == [True]
    new = reference.layout(batch, era=NEW)
    assert new.wmask.tolist() == [True, True, True, False, False, False]
    assert reference_view(batch, NEW)["restore"] == [0, 1, 2]


def test_eras_agree_on_a_decode_only_step_and_0_26_has_no_sharding():
    batch = Batch(REPLICATED, 2, (Request(1, False, 0, (0,)), Request(2, False, 0, (1,))), 16)
    old, new = reference_view(batch, OLD), reference_view(batch, NEW)
    assert old == new and old["rows"] == [[0, 1, 2], [0, 1, 2]]
    with pytest.raises(ValueError, match="no decode sharding"):
        reference.layout(Batch(SHARDED, 2, batch.requests), era=OLD)
    with pytest.raises(ValueError, match="unknown layout era"):
        reference.layout(batch, era="0.1")


def test_release_order_puts_a_one_token_prefill_among_the_decodes():
    requests = (Request(5, True), Request(1, False), Request(1, True, 9), Request(3, False),
                Request(0, False))
    ordered = release_order(Batch(REPLICATED, 2, requests)).requests
    # decodes with draft tokens first, then length 1 (decode and continued prefill, stable),
    # then by length
    assert ordered == (Request(3, False), Request(1, False), Request(1, True, 9),
                       Request(0, False), Request(5, True))
