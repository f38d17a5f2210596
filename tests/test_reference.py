"""Golden examples pinning reference/ (the numpy model) to docs/semantics.md sections 2-5.

Each test names what it pins. Hand-computed expectations only: no other package's model.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import pcpcheck_reference as R
from pcpcheck_spec.model import pad_label  # the spec's statement of the label, to hold reference to
from pcpcheck_spec.names import (
    DCP,
    DRAFT,
    DRAFT_MIXED,
    REPLICATED,
    SHARDED,
    Batch,
    Request,
)

T, F = True, False


def dec(q=1, ctx=0, blocks=(0,)):
    return Request(q, False, ctx, blocks)


def pre(q, ctx=0, blocks=(0,)):
    return Request(q, True, ctx, blocks)


def three_decodes(regime, graph_size=0):
    return Batch(regime, 2, (dec(), dec(), dec()), graph_size=graph_size)


def rank_labels(lay, r):
    return lay.tokens[r].tolist()


def as_tensors(labels, trailing=(2, 3)):
    """Two tensors per rank derived from row labels: float16 (L, *trailing) and int8 (L, 4)."""
    labels = np.asarray(labels, dtype=np.int64)
    a = np.broadcast_to(labels.astype(np.float16)[:, None, None], (len(labels),) + trailing).copy()
    b = np.broadcast_to((labels % 128).astype(np.int8)[:, None], (len(labels), 4)).copy()
    return (a, b)


def assert_rows(out_tensors, labels):
    exp = as_tensors(labels)
    assert len(out_tensors) == 2
    for got, want in zip(out_tensors, exp):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


# --------------------------------------------------------------------------- section 2 goldens


def test_golden_sharded_three_decodes_counts_and_expanded_map():
    """Pins: round-robin decode owners (0,1,0), counts [2,1], E = [123,789,456,-1]."""
    lay = R.layout(three_decodes(SHARDED), slots=[123, 456, 789])
    assert lay.counts.tolist() == [2, 1]
    assert lay.width == lay.num_rows == 2
    assert lay.gidx.tolist() == [0, 2, 1, 0]
    assert lay.wmask.tolist() == [T, T, T, F]
    assert all(s.tolist() == [123, 789, 456, -1] for s in lay.slot_maps)
    assert lay.shard is True
    assert lay.num_decode_tokens == [2, 1]
    assert rank_labels(lay, 0) == [0, 2] and rank_labels(lay, 1) == [1, pad_label(1, 1, 2)]


def test_golden_sharded_three_decodes_gather_rows_and_slots():
    """Pins: branch B gathers rows [11,33 | 22,0] to [11,33,22,0] with slots [123,789,456,-1]."""
    lay = R.layout(three_decodes(SHARDED), slots=[123, 456, 789])
    rows = [(np.array([11, 33]),), (np.array([22, 0]),)]
    out = R.gather(rows, lay.slot_maps, lay.num_decode_tokens, lay.shard)
    for (tensors, slots) in out:
        assert tensors[0].tolist() == [11, 33, 22, 0]
        assert slots.tolist() == [123, 789, 456, -1]


def test_golden_sharded_graph_padding_w4():
    """Pins: graph padding W=4: gidx=[0,2,0,0,1,0,0,0], wmask=[T,T,F,F,T,F,F,F], pad labels."""
    lay = R.layout(three_decodes(SHARDED, graph_size=4))
    assert lay.width == 4
    assert lay.gidx.tolist() == [0, 2, 0, 0, 1, 0, 0, 0]
    assert lay.wmask.tolist() == [T, T, F, F, T, F, F, F]
    assert rank_labels(lay, 0) == [0, 2, pad_label(0, 2, 4), pad_label(0, 3, 4)]
    assert rank_labels(lay, 1) == [1] + [pad_label(1, j, 4) for j in (1, 2, 3)]


def test_golden_replicated_w4_mask_only_rank0():
    """Pins: replicated decodes on every rank, counts [3,3], gidx=[0,1,2,0,0,1,2,0], rank-0 mask."""
    lay = R.layout(three_decodes(REPLICATED, graph_size=4), slots=[7, 8, 9])
    assert lay.counts.tolist() == [3, 3]
    assert lay.gidx.tolist() == [0, 1, 2, 0, 0, 1, 2, 0]
    assert lay.wmask.tolist() == [T, T, T, F, F, F, F, F]
    assert lay.slot_maps[1].tolist() == [7, 8, 9, -1, -1, -1, -1, -1]
    assert lay.shard is False and lay.num_decode_tokens == [3, 3]


def test_golden_graph_size_below_count_is_error():
    """Pins: 0 < graph_size < max_r n_r raises ValueError."""
    with pytest.raises(ValueError):
        R.layout(three_decodes(REPLICATED, graph_size=2))


def test_golden_legacy_mixed_gather_nd1_writes_cache_slots():
    """Pins: branch E with nd=1, E=[10,11,12,13,-1,21,22,23] (W=4) writes [10..13,21..23]."""
    e = np.array([10, 11, 12, 13, -1, 21, 22, 23])
    rows = [(np.array([100, 101, 102, 103]),), (np.array([100, 201, 202, 203]),)]
    out = R.gather(rows, [e, e], [1, 1], False)
    for tensors, slots in out:
        assert slots.tolist() == [10, 11, 12, 13, 21, 22, 23]
        assert tensors[0].tolist() == [100, 101, 102, 103, 201, 202, 203]
        cache = np.full((8, 4), -9, dtype=np.int64)
        R.write_cache(cache, tensors[0], slots)
        written = np.flatnonzero(cache.ravel() != -9).tolist()
        assert written == [10, 11, 12, 13, 21, 22, 23]
        assert cache.ravel()[written].tolist() == [100, 101, 102, 103, 201, 202, 203]


def test_golden_legacy_mixed_from_layout():
    """Pins: a decode + three 2-token prefills (replicated regime) yields the legacy map above and
    the written cache equals expected_caches on both ranks."""
    batch = Batch(REPLICATED, 2, (dec(), pre(2), pre(2), pre(2)), graph_size=4)
    s = np.array([10, 11, 21, 12, 22, 13, 23])
    lay = R.layout(batch, slots=s)
    assert rank_labels(lay, 0) == [0, 1, 3, 5] and rank_labels(lay, 1) == [0, 2, 4, 6]
    assert lay.slot_maps[0].tolist() == [10, 11, 12, 13, -1, 21, 22, 23]
    assert lay.num_decode_tokens == [1, 1]
    out = R.gather([(lay.tokens[r],) for r in range(2)], lay.slot_maps, lay.num_decode_tokens, False)
    for r, (tensors, slots) in enumerate(out):
        cache = np.full((8, 4), -99, dtype=np.int64)
        R.write_cache(cache, tensors[0], slots)
        exp_slots, exp_tokens = R.expected_caches(batch, slots=s)[r]
        assert np.flatnonzero(cache.ravel() != -99).tolist() == exp_slots.tolist()
        assert cache.ravel()[exp_slots].tolist() == exp_tokens.tolist()


def test_head_tail_p2_q7():
    """Pins: DualChunkSwap, c=ceil(7/4)=2: rank 0 [A B G], rank 1 [C D E F] (no per-request pad)."""
    lay = R.layout(Batch(REPLICATED, 2, (pre(7),)))
    assert lay.counts.tolist() == [3, 4]
    assert rank_labels(lay, 0) == [0, 1, 6, pad_label(0, 3, 4)]
    assert rank_labels(lay, 1) == [2, 3, 4, 5]
    assert lay.wmask.tolist() == [T, T, T, F, T, T, T, T]
    assert lay.num_decode_tokens == [0, 0]


def test_head_tail_empty_chunks_dropped_and_row_order():
    """Pins: P=2, q=5 (c=2: [0,2),[2,4),[4,5),[5,5)): rank 0 head only; decodes first on every
    rank, then prefill rows grouped by request, head before tail."""
    batch = Batch(REPLICATED, 2, (pre(5), dec(), pre(3)))
    lay = R.layout(batch)
    # tokens: prefill 0..4, decode 5, prefill 6..8 (q=3: c=1 -> [6],[7],[8],[])
    assert rank_labels(lay, 0)[: lay.counts[0]] == [5, 0, 1, 6]
    assert rank_labels(lay, 1)[: lay.counts[1]] == [5, 2, 3, 4, 7, 8]
    assert lay.num_decode_tokens == [1, 1]


def test_round_robin_owners_skip_q0_requests():
    """Pins: owner = ordinal mod P over replicated requests with q > 0 (q=0 requests and split
    prefills are not counted); ordinals restart each step."""
    batch = Batch(
        SHARDED, 2, (dec(), dec(0), pre(4), dec(2), pre(0), dec(), dec())
    )
    # tokens: d0=[0], prefill=[1..4], d3=[5,6], d5=[7], d6=[8]; ordinals d0:0, d3:1, d5:2, d6:3
    lay = R.layout(batch)
    assert rank_labels(lay, 0)[: lay.counts[0]] == [0, 7, 1, 4]
    assert rank_labels(lay, 1)[: lay.counts[1]] == [5, 6, 8, 2, 3]
    assert lay.num_decode_tokens == [2, 3]
    assert lay.wmask.reshape(2, -1)[0, :4].all() and lay.wmask.reshape(2, -1)[1, :5].all()
    again = R.layout(batch)  # not sticky: the same step gives the same owners
    assert again.gidx.tolist() == lay.gidx.tolist()


# --------------------------------------------------------------------------- section 3


def test_dcp_slot_formula_interleave_1():
    """Pins: D=2, I=1, B=4 (8 positions per virtual block): owner = pos%8 % 2, local = off//2."""
    batch = Batch(DCP, 2, (Request(10, True, 3, (5, 9)),), block_size=4, interleave=1)
    # positions 3..12. vb0 -> block 5 (slots 20..23), vb1 -> block 9 (slots 36..39)
    s0 = R.global_slots(batch, 0).tolist()
    s1 = R.global_slots(batch, 1).tolist()
    #        pos: 3   4   5   6   7   8   9  10  11  12
    assert s0 == [-1, 22, -1, 23, -1, 36, -1, 37, -1, 38]
    assert s1 == [21, -1, 22, -1, 23, -1, 36, -1, 37, -1]


def test_dcp_slot_formula_interleave_2():
    """Pins: D=2, I=2, B=4: owner = (off//2)%2, local = (off//4)*2 + off%2."""
    batch = Batch(DCP, 2, (Request(8, True, 5, (5, 9)),), block_size=4, interleave=2)
    # positions 5..12: off 5,6,7 (vb0), 0,1,2,3,4 (vb1)
    s0 = R.global_slots(batch, 0).tolist()
    s1 = R.global_slots(batch, 1).tolist()
    #        pos: 5   6   7   8   9  10  11  12
    assert s0 == [23, -1, -1, 36, 37, -1, -1, 38]
    assert s1 == [-1, 22, 23, -1, -1, 36, 37, -1]


def test_d1_slot_formula():
    """Pins: D=1: slot = block*B + pos%B with the request's block table and context_len."""
    batch = Batch(SHARDED, 2, (Request(3, True, 13, (2, 7)), dec(1, 0, (4,))), block_size=8)
    # positions 13,14,15 -> virtual block 1 (block 7), offsets 5,6,7; then position 0 of block 4
    assert R.global_slots(batch, 0).tolist() == [61, 62, 63, 32]


# --------------------------------------------------------------------------- short prefills / DCP


def test_short_prefill_replicated_under_dcp_only():
    """Pins: under D>1 a prefill with (2P-1)*ceil(q/2P) >= q is replicated (q=3, P=2), written by
    rank 0 only and each rank's map keeps only its own DCP tokens; q=4 is split. Under D=1 the
    same q=3 prefill is split."""
    reqs = (Request(3, True, 0, (1,)), Request(4, True, 0, (2,)))
    lay = R.layout(Batch(DCP, 2, reqs, block_size=4))
    # tokens 0..2 (short, replicated), 3..6 (q=4, c=1: rank0 [3],[6]; rank1 [4],[5])
    assert rank_labels(lay, 0) == [0, 1, 2, 3, 6]
    assert rank_labels(lay, 1)[:5] == [0, 1, 2, 4, 5]
    assert lay.wmask.tolist() == [T, T, T, T, T, F, F, F, T, T]
    # DCP rank 0 owns even positions, rank 1 odd (B=4, D=2, I=1): local slot = block*4 + off//2
    assert lay.slot_maps[0].tolist() == [4, -1, 5, 8, -1, -1, -1, -1, -1, 9]
    assert lay.slot_maps[1].tolist() == [-1, 4, -1, -1, 9, -1, -1, -1, 8, -1]
    assert lay.num_decode_tokens == [0, 0] and lay.shard is False
    split = R.layout(Batch(REPLICATED, 2, reqs[:1], block_size=4))
    assert split.counts.tolist() == [1, 2]


def test_dcp_q5_replicated_q8_split():
    """Pins: the (2P-1)*c >= q test at its edges: q=5 (c=2, 6>=5) replicated, q=8 (6<8) split."""
    lay = R.layout(Batch(DCP, 2, (Request(5, True, 0, (0, 1)), Request(8, True, 0, (2, 3)))))
    assert lay.counts.tolist() == [5 + 4, 5 + 4]
    assert rank_labels(lay, 0) == [0, 1, 2, 3, 4, 5, 6, 11, 12]
    assert rank_labels(lay, 1) == [0, 1, 2, 3, 4, 7, 8, 9, 10]


# --------------------------------------------------------------------------- drafts


def test_draft_dp_padded_layout():
    """Pins: draft regime: same rows on every rank in batch order, L = N + dp_pad, DP pad rows are
    padding labels, unexpanded map of length N (or L padded with -1), nd = N, shard False."""
    reqs = (dec(2, 0, (3,)), dec(1, 5, (4,)))
    lay = R.layout(Batch(DRAFT, 2, reqs, block_size=16, dp_pad=2))
    assert lay.num_rows == lay.width == 5 and lay.counts.tolist() == [3, 3]
    assert rank_labels(lay, 0) == [0, 1, 2, pad_label(0, 3, 5), pad_label(0, 4, 5)]
    assert rank_labels(lay, 1) == [0, 1, 2, pad_label(1, 3, 5), pad_label(1, 4, 5)]
    assert lay.gidx is None and lay.wmask is None and lay.shard is False
    assert [s.tolist() for s in lay.slot_maps] == [[48, 49, 69]] * 2
    assert lay.num_decode_tokens == [3, 3]
    padded = R.layout(Batch(DRAFT, 2, reqs, block_size=16, dp_pad=2, pad_slot_map=True))
    assert [s.tolist() for s in padded.slot_maps] == [[48, 49, 69, -1, -1]] * 2


def test_draft_mixed_nd_and_errors():
    """Pins: draft-mixed takes nd from the batch (0 <= nd < N) and rejects prefills / bad nd."""
    reqs = (dec(2), dec(1, 2))
    lay = R.layout(Batch(DRAFT_MIXED, 2, reqs, num_decode_tokens=1))
    assert lay.num_decode_tokens == [1, 1]
    for bad in (None, 3, -1):
        with pytest.raises(ValueError):
            R.layout(Batch(DRAFT_MIXED, 2, reqs, num_decode_tokens=bad))
    with pytest.raises(ValueError):
        R.layout(Batch(DRAFT, 2, (dec(), pre(2))))


def test_draft_mixed_gather_writes_every_real_row():
    """Pins: branch A returns T[:S], s[:S], not upstream's [:nd] (bug class 10)."""
    reqs = (dec(2, 0, (0,)), dec(1, 2, (0,)))
    lay = R.layout(Batch(DRAFT_MIXED, 2, reqs, num_decode_tokens=1, dp_pad=1))
    out = R.gather([(lay.tokens[r],) for r in range(2)], lay.slot_maps, lay.num_decode_tokens, False)
    for tensors, slots in out:
        assert tensors[0].tolist() == [0, 1, 2] and slots.tolist() == [0, 1, 2]


# --------------------------------------------------------------------------- section 5 branches


def test_branch_letters():
    """Pins: the branch table order: S <= L -> A first, then shard -> B, nd == L -> C, nd == 0 -> D,
    else E; nd outside 0..L is rejected."""
    assert R.branch(4, 4, 0, True) == "A"
    assert R.branch(4, 3, 4, False) == "A"
    assert R.branch(2, 4, 1, True) == "B"
    assert R.branch(2, 4, 2, False) == "C"
    assert R.branch(2, 4, 0, False) == "D"
    assert R.branch(3, 6, 1, False) == "E"
    with pytest.raises(ValueError):
        R.branch(2, 4, 3, False)


def test_gather_branch_a_two_tensors():
    """Pins: A (S=3 <= L=4, nd=2): rows T[:3] of both tensors, slots s[:3]; no collective."""
    lab = [[5, 6, 7, -4], [5, 6, 7, -8]]
    out = R.gather([as_tensors(x) for x in lab], [np.array([50, 60, 70])] * 2, [2, 2], False)
    for tensors, slots in out:
        assert_rows(tensors, [5, 6, 7])
        assert slots.tolist() == [50, 60, 70]


def test_gather_branch_b_two_tensors():
    """Pins: B: all ranks' T rank-major (P*L rows), slots s[:P*L]."""
    lab = [[1, 2], [3, -4]]
    s = np.array([10, 20, 30, -1])
    out = R.gather([as_tensors(x) for x in lab], [s, s], [1, 0], True)
    for tensors, slots in out:
        assert_rows(tensors, [1, 2, 3, -4])
        assert slots.tolist() == [10, 20, 30, -1]


def test_gather_branch_c_two_tensors():
    """Pins: C (not shard, nd == L): local T, slots s[:L] (rank 0's block, on every rank)."""
    lab = [[1, 2], [1, 2]]
    s = np.array([10, 20, -1, -1])
    out = R.gather([as_tensors(x) for x in lab], [s, s], [2, 2], False)
    for tensors, slots in out:
        assert_rows(tensors, [1, 2])
        assert slots.tolist() == [10, 20]


def test_gather_branch_d_two_tensors():
    """Pins: D (not shard, nd == 0): all ranks' T rank-major, slots s[:P*L]."""
    lab = [[1, -2], [3, 4]]
    s = np.array([10, -1, 30, 40, 99])
    out = R.gather([as_tensors(x) for x in lab], [s, s], [0, 0], False)
    for tensors, slots in out:
        assert_rows(tensors, [1, -2, 3, 4])
        assert slots.tolist() == [10, -1, 30, 40]


def test_gather_branch_e_two_tensors():
    """Pins: E (0 < nd=1 < L=3): T[:1] ++ T0[1:] ++ T1[1:]; s[:1] ++ s[1:3] ++ s[4:6]."""
    lab = [[9, 1, 2], [9, 3, -6]]
    s = np.array([90, 10, 20, -1, 30, -1])
    out = R.gather([as_tensors(x) for x in lab], [s, s], [1, 1], False)
    for tensors, slots in out:
        assert_rows(tensors, [9, 1, 2, 3, -6])
        assert slots.tolist() == [90, 10, 20, 30, -1]


def test_gather_bit_exact_bytes():
    """Pins: copies are bit-exact for NaN payloads, -0.0 and uint8-viewed bf16 bytes."""
    f = np.array([np.nan, -0.0, 1.5], dtype=np.float32).view(np.uint32)
    f[0] = 0x7FC01234  # NaN with payload
    t0 = (f.view(np.float32).reshape(3, 1), np.arange(6, dtype=np.uint8).reshape(3, 2))
    t1 = (t0[0][::-1].copy(), t0[1][::-1].copy())
    out = R.gather([t0, t1], [np.arange(6)] * 2, [0, 0], False)
    tensors, _ = out[1]
    assert tensors[0].tobytes() == np.concatenate((t0[0], t1[0])).tobytes()
    assert tensors[1].tobytes() == np.concatenate((t0[1], t1[1])).tobytes()


def test_gather_disagreeing_nd_is_collective_error():
    """Pins: ranks whose all_gather inputs differ in shape (nd 1 vs 2 in E) raise (bug class 3)."""
    lab = [[1, 2, 3], [1, 2, 3]]
    s = np.arange(6)
    with pytest.raises(ValueError, match="collective"):
        R.gather([as_tensors(x) for x in lab], [s, s], [1, 2], False)


# --------------------------------------------------------------------------- section 4 kernel


def test_write_cache_kernel_rule():
    """Pins: one write per slot, block = slot//B, offset = slot%B, slot < 0 skipped, slot 0 is real,
    rows beyond len(slots) ignored, trailing row shape kept."""
    cache = np.zeros((3, 4, 2), dtype=np.int16)
    rows = np.array([[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]], dtype=np.int16)
    R.write_cache(cache, rows, np.array([-1, 0, 5, -7]))
    expected = np.zeros((3, 4, 2), dtype=np.int16)
    expected[0, 0] = [2, 2]
    expected[1, 1] = [3, 3]
    assert np.array_equal(cache, expected)


def test_write_cache_fewer_rows_than_slots_raises():
    """Pins: fewer rows than slots is an out-of-bounds read: ValueError naming rows and slots."""
    cache = np.zeros((2, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="fewer rows"):
        R.write_cache(cache, np.array([1, 2]), np.array([0, 1, 2]))
    assert not cache.any()


# --------------------------------------------------------------------------- expected caches


def test_expected_caches_d1_every_token_on_every_rank():
    """Pins: D=1: every real token at its slot on every rank, sorted by slot."""
    batch = Batch(SHARDED, 2, (Request(2, False, 0, (3,)), Request(3, True, 0, (1,))), block_size=4)
    for slots, tokens in R.expected_caches(batch):
        assert slots.tolist() == [4, 5, 6, 12, 13]
        assert tokens.tolist() == [2, 3, 4, 0, 1]


def test_expected_caches_d2_each_token_once():
    """Pins: D=2: rank r holds exactly DCP rank r's tokens; union = every token, each once."""
    batch = Batch(DCP, 2, (Request(5, True, 1, (1, 2)), dec(1, 0, (3,))), block_size=2)
    (s0, t0), (s1, t1) = R.expected_caches(batch)
    # request 0 positions 1..5 (B*D = 4): owners off%2 -> pos 1:1, 2:0, 3:1, 4:0, 5:1
    assert t0.tolist() == [1, 3, 5] and s0.tolist() == [3, 4, 6]
    assert t1.tolist() == [0, 2, 4] and s1.tolist() == [2, 3, 4]
    assert sorted(t0.tolist() + t1.tolist()) == list(range(6))


# --------------------------------------------------------------------------- end to end


def _random_batch(rng, regime):
    pp = int(rng.integers(2, 5))
    dd = pp if regime == DCP else 1
    bs = int(rng.choice([1, 2, 4, 16]))
    reqs, nxt = [], 0
    for _ in range(int(rng.integers(0, 6))):
        prefilling = regime not in (DRAFT, DRAFT_MIXED) and bool(rng.integers(0, 2))
        q = int(rng.integers(0, 20)) if prefilling else int(rng.integers(1, 4))
        ctx = int(rng.integers(0, 40))
        nb = -(-(ctx + q) // (bs * dd)) or 1
        reqs.append(Request(q, prefilling, ctx, tuple(range(nxt, nxt + nb))))
        nxt += nb
    n = sum(r.num_tokens for r in reqs)
    kw = {}
    if regime in (DRAFT, DRAFT_MIXED):
        if n == 0:
            reqs.append(dec(1, 0, (nxt,)))
            n, nxt = 1, nxt + 1
        kw = dict(dp_pad=int(rng.integers(0, 3)), pad_slot_map=bool(rng.integers(0, 2)))
        if regime == DRAFT_MIXED:
            kw["num_decode_tokens"] = int(rng.integers(0, n))
    elif rng.integers(0, 3) == 0:
        kw["graph_size"] = int(rng.integers(0, 30))
    interleave = int(rng.choice([i for i in (1, 2, 4) if bs % i == 0]))  # I divides B
    batch = Batch(regime, pp, tuple(reqs), block_size=bs, interleave=interleave, **kw)
    return batch, nxt


@pytest.mark.parametrize("regime", [SHARDED, REPLICATED, DCP, DRAFT, DRAFT_MIXED])
def test_end_to_end_layout_gather_write_matches_expected(regime):
    """Pins the pieces together: layout -> gather -> write_cache gives expected_caches on every
    rank (REPLICA for D=1, SHARD for D>1) on seeded random steps."""
    rng = np.random.default_rng(1234)
    done = 0
    while done < 60:
        batch, nblocks = _random_batch(rng, regime)
        try:
            lay = R.layout(batch)
        except ValueError:  # graph size below the count
            assert 0 < batch.graph_size
            continue
        done += 1
        tensors = [as_tensors(lay.tokens[r]) for r in range(batch.pcp_size)]
        out = R.gather(tensors, lay.slot_maps, lay.num_decode_tokens, lay.shard)
        expected = R.expected_caches(batch)
        for r, (outs, slots) in enumerate(out):
            w = slots[slots >= 0]
            assert len(set(w.tolist())) == len(w)
            # Unwritten marker: a non-integer, so no row label (token id or padding) equals it.
            cache = np.full((nblocks + 1, batch.block_size, 2, 3), 0.5, dtype=np.float16)
            R.write_cache(cache, outs[0], slots)
            flat = cache.reshape(-1, 6)
            written = np.flatnonzero((flat != 0.5).any(axis=1))
            exp_slots, exp_tokens = expected[r]
            assert written.tolist() == exp_slots.tolist()
            assert flat[written, 0].astype(np.int64).tolist() == exp_tokens.tolist()
        if R.dcp_size(batch) > 1:
            owned = np.concatenate([t for _, t in expected])
            assert sorted(owned.tolist()) == list(range(sum(q.num_tokens for q in batch.requests)))


@pytest.mark.parametrize("regime", [SHARDED, REPLICATED, DCP])
def test_rank_counts_are_the_layouts_counts(regime):
    """rank_counts (what graph padding is sized by, without the maps) is Layout.counts."""
    rng = np.random.default_rng(99)
    for _ in range(60):
        batch, _ = _random_batch(rng, regime)
        unpadded = replace(batch, graph_size=0)
        assert R.rank_counts(unpadded) == R.layout(unpadded).counts.tolist()
