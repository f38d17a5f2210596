"""CrossHair over the spec model's gather (bounded domain: P <= 4, rows per rank L <= 4, distinct
slots), checking UNIQUE, PAD_HYGIENE, PAIRING, LENGTH, COLLECTIVE, REPLICA and SHARD.

A clean run is not a proof: it spends a fixed budget (paths, seconds). The planted-bug tests show
the budget is enough to find real layout bugs. Runtime ~40 s on 2 cores: five clean runs of ~5-6 s
each, planted bugs found in 0.5-4 s (tooling-notes: leading asserts as preconditions,
`analysis_kind=asserts`, an explicit budget).

PYTEST_DONT_REWRITE: pytest's assertion rewriting would reach the property CrossHair executes,
changing its messages and slowing the search about tenfold.
"""

from __future__ import annotations

from typing import Callable

import pytest
from crosshair.core_and_libs import AnalysisKind, MessageType, analyze_function, run_checkables
from crosshair.options import AnalysisOptionSet

from spec import invariants as inv
from spec import model
from spec.names import (
    BRANCH_MIXED,
    BRANCH_NO_DECODE,
    BRANCH_SHARDED,
    BRANCH_UNEXPANDED,
    COLLECTIVE,
    DCP,
    DRAFT_MIXED,
    LENGTH,
    PAD_HYGIENE,
    PAIRING,
    REGIMES,
    REPLICA,
    REPLICATED,
    SHARD,
    SHARDED,
    UNIQUE,
    Batch,
    Request,
)

Gather = Callable[[list[list[int]], list[list[int]], list[int], bool], list[tuple[list[int], list[int]]]]

MAX_TOKENS_PLUS_PAD = 4  # bounds every rank's row count L (W <= N + graph padding, L = N + dp_pad)


def make_property(gather: Gather, regime: int):
    """The property CrossHair explores, for one regime (a concrete regime keeps the path tree
    narrow) and a given gather (the model's, or a planted bug)."""

    def gather_keeps_invariants(
        pcp_size: int, requests: list[tuple[int, bool]], blocks: list[int], pad: int, pad_map: bool, nd: int
    ) -> None:
        # Leading asserts are preconditions (WF_SLOTS, WF_LAYOUT, WF_WIDTH hold by construction).
        assert 2 <= pcp_size <= 4
        assert len(requests) <= 3
        assert all(0 <= q <= 4 for q, _ in requests)
        assert 0 <= pad
        assert sum(q for q, _ in requests) + pad <= MAX_TOKENS_PLUS_PAD
        assert regime < 3 or not any(prefilling for _, prefilling in requests)  # drafts: decodes
        assert regime != 4 or 0 <= nd < sum(q for q, _ in requests)  # draft-mixed: nd < N
        assert len(blocks) == sum(q for q, _ in requests)
        assert all(block >= 0 for block in blocks)
        assert len(set(blocks)) == len(blocks)  # distinct slots, or permutation bugs hide
        # block_size 1, context 0: a token's slot is its block (D = 1), or its block shared by
        # the D tokens of one virtual block, one per DCP rank (D = P).
        built = []
        num_tokens = 0
        for q, prefilling in requests:
            built.append(Request(q, prefilling, 0, tuple(blocks[num_tokens : num_tokens + q])))
            num_tokens += q
        name = REGIMES[regime]
        if regime < 3:
            graph_size = num_tokens + pad if pad else 0  # >= every rank's real row count
            batch = Batch(name, pcp_size, tuple(built), 1, 1, graph_size=graph_size)
        else:
            mixed_nd = nd if regime == 4 else None
            batch = Batch(
                name, pcp_size, tuple(built), 1, 1, dp_pad=pad, pad_slot_map=pad_map, num_decode_tokens=mixed_nd
            )
        lay = model.layout(batch)
        outputs = gather(lay.tokens, lay.slot_maps, lay.num_decode_tokens, lay.shard)
        traces = [
            model.collective_trace(lay.num_rows, len(lay.slot_maps[r]), lay.num_decode_tokens[r], lay.shard)
            for r in range(pcp_size)
        ]
        assert inv.collective_agreement(traces), COLLECTIVE
        expected = model.expected_caches(batch)
        caches = []
        for rank, (rows, slots) in enumerate(outputs):
            assert inv.length_agreement([rows], slots), LENGTH
            assert inv.uniqueness(slots), UNIQUE
            assert inv.pad_hygiene(rows, slots), PAD_HYGIENE
            assert inv.pairing(expected[rank], rows, slots), PAIRING
            caches.append(model.write(rows, slots))
        if batch.dcp_size == 1:
            assert inv.replica(expected[0], caches), REPLICA
        else:
            assert inv.shard(expected, caches, list(range(num_tokens))), SHARD

    return gather_keeps_invariants


def counterexamples(gather: Gather, regime: str, max_iterations: int, seconds: float) -> list[str]:
    options = AnalysisOptionSet(
        analysis_kind=[AnalysisKind.asserts],
        max_iterations=max_iterations,
        per_condition_timeout=seconds,
    )
    messages = run_checkables(analyze_function(make_property(gather, REGIMES.index(regime)), options))
    return [message.message for message in messages if message.state > MessageType.PRE_UNSAT]


def planted(rank_bug) -> Gather:
    """A copy of the model's gather with one rank's output rewritten by `rank_bug`."""

    def gather(rows, slot_maps, nds, shard):
        outputs = []
        for rank in range(len(rows)):
            out_rows, out_slots = model.gather_rank(rank, rows, slot_maps, nds, shard)
            letter = model.branch(len(rows[rank]), len(slot_maps[rank]), nds[rank], shard)
            outputs.append(rank_bug(letter, rank, rows, slot_maps, nds, out_rows, out_slots))
        return outputs

    return gather


def decode_slots_from_local_block(letter, rank, rows, slot_maps, nds, out_rows, out_slots):
    """Bug class 1 (vllm-ascend #6346): mixed branch pairs local decode rows with the local rank's
    block of the expanded map, whose replicated copies are -1 on ranks > 0."""
    if letter != BRANCH_MIXED:
        return out_rows, out_slots
    num_rows, nd = len(rows[rank]), nds[rank]
    local_block = slot_maps[rank][rank * num_rows : rank * num_rows + nd]
    return out_rows, local_block + out_slots[nd:]


def map_read_token_major(letter, rank, rows, slot_maps, nds, out_rows, out_slots):
    """Bug class 12: the expanded map read token-major instead of rank-major."""
    if letter not in (BRANCH_SHARDED, BRANCH_NO_DECODE):
        return out_rows, out_slots
    pcp_size, num_rows = len(rows), len(rows[rank])
    slots = slot_maps[rank]
    return out_rows, [slots[j * pcp_size + q] for q in range(pcp_size) for j in range(num_rows)]


def upstream_unexpanded_keeps_nd(letter, rank, rows, slot_maps, nds, out_rows, out_slots):
    """Bug class 10 (upstream's branch A): keep only [:nd] of an unexpanded map."""
    if letter != BRANCH_UNEXPANDED:
        return out_rows, out_slots
    return rows[rank][: nds[rank]], slot_maps[rank][: nds[rank]]


@pytest.mark.parametrize("regime", REGIMES)
def test_model_gather_keeps_invariants_within_budget(regime):
    """UNIQUE, PAD_HYGIENE, PAIRING, LENGTH, COLLECTIVE, REPLICA, SHARD on the model's gather."""
    assert counterexamples(model.gather, regime, max_iterations=1000, seconds=5) == []


@pytest.mark.parametrize(
    "rank_bug, regime, violated",
    [
        (decode_slots_from_local_block, REPLICATED, REPLICA),
        (decode_slots_from_local_block, DCP, SHARD),
        (map_read_token_major, SHARDED, PAD_HYGIENE),
        (map_read_token_major, DCP, PAIRING),
        (upstream_unexpanded_keeps_nd, DRAFT_MIXED, REPLICA),
    ],
    ids=["class1-replicated", "class1-dcp", "class12-sharded", "class12-dcp", "class10-draft-mixed"],
)
def test_crosshair_finds_planted_bug(rank_bug, regime, violated):
    """The budget is enough to find each planted bug; the ID is the first assert it breaks."""
    found = counterexamples(planted(rank_bug), regime, max_iterations=3000, seconds=30)
    assert found, f"CrossHair missed {rank_bug.__name__} in {regime} within its budget"
    assert found[0].startswith(f"AssertionError: {violated} "), found
