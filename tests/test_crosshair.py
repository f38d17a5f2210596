"""CrossHair over the spec model's gather (bounded domain: P <= 3, at most 2 requests, rows per
rank L <= 3, distinct slots), checking UNIQUE, PAD_HYGIENE, PAIRING, LENGTH, COLLECTIVE, REPLICA and SHARD.

A clean run is not a proof: it spends a fixed budget of iterations (BUDGET, the same for clean
and planted runs; the wall-clock limit is only a guard against a stuck path). What makes a clean
run worth something, per regime: a probe (the same property with a violation right after the
preconditions) is found within the budget, so the preconditions are satisfiable and the domain
is explored; and a planted bug in that regime is found within the same budget
(CrossHair's asserts mode: leading asserts are preconditions, `analysis_kind=asserts`).

PYTEST_DONT_REWRITE: pytest's assertion rewriting would reach the property CrossHair executes,
changing its messages and slowing the search about tenfold.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from crosshair.core_and_libs import AnalysisKind, MessageType, analyze_function, run_checkables
from crosshair.options import AnalysisOptionSet

from pcpcheck.search.draw import kernel_decode_tokens
from pcpcheck_spec import invariants as inv
from pcpcheck_spec import model
from pcpcheck_spec.names import (
    BRANCH_MIXED,
    BRANCH_NO_DECODE,
    BRANCH_SHARDED,
    BRANCH_UNEXPANDED,
    COLLECTIVE,
    DCP,
    DRAFT,
    DRAFT_DECODE_THRESHOLD,
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

pytestmark = pytest.mark.heavy  # .ci/run's stage of the heaviest evidence

Gather = Callable[[list[list[int]], list[list[int]], list[int], bool], list[tuple[list[int], list[int]]]]

MAX_TOKENS_PLUS_PAD = 3  # bounds every rank's row count L (W <= N + graph padding, L = N + dp_pad)


PROBE = "PROBE"  # the planted violation right after the preconditions


def make_property(gather: Gather, regime: int, probe: bool = False, satisfiable: bool = True):
    """The property CrossHair explores, for one regime (a concrete regime keeps the path tree
    narrow) and a given gather (the model's, or a planted bug). probe: fail right after the
    preconditions; satisfiable=False adds a precondition no input meets (to show it is caught)."""

    def gather_keeps_invariants(
        pcp_size: int, requests: list[tuple[int, bool]], blocks: list[int], pad: int, pad_map: bool
    ) -> None:
        # Leading asserts are preconditions (WF_SLOTS, WF_LAYOUT, WF_WIDTH hold by construction).
        assert 2 <= pcp_size <= 3
        assert len(requests) <= 2
        assert all(0 <= q <= MAX_TOKENS_PLUS_PAD for q, _ in requests)
        assert 0 <= pad
        assert sum(q for q, _ in requests) + pad <= MAX_TOKENS_PLUS_PAD
        assert regime < 3 or not any(prefilling for _, prefilling in requests)  # drafts: decodes
        assert regime != 4 or any(q > DRAFT_DECODE_THRESHOLD for q, _ in requests)  # a draft block
        assert regime < 3 or all(q > 0 for q, _ in requests)
        assert len(blocks) == sum(q for q, _ in requests)
        assert all(block >= 0 for block in blocks)
        assert len(set(blocks)) == len(blocks)  # distinct slots, or permutation bugs hide
        assert satisfiable or pcp_size > 4
        if probe:
            raise AssertionError(PROBE)
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
            mixed_nd = kernel_decode_tokens(built) if regime == 4 else None
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
        if model.dcp_size(batch) == 1:
            assert inv.replica(expected[0], caches), REPLICA
        else:
            assert inv.shard(expected, caches, list(range(num_tokens))), SHARD

    return gather_keeps_invariants


BUDGET = AnalysisOptionSet(
    analysis_kind=[AnalysisKind.asserts],
    max_iterations=150,  # the budget: paths explored, for clean and planted runs alike
    per_condition_timeout=120,  # a guard only: the iterations run out first (1-10 s)
)


def counterexamples(gather: Gather, regime: str, probe: bool = False, satisfiable: bool = True) -> list[str]:
    """CrossHair's findings within BUDGET. Raises when CrossHair could not meet the preconditions."""
    prop = make_property(gather, REGIMES.index(regime), probe, satisfiable)
    messages = list(run_checkables(analyze_function(prop, BUDGET)))
    unmet = [m.message for m in messages if m.state == MessageType.PRE_UNSAT]
    assert not unmet, f"CrossHair could not meet the preconditions in {regime}: {unmet}"
    return [message.message for message in messages if message.state > MessageType.PRE_UNSAT]


def explored(gather: Gather, regime: str, satisfiable: bool = True) -> list[str]:
    """The findings of a run whose domain is shown to be reachable: the probe must be found."""
    probe = counterexamples(gather, regime, probe=True, satisfiable=satisfiable)
    assert any(PROBE in message for message in probe), f"vacuous in {regime}: the probe was not found"
    return counterexamples(gather, regime, satisfiable=satisfiable)


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


def unexpanded_keeps_one_row_less(letter, rank, rows, slot_maps, nds, out_rows, out_slots):
    """Off by one in branch A: T[:S-1], s[:S-1]: the last real token's KV is never written
    (unless the map was padded with -1 to L, when only a -1 is lost)."""
    if letter != BRANCH_UNEXPANDED:
        return out_rows, out_slots
    return out_rows[:-1], out_slots[:-1]


@pytest.mark.parametrize("regime", REGIMES)
def test_model_gather_keeps_invariants_within_budget(regime):
    """UNIQUE, PAD_HYGIENE, PAIRING, LENGTH, COLLECTIVE, REPLICA, SHARD on the model's gather,
    after the probe showed the preconditions satisfiable within the same budget."""
    assert explored(model.gather, regime) == []


def test_unsatisfiable_preconditions_do_not_pass_silently():
    with pytest.raises(AssertionError, match="could not meet the preconditions|vacuous"):
        explored(model.gather, DRAFT, satisfiable=False)


PLANTED = [
    (decode_slots_from_local_block, REPLICATED, REPLICA),
    (decode_slots_from_local_block, DCP, SHARD),
    (map_read_token_major, SHARDED, PAD_HYGIENE),
    (map_read_token_major, DCP, PAIRING),
    (unexpanded_keeps_one_row_less, DRAFT, REPLICA),
    (upstream_unexpanded_keeps_nd, DRAFT_MIXED, REPLICA),
]


def test_every_regime_has_a_planted_bug():
    assert {regime for _, regime, _ in PLANTED} == set(REGIMES)


@pytest.mark.parametrize("rank_bug, regime, violated", PLANTED,
                         ids=[f"{bug.__name__}-{regime}" for bug, regime, _ in PLANTED])
def test_crosshair_finds_planted_bug(rank_bug, regime, violated):
    """The clean runs' budget is enough to find each planted bug; the ID is the first assert it
    breaks."""
    found = counterexamples(planted(rank_bug), regime)
    assert found, f"CrossHair missed {rank_bug.__name__} in {regime} within its budget"
    assert found[0].startswith(f"AssertionError: {violated} "), found
