"""Unit tests of spec/model.py: the golden examples of docs/semantics.md section 2, the slot
formula, each gather branch, the kernel rule, and one property test tying model + predicates
together (section numbers below are docs/semantics.md's)."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pcpcheck_spec import invariants as inv
from pcpcheck_spec import model
from pcpcheck_spec.model import pad_label
from pcpcheck_spec.names import (
    BRANCH_ALL_DECODE,
    BRANCH_MIXED,
    BRANCH_NO_DECODE,
    BRANCH_SHARDED,
    BRANCH_UNEXPANDED,
    COLLECTIVE,
    DCP,
    DRAFT,
    DRAFT_MIXED,
    LENGTH,
    NO_MUTATION,
    NO_ROW,
    PAD_HYGIENE,
    PAIRING,
    REGIMES,
    REPLICA,
    REPLICATED,
    RETURNS,
    SHARD,
    SHARDED,
    UNIQUE,
    Batch,
    Request,
)
from pcpcheck_spec.registry import Step, applicable, evaluate

T, F = True, False


def decode_at(slot: int, block_size: int = 1000) -> Request:
    """A 1-token decode whose D = 1 slot is `slot` (block 0, offset slot % block_size)."""
    return Request(1, False, context_len=slot % block_size, blocks=(slot // block_size,))


def three_decodes(regime: str, graph_size: int = 0) -> Batch:
    requests = tuple(decode_at(slot) for slot in (123, 456, 789))
    return Batch(regime, 2, requests, block_size=1000, graph_size=graph_size)


# --- golden examples of section 2 ---------------------------------------------------------------


def test_golden_sharded_three_decodes():
    lay = model.layout(three_decodes(SHARDED))
    assert lay.counts == [2, 1]
    assert lay.slot_maps == [[123, 789, 456, -1]] * 2
    assert lay.shard is True
    # The gather of the golden example, at function level with its row values.
    out = model.gather([[11, 33], [22, 0]], lay.slot_maps, [2, 1], True)
    assert out == [([11, 33, 22, 0], [123, 789, 456, -1])] * 2


def test_golden_sharded_graph_padding_w4():
    lay = model.layout(three_decodes(SHARDED, graph_size=4))
    assert lay.width == lay.num_rows == 4
    assert lay.gidx == [0, 2, 0, 0, 1, 0, 0, 0]
    assert lay.wmask == [T, T, F, F, T, F, F, F]
    assert lay.tokens[1] == [1, pad_label(1, 1, 4), pad_label(1, 2, 4), pad_label(1, 3, 4)]


def test_golden_replicated_w4():
    lay = model.layout(three_decodes(REPLICATED, graph_size=4))
    assert lay.counts == [3, 3]
    assert lay.gidx == [0, 1, 2, 0, 0, 1, 2, 0]
    assert lay.wmask == [T, T, T, F, F, F, F, F]
    assert lay.num_decode_tokens == [3, 3]
    assert lay.shard is False


def test_golden_legacy_mixed_gather_nd1():
    slots = [10, 11, 12, 13, -1, 21, 22, 23]
    rows = [[0, 1, 2, 3], [0, 5, 6, 7]]
    out = model.gather(rows, [slots, slots], [1, 1], False)
    assert out[0] == ([0, 1, 2, 3, 5, 6, 7], [10, 11, 12, 13, 21, 22, 23])
    assert out[1] == out[0]


def test_head_tail_p2_q7():
    # [A B G] / [C D E F]: rank 0 gets chunk 0 (head) and chunk 3 (tail).
    assert model.split_positions(7, 2, 0) == [0, 1, 6]
    assert model.split_positions(7, 2, 1) == [2, 3, 4, 5]
    lay = model.layout(Batch(REPLICATED, 2, (Request(7, True, blocks=(0,)),)))
    assert lay.counts == [3, 4]
    assert lay.tokens == [[0, 1, 6, pad_label(0, 3, 4)], [2, 3, 4, 5]]
    assert lay.wmask == [T, T, T, F, T, T, T, T]


def test_head_tail_drops_empty_chunks():
    # P=3, q=7: c=2, chunks [0,2) [2,4) [4,6) [6,7) and two empty ones.
    assert [model.split_positions(7, 3, r) for r in range(3)] == [[0, 1], [2, 3], [4, 5, 6]]
    # q=1 under P=2: only rank 0's head chunk is non-empty.
    assert [model.split_positions(1, 2, r) for r in range(2)] == [[0], []]


def test_round_robin_owners_skip_empty_requests():
    requests = (
        Request(1, False, blocks=(0,)),  # ordinal 0 -> rank 0
        Request(0, False, blocks=(1,)),  # q = 0: no ordinal
        Request(4, True, blocks=(2,)),  # prefill: split, no ordinal
        Request(1, False, blocks=(3,)),  # ordinal 1 -> rank 1
        Request(2, False, blocks=(4,)),  # ordinal 2 -> rank 0
    )
    lay = model.layout(Batch(SHARDED, 2, requests))
    # Tokens: req0 0; req2 1..4; req3 5; req4 6,7. Decodes first, prefill head then tail.
    assert lay.tokens == [[0, 6, 7, 1, 4], [5, 2, 3, pad_label(1, 3, 5), pad_label(1, 4, 5)]]
    assert lay.num_decode_tokens == [3, 1]
    assert lay.wmask == [T] * 5 + [T, T, T, F, F]


def test_round_robin_rank_may_own_nothing():
    lay = model.layout(Batch(SHARDED, 3, (decode_at(5, 16), decode_at(7, 16))))
    assert lay.counts == [1, 1, 0]
    assert lay.tokens[2] == [pad_label(2, 0, 1)]
    assert lay.slot_maps[0] == [5, 7, -1]


def test_replicated_regime_has_no_owners():
    lay = model.layout(Batch(REPLICATED, 3, (decode_at(5, 16), decode_at(7, 16))))
    assert lay.counts == [2, 2, 2]
    assert lay.slot_maps[0] == [5, 7, -1, -1, -1, -1]


# --- section 3: slot formula --------------------------------------------------------------------


def test_slots_without_dcp():
    batch = Batch(REPLICATED, 2, (Request(3, True, context_len=3, blocks=(3, 7)),), block_size=4)
    assert model.global_slots(batch, 0) == [15, 28, 29]


def test_dcp_slots_interleave_1():
    batch = Batch(DCP, 2, (Request(8, True, blocks=(5,)),), block_size=4, interleave=1)
    assert model.global_slots(batch, 0) == [20, -1, 21, -1, 22, -1, 23, -1]
    assert model.global_slots(batch, 1) == [-1, 20, -1, 21, -1, 22, -1, 23]


def test_dcp_slots_interleave_2():
    batch = Batch(DCP, 2, (Request(8, True, blocks=(5,)),), block_size=4, interleave=2)
    assert model.global_slots(batch, 0) == [20, 21, -1, -1, 22, 23, -1, -1]
    assert model.global_slots(batch, 1) == [-1, -1, 20, 21, -1, -1, 22, 23]


def test_dcp_slots_cross_virtual_block():
    # Positions 6..9: 6, 7 in virtual block 0 (rank 1), 8, 9 in virtual block 1 (rank 0).
    batch = Batch(DCP, 2, (Request(4, True, 6, blocks=(5, 9)),), block_size=4, interleave=2)
    assert model.global_slots(batch, 0) == [-1, -1, 36, 37]
    assert model.global_slots(batch, 1) == [22, 23, -1, -1]


def test_missing_block_is_rejected():
    with pytest.raises(ValueError, match="WF_SLOTS"):
        model.global_slots(Batch(REPLICATED, 2, (Request(2, True, 15, blocks=(0,)),)), 0)


def test_interleave_must_divide_block_size():
    # B=4, I=3, D=2: position 7 would land at local offset 4, inside the next block.
    batch = Batch(DCP, 2, (Request(8, True, blocks=(0,)),), block_size=4, interleave=3)
    with pytest.raises(ValueError, match="WF_SLOTS"):
        model.global_slots(batch, 0)


# --- short prefills under DCP, widths -----------------------------------------------------------


def test_short_prefill_replicated_under_dcp_only():
    dcp, plain = Batch(DCP, 2, ()), Batch(REPLICATED, 2, ())
    # P=2: c = ceil(q/4); replicated iff 3c >= q.
    assert [model.is_replicated(dcp, q, True) for q in (1, 5, 6, 7, 8, 9, 10)] == [
        T, T, T, F, F, T, F,
    ]
    assert not model.is_replicated(plain, 6, True)
    assert model.is_replicated(plain, 1, False)


def test_short_prefill_layout_under_dcp():
    batch = Batch(DCP, 2, (decode_at(1, 16), Request(6, True, blocks=(1,))), block_size=16)
    lay = model.layout(batch)
    assert lay.counts == [7, 7]
    assert lay.tokens[0] == lay.tokens[1] == list(range(7))
    assert lay.wmask == [T] * 7 + [F] * 7
    assert lay.num_decode_tokens == [1, 1]
    # Each rank's map keeps only the tokens its DCP rank owns (I = 1: position parity).
    assert lay.slot_maps[0][:7] == [-1, 16, -1, 17, -1, 18, -1]
    assert lay.slot_maps[1][:7] == [0, -1, 16, -1, 17, -1, 18]


def test_graph_size_below_widest_is_an_error():
    with pytest.raises(ValueError, match="WF_WIDTH"):
        model.layout(three_decodes(REPLICATED, graph_size=2))


def test_draft_layouts():
    requests = (decode_at(4, 16), Request(2, False, 0, (2,)))
    lay = model.layout(Batch(DRAFT, 2, requests, dp_pad=2, pad_slot_map=True))
    assert lay.num_rows == 5 and lay.gidx is None and lay.wmask is None
    assert lay.tokens[1] == [0, 1, 2, pad_label(1, 3, 5), pad_label(1, 4, 5)]
    assert lay.slot_maps == [[4, 32, 33, -1, -1]] * 2
    assert lay.num_decode_tokens == [3, 3]
    mixed = model.layout(Batch(DRAFT_MIXED, 2, requests, dp_pad=1, num_decode_tokens=1))
    assert mixed.slot_maps == [[4, 32, 33]] * 2
    assert mixed.num_decode_tokens == [1, 1]
    with pytest.raises(ValueError, match="WF_LAYOUT"):
        model.layout(Batch(DRAFT, 2, (Request(2, True, 0, (0,)),)))


# --- section 5: each branch ---------------------------------------------------------------------


def test_branch_letters():
    assert model.branch(4, 4, 0, True) == BRANCH_UNEXPANDED
    assert model.branch(4, 8, 1, True) == BRANCH_SHARDED
    assert model.branch(4, 8, 4, False) == BRANCH_ALL_DECODE
    assert model.branch(4, 8, 0, False) == BRANCH_NO_DECODE
    assert model.branch(4, 8, 2, False) == BRANCH_MIXED


def test_branch_a_keeps_every_real_row_not_nd():
    # draft-mixed: nd = 1 of 3 real rows, L = 4. Upstream keeps [:1]; the spec keeps [:S].
    rows = [[0, 1, 2, -4]] * 2
    out = model.gather(rows, [[7, 8, 9]] * 2, [1, 1], False)
    assert out == [([0, 1, 2], [7, 8, 9])] * 2
    padded = model.gather(rows, [[7, 8, 9, -1]] * 2, [1, 1], False)
    assert padded == [([0, 1, 2, -4], [7, 8, 9, -1])] * 2


def test_branch_b_gathers_every_rank():
    out = model.gather([[0, 3], [1, -4]], [[5, 8, 6, -1]] * 2, [1, 1], True)
    assert out == [([0, 3, 1, -4], [5, 8, 6, -1])] * 2


def test_branch_c_all_decode_uses_rank0_block():
    out = model.gather([[0, 1], [0, 1]], [[5, 6, -1, -1]] * 2, [2, 2], False)
    assert out == [([0, 1], [5, 6])] * 2


def test_branch_d_no_decode():
    out = model.gather([[0, 3], [1, 2]], [[5, 8, 6, 7]] * 2, [0, 0], False)
    assert out == [([0, 3, 1, 2], [5, 8, 6, 7])] * 2


def test_branch_e_mixed():
    # Decode 0 replicated (only rank 0's copy masked in), prefill 1..3 split.
    slots = [5, 6, -1, -1, 7, 8]
    out = model.gather([[0, 1, -3], [0, 2, 3]], [slots, slots], [1, 1], False)
    assert out == [([0, 1, -3, 2, 3], [5, 6, -1, 7, 8])] * 2


def test_collectives_must_agree():
    # Mixed branch with nd disagreeing across ranks: all_gather shapes differ (bug class 3).
    slots = [5, 6, 9, -1, 7, 8]
    with pytest.raises(ValueError, match="COLLECTIVE"):
        model.gather([[0, 1, 3], [0, 2, -6]], [slots, slots], [1, 2], False)
    # One rank in a collective branch, its peer not (nd == L there): a hang in a real run.
    with pytest.raises(ValueError, match="COLLECTIVE"):
        model.gather([[0, 1], [0, 1]], [[5, 6, -1, -1]] * 2, [1, 2], False)
    assert model.collective_trace(3, 6, 1, False) == [("all_gather", 2)]
    assert model.collective_trace(3, 6, 3, False) == []


# --- section 4: kernel rule, expected caches ----------------------------------------------------


def test_write_skips_negative_slots_and_slot0_is_real():
    assert model.write([5, 6, 7], [-1, 0, 3]) == {0: 6, 3: 7}
    assert model.write([5], [-2]) == {}


def test_write_ignores_extra_rows_and_marks_missing_rows():
    assert model.write([5, 6, 7], [4]) == {4: 5}
    assert model.write([5], [4, 9]) == {4: 5, 9: NO_ROW}


def test_expected_caches():
    batch = Batch(REPLICATED, 2, (decode_at(3, 16), Request(2, True, 0, (1,))), block_size=16)
    assert model.expected_caches(batch) == [{3: 0, 16: 1, 17: 2}] * 2
    dcp = Batch(DCP, 2, (Request(3, True, 0, (1,)),), block_size=2)
    assert model.expected_caches(dcp) == [{2: 0, 3: 2}, {2: 1}]


# --- predicates: each one rejects the violation SPEC.md states, and only that -------------------

ALL_DONE = [("all_gather", 0, (2, 4), "torch.float32")]
HUNG = [("all_gather", 0, (2, 4), "torch.float32"), (inv.INCOMPLETE, "never completed")]

PREDICATE_CASES = [
    # (ID, predicate, arguments, holds)
    (RETURNS, inv.returns, ([None, None],), True),
    (RETURNS, inv.returns, ([None, "raised ValueError"],), False),
    (COLLECTIVE, inv.collective_agreement, ([ALL_DONE, ALL_DONE],), True),
    (COLLECTIVE, inv.collective_agreement, ([ALL_DONE, []],), False),
    (COLLECTIVE, inv.collective_agreement, ([HUNG, HUNG],), False),  # equal, yet never completed
    (NO_MUTATION, inv.no_input_mutation, ([b"a", b"b"], [b"a", b"b"]), True),
    (NO_MUTATION, inv.no_input_mutation, ([b"a", b"b"], [b"a", b"c"]), False),
    (LENGTH, inv.length_agreement, ([[0, 1, -3], [0, 1, 5]], [4, 5]), True),  # extra rows unwritten
    (LENGTH, inv.length_agreement, ([[0]], [4, 5]), False),
    (LENGTH, inv.length_agreement, ([[0, 1], [1, 0]], [4, 5]), False),  # tensors not aligned
    (UNIQUE, inv.uniqueness, ([0, -1, -1, 3],), True),
    (UNIQUE, inv.uniqueness, ([0, 3, 0],), False),  # slot 0 is a real slot
    (PAD_HYGIENE, inv.pad_hygiene, ([0, -2], [4, -1]), True),
    (PAD_HYGIENE, inv.pad_hygiene, ([-2, 0], [0, 4]), False),  # a padding row at slot 0
    (PAD_HYGIENE, inv.pad_hygiene, ([NO_ROW], [4]), False),  # no input row
    (PAD_HYGIENE, inv.pad_hygiene, ([0], [4, 5]), False),  # a row past the returned rows
    (PAIRING, inv.pairing, ({4: 0, 5: 1}, [0, 1, -2], [4, 5, -1]), True),
    (PAIRING, inv.pairing, ({4: 0, 5: 1}, [1, 0], [4, 5]), False),  # swapped
    (PAIRING, inv.pairing, ({4: 0}, [0, 1], [4, 9]), False),  # a slot this rank must not hold
    (REPLICA, inv.replica, ({4: 0}, [{4: 0}, {4: 0}]), True),
    (REPLICA, inv.replica, ({4: 0}, [{4: 0}, {}]), False),  # a peer lost the token
    (SHARD, inv.shard, ([{4: 0}, {4: 1}], [{4: 0}, {4: 1}], [0, 1]), True),
    (SHARD, inv.shard, ([{4: 0}, {4: 1}], [{4: 0}, {}], [0, 1]), False),
    (SHARD, inv.shard, ([{4: 0}, {}], [{4: 0}, {}], [0, 1]), False),  # token 1 owned by no rank
]


@pytest.mark.parametrize("invariant, predicate, arguments, holds", PREDICATE_CASES,
                         ids=[f"{c[0]}-{'holds' if c[3] else 'violated'}-{k}"
                              for k, c in enumerate(PREDICATE_CASES)])
def test_predicate_decides_its_invariant(invariant, predicate, arguments, holds):
    assert predicate(*arguments) is holds, invariant


def _view(rows, slots, caches, returned=True, error=None):
    """One rank as the judge sees it (the fields spec.registry.Step documents)."""
    return SimpleNamespace(error=error, returned=returned, rows=rows, slots=slots, caches=caches,
                           trace=[], inputs_before=[b"x"], inputs_after=[b"x"])


def test_registry_evaluates_every_rank_and_tensor():
    expected = [{4: 0, 5: 1}] * 2
    good = _view([[0, 1], [0, 1]], [4, 5], [{4: 0, 5: 1}] * 2)
    bad = _view([[0, 1], [0, -3]], [4, 5], [{4: 0, 5: 1}, {4: 0, 5: -3}])  # tensor 1 of rank 1
    failed, ran = evaluate(Step([good, bad], expected, [0, 1], 2), REPLICATED)
    assert failed == {LENGTH: [1], PAD_HYGIENE: [1], REPLICA: [1]}
    assert ran == tuple(entry.id for entry in applicable(REPLICATED))


def test_registry_counts_only_predicates_that_ran():
    """Output predicates do not run on ranks whose call failed: a case where no rank returned
    counts for RETURNS, COLLECTIVE, NO_MUTATION and the cache invariant only."""
    failed_call = _view([[]], [], [{}], returned=False, error="raised")
    failed, ran = evaluate(Step([failed_call, failed_call], [{4: 0}] * 2, [0], 1), SHARDED)
    assert ran == (RETURNS, COLLECTIVE, NO_MUTATION, REPLICA)
    assert failed == {RETURNS: [0, 1], REPLICA: [0, 1]}


# --- property: the model satisfies every predicate on well-formed steps -------------------------


@st.composite
def batches(draw) -> Batch:
    """Well-formed steps (WF_SLOTS, WF_LAYOUT, WF_WIDTH) of every regime, small domain: every draw
    is valid by construction (graph size drawn above the widest rank), none is rejected."""
    regime = draw(st.sampled_from(REGIMES))
    pcp_size = draw(st.integers(2, 4))
    dcp_size = pcp_size if regime == DCP else 1
    block_size = draw(st.sampled_from([1, 2, 4]))
    interleave = draw(st.sampled_from([i for i in (1, 2, 4) if block_size % i == 0]))
    draft = regime in (DRAFT, DRAFT_MIXED)
    requests = []
    next_block = 0  # fresh blocks per request keep every token's slot distinct (WF_SLOTS)
    for _ in range(draw(st.integers(0 if not draft else 1, 4))):
        prefilling = False if draft else draw(st.booleans())
        num_tokens = draw(st.integers(0, 9) if prefilling else st.integers(0 if not draft else 1, 3))
        context_len = draw(st.integers(0, 6))
        span = block_size * dcp_size
        num_blocks = -(-(context_len + num_tokens) // span)
        blocks = tuple(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        requests.append(Request(num_tokens, prefilling, context_len, blocks))
    if regime == DRAFT_MIXED and all(r.num_tokens <= 1 for r in requests):
        # draft-mixed needs a multi-token block the kernel counts as prefill
        requests[-1] = Request(2, False, 0, tuple(range(next_block, next_block + 2)))
    batch = Batch(regime, pcp_size, tuple(requests), block_size, interleave)
    if draft:
        return dataclasses.replace(
            batch, dp_pad=draw(st.integers(0, 2)), pad_slot_map=draw(st.booleans()),
            num_decode_tokens=draw(st.integers(0, num_tokens_of(batch) - 1))
            if regime == DRAFT_MIXED else None)
    if draw(st.booleans()):  # graph padding: at least the widest rank's rows
        widest = max(model.layout(batch).counts)
        batch = dataclasses.replace(batch, graph_size=widest + draw(st.integers(0, 3)))
    return batch


ALL_BRANCHES = {BRANCH_UNEXPANDED, BRANCH_SHARDED, BRANCH_ALL_DECODE, BRANCH_NO_DECODE, BRANCH_MIXED}


def test_model_satisfies_every_invariant():
    """The model's gather keeps every predicate on drawn steps, reaching every branch A-E."""
    seen: set[str] = set()

    @settings(max_examples=400, deadline=None)
    @given(batches())
    def check(batch):
        lay = model.layout(batch)  # every draw is well formed: no assume, nothing rejected
        for rank in range(batch.pcp_size):
            letter = model.branch(lay.num_rows, len(lay.slot_maps[rank]), lay.num_decode_tokens[rank],
                                  lay.shard)
            seen.add(letter)
            event(f"{batch.regime} branch {letter}")
        model_keeps_invariants(batch, lay)

    check()
    assert seen == ALL_BRANCHES, f"branches never reached: {sorted(ALL_BRANCHES - seen)}"


def model_keeps_invariants(batch: Batch, lay) -> None:
    pcp_size = batch.pcp_size
    inputs = (lay.tokens, lay.slot_maps, lay.num_decode_tokens)
    before = copy.deepcopy(inputs)
    errors: list[str | None] = [None] * pcp_size
    try:
        outputs = model.gather(lay.tokens, lay.slot_maps, lay.num_decode_tokens, lay.shard)
    except ValueError as error:
        errors = [str(error)] * pcp_size
    assert inv.returns(errors), f"{RETURNS}: {errors[0]}"
    traces = [
        model.collective_trace(lay.num_rows, len(lay.slot_maps[r]), lay.num_decode_tokens[r], lay.shard)
        for r in range(pcp_size)
    ]
    assert inv.collective_agreement(traces), f"{COLLECTIVE}: {traces}"
    assert inv.no_input_mutation(list(before), list(inputs)), NO_MUTATION
    expected = model.expected_caches(batch)
    caches = []
    for rank, (rows, slots) in enumerate(outputs):
        assert inv.length_agreement([rows], slots), f"{LENGTH}: rank {rank} {rows} {slots}"
        assert inv.uniqueness(slots), f"{UNIQUE}: rank {rank} {slots}"
        assert inv.pad_hygiene(rows, slots), f"{PAD_HYGIENE}: rank {rank} {rows} {slots}"
        assert inv.pairing(expected[rank], rows, slots), f"{PAIRING}: rank {rank} {rows} {slots}"
        caches.append(model.write(rows, slots))
    if model.dcp_size(batch) == 1:
        assert inv.replica(expected[0], caches), f"{REPLICA}: {caches} != {expected[0]}"
    else:
        assert inv.shard(expected, caches, list(range(num_tokens_of(batch)))), f"{SHARD}: {caches}"


def num_tokens_of(batch: Batch) -> int:
    return sum(request.num_tokens for request in batch.requests)
