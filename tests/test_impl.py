"""Tests for impl/: the torch gather (five branches), wrappers, cache-write op, groups, provider.

Branches A and C run with a group whose all_gather fails the test; B, D and E with a fake
vLLM-style group returning the rank-major concatenation of canned peer tensors (as vLLM's own unit
tests do), with hand-computed expected outputs. impl issues ONE all_gather per call: with several
tensors the fake group answers the packed form of impl/gather.py's docstring (`packed`). One test
runs 2 real gloo processes.
"""

from __future__ import annotations

import datetime
import math
import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pcpcheck_impl import (
    ProcessGroupAdapter,
    gather_indexer_cache_inputs,
    gather_mla_cache_inputs,
    gather_prefill_cache_inputs,
    get_pcp_group,
    set_pcp_group,
    write_kv_cache,
)

BF16, E4M3, E5M2, I8 = torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()])


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-exact equality with equal dtype and shape."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (tuple(got.shape), tuple(want.shape))
    assert torch.equal(bits(got), bits(want)), (got, want)


def slots(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# groups


class NoCollectiveGroup:
    """World size 2; any collective fails the test (branches A and C need none)."""

    def __init__(self, world_size: int = 2, rank: int = 0) -> None:
        self.world_size = world_size
        self.rank_in_group = rank

    def all_gather(self, t, dim=0):  # pragma: no cover - reaching it is the failure
        pytest.fail(f"all_gather called (shape {tuple(t.shape)}) in a branch that needs none")


def packed(tensors) -> torch.Tensor:
    """The wire format of one call (impl/gather.py's docstring), written from the doc: one tensor
    as itself; several flattened to (n, width) rows side by side, as bytes when dtypes differ."""
    if len(tensors) == 1:
        return tensors[0]
    n = tensors[0].shape[0]
    blocks = [t.reshape(n, math.prod(t.shape[1:])) for t in tensors]
    if len({t.dtype for t in tensors}) > 1:
        blocks = [b.contiguous().view(torch.uint8) for b in blocks]
    return torch.cat(blocks, dim=1)


class FakeGroup:
    """vLLM-style group returning canned peer data.

    ``payloads`` holds, per expected all_gather call in order, every rank's tensors of the call
    (rank-major: one tuple per rank). Each call checks that the local input is bit-identical to
    this rank's tensors in the packed form, then returns the rank-major concatenation of every
    rank's packed form.
    """

    def __init__(self, world_size: int, rank: int, payloads) -> None:
        self.world_size = world_size
        self.rank_in_group = rank
        self.payloads = list(payloads)
        self.calls = 0

    def all_gather(self, t, dim=0):
        assert dim == 0
        assert self.calls < len(self.payloads), "more all_gather calls than expected"
        per_rank = [packed(ts) for ts in self.payloads[self.calls]]
        self.calls += 1
        assert len(per_rank) == self.world_size
        assert_same(t, per_rank[self.rank_in_group])
        return torch.cat(per_rank, dim=0)

    def done(self) -> None:
        assert self.calls == len(self.payloads), f"{self.calls} of {len(self.payloads)} calls made"


@pytest.fixture(autouse=True)
def _no_registered_group():
    set_pcp_group(None)
    yield
    set_pcp_group(None)


# ---------------------------------------------------------------------------------------------
# per-rank test tensors: three tensors of different trailing shapes and dtypes


def rank_tensors(rank: int, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank r, row j: bf16 (L, 2) [100r+10j, 100r+10j+1]; fp8 e4m3 (L, 2, 3) bytes 32r+6j+m
    (m = 0..5, never the NaN byte); int8 (L,) 10r+j."""
    j = torch.arange(num_rows)
    a = torch.stack((100 * rank + 10 * j, 100 * rank + 10 * j + 1), dim=1).to(BF16)
    m = torch.arange(6)
    b = (32 * rank + 6 * j[:, None] + m[None, :]).to(torch.uint8).view(E4M3).reshape(num_rows, 2, 3)
    c = (10 * rank + j).to(I8)
    return a, b, c


def rows_of(pairs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Expected outputs made of (rank, row) pairs, built from the same per-row formula."""
    parts = [rank_tensors(r, 8) for r in range(4)]
    return tuple(
        torch.stack([parts[r][k][j] for r, j in pairs]) if pairs else parts[0][k][:0]
        for k in range(3)
    )


def clone_all(ts):
    return [t.clone() for t in ts]


def assert_unmutated(before, after):
    for b, a in zip(before, after):
        assert_same(a, b)


# ---------------------------------------------------------------------------------------------
# branch A (S <= L) and C (nd == L): no collective


@pytest.mark.parametrize("nd", [0, 1, 3])
def test_branch_a_unexpanded_keeps_every_real_row(nd):
    # Draft with DP padding: L = 4 rows, unexpanded map of the 3 real tokens; nd below the real
    # count (draft-mixed) must still write all three rows (upstream's [:nd] is bug class 10).
    ts = rank_tensors(0, 4)
    s = slots([5, 0, 9])
    before = clone_all([*ts, s])
    out, s_out = gather_prefill_cache_inputs(ts, s, nd, False, group=NoCollectiveGroup())
    assert_same(s_out, slots([5, 0, 9]))
    for got, want in zip(out, rows_of([(0, 0), (0, 1), (0, 2)])):
        assert_same(got, want)
    assert_unmutated(before, [*ts, s])


def test_branch_a_padded_map_equal_length():
    ts = rank_tensors(1, 4)
    s = slots([7, 8, -1, -1])  # pad_slot_map: map padded with -1 to L
    out, s_out = gather_prefill_cache_inputs(ts, s, 4, True, group=NoCollectiveGroup())
    assert_same(s_out, s)
    for got, want in zip(out, rows_of([(1, 0), (1, 1), (1, 2), (1, 3)])):
        assert_same(got, want)


@pytest.mark.parametrize("rank", [0, 1])
def test_branch_c_all_decode_uses_rank0_block(rank):
    # Replicated, every row a decode, P = 2, L = 2: expanded map [10, 11, -1, -1].
    ts = rank_tensors(rank, 2)
    s = slots([10, 11, -1, -1])
    out, s_out = gather_prefill_cache_inputs(ts, s, 2, False, group=NoCollectiveGroup(2, rank))
    assert_same(s_out, slots([10, 11]))
    for got, want in zip(out, ts):
        assert_same(got, want)


# ---------------------------------------------------------------------------------------------
# branch B (shard), D (nd == 0), E (mixed): fake group with canned peers


def test_branch_b_golden_sharded_decodes():
    # docs/semantics.md section 2 golden: three 1-token decodes, slots [123, 456, 789], counts
    # [2, 1], E = [123, 789, 456, -1]; rows [11, 33 | 22, 0] -> [11, 33, 22, 0].
    r0 = (torch.tensor([11, 33], dtype=I8), torch.tensor([[1.5], [3.5]], dtype=BF16))
    r1 = (torch.tensor([22, 0], dtype=I8), torch.tensor([[2.5], [0.0]], dtype=BF16))
    g = FakeGroup(2, 0, [[r0, r1]])
    s = slots([123, 789, 456, -1])
    out, s_out = gather_prefill_cache_inputs(r0, s, 2, True, group=g)
    g.done()
    assert_same(out[0], torch.tensor([11, 33, 22, 0], dtype=I8))
    assert_same(out[1], torch.tensor([[1.5], [3.5], [2.5], [0.0]], dtype=BF16))
    assert_same(s_out, slots([123, 789, 456, -1]))


@pytest.mark.parametrize("rank", [0, 1])
def test_branch_b_three_dtypes(rank):
    per_rank = [rank_tensors(r, 3) for r in range(2)]
    g = FakeGroup(2, rank, [per_rank])
    s = slots([4, 5, -1, 6, 7, 8])  # S = P*L = 6 (S > P*L is a ValueError: test_impl_validation)
    before = clone_all([*per_rank[rank], s])
    out, s_out = gather_prefill_cache_inputs(per_rank[rank], s, 1, True, group=g)
    g.done()
    assert_same(s_out, slots([4, 5, -1, 6, 7, 8]))
    want = rows_of([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)])
    for got, w in zip(out, want):
        assert_same(got, w)
    assert_same(out[2], torch.tensor([0, 1, 2, 10, 11, 12], dtype=I8))
    assert_unmutated(before, [*per_rank[rank], s])


def test_branch_d_no_decode_gathers_all():
    per_rank = [rank_tensors(r, 3) for r in range(2)]
    g = FakeGroup(2, 1, [per_rank])
    s = slots([0, 1, 2, 3, 4, -1])
    out, s_out = gather_prefill_cache_inputs(per_rank[1], s, 0, False, group=g)
    g.done()
    assert_same(s_out, slots([0, 1, 2, 3, 4, -1]))
    assert_same(out[2], torch.tensor([0, 1, 2, 10, 11, 12], dtype=I8))
    for got, w in zip(out, rows_of([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)])):
        assert_same(got, w)


@pytest.mark.parametrize("rank", [0, 1])
def test_branch_e_golden_mixed(rank):
    # docs/semantics.md section 2 golden: nd = 1, W = 4, expanded [10, 11, 12, 13, -1, 21, 22, 23]
    # -> cache slots [10, 11, 12, 13, 21, 22, 23]. Local decode row, then each rank's prefills.
    per_rank = [rank_tensors(r, 4) for r in range(2)]
    g = FakeGroup(2, rank, [[tuple(t[1:] for t in ts) for ts in per_rank]])
    s = slots([10, 11, 12, 13, -1, 21, 22, 23])
    before = clone_all([*per_rank[rank], s])
    out, s_out = gather_prefill_cache_inputs(per_rank[rank], s, 1, False, group=g)
    g.done()
    assert_same(s_out, slots([10, 11, 12, 13, 21, 22, 23]))
    want = rows_of([(rank, 0), (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)])
    for got, w in zip(out, want):
        assert_same(got, w)
    assert_same(out[2], torch.tensor([10 * rank, 1, 2, 3, 11, 12, 13], dtype=I8))
    assert_same(out[0][4], torch.tensor([110, 111], dtype=BF16))
    assert_unmutated(before, [*per_rank[rank], s])


def test_branch_e_three_ranks_two_decodes():
    # P = 3, L = 4, nd = 2: s[:2] ++ s[2:4] ++ s[6:8] ++ s[10:12].
    per_rank = [torch.arange(4, dtype=torch.int64) + 100 * r for r in range(3)]
    g = FakeGroup(3, 2, [[(t[2:],) for t in per_rank]])
    s = torch.arange(12, dtype=torch.int32) * 10
    (out,), s_out = gather_prefill_cache_inputs([per_rank[2]], s, 2, False, group=g)
    g.done()
    assert_same(s_out, torch.tensor([0, 10, 20, 30, 60, 70, 100, 110], dtype=torch.int32))
    assert_same(out, torch.tensor([200, 201, 2, 3, 102, 103, 202, 203]))


# ---------------------------------------------------------------------------------------------
# zero local rows


def test_zero_rows_every_branch():
    empty = (torch.empty(0, 2, dtype=BF16), torch.empty(0, 3, dtype=E4M3))
    out, s_out = gather_prefill_cache_inputs(empty, slots([]), 0, False, group=NoCollectiveGroup())
    assert [tuple(t.shape) for t in out] == [(0, 2), (0, 3)] and s_out.numel() == 0
    # Expanded-looking map with L = 0: shard -> B gathers empty tensors.
    g = FakeGroup(2, 0, [[empty, empty]])
    out, s_out = gather_prefill_cache_inputs(empty, slots([-1, -1]), 0, True, group=g)
    g.done()
    assert [tuple(t.shape) for t in out] == [(0, 2), (0, 3)] and s_out.numel() == 0
    # not shard, nd == L == 0: branch C (listed before D), no collective.
    out, s_out = gather_prefill_cache_inputs(empty, slots([-1, -1]), 0, False, group=NoCollectiveGroup())
    assert [tuple(t.shape) for t in out] == [(0, 2), (0, 3)] and s_out.numel() == 0


# ---------------------------------------------------------------------------------------------
# one all_gather per call, whatever the number of tensors; bit-identical to one per tensor

DTYPES = [torch.bool, torch.uint8, I8, torch.int16, torch.int32, torch.int64, torch.float16, BF16,
          torch.float32, torch.float64, E4M3, E5M2, torch.complex64]
TRAILING = [(), (1,), (3,), (1, 64), (2, 4), (0,), (2, 0, 3)]


def random_tensor(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    """Random bytes read as ``dtype`` (NaN payloads, infinities, subnormals); bools 0 or 1."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), generator=gen, dtype=torch.uint8).view(dtype).reshape(shape)


def run_world(runner, per_rank, slot_map, nd, shard):
    """Every rank calls the gather on its tensors over the thread runner's group (a real
    rank-major all_gather that records each call in the rank's trace)."""
    from pcpcheck.worker.rankctx import current_group

    outcomes = runner.run(len(per_rank), lambda rank: gather_prefill_cache_inputs(
        per_rank[rank], slot_map, nd, shard, group=current_group()))
    for rank, outcome in enumerate(outcomes):
        assert outcome.error is None, f"rank {rank}: {outcome.error}\n{outcome.error_detail}"
    return outcomes


def expected_rows(per_rank, rank, k, nd, branch):
    """Tensor k's rows on ``rank``, one tensor at a time (docs/semantics.md section 5): what one
    all_gather per tensor returns."""
    if branch == "C":
        return per_rank[rank][k]
    if branch == "E":
        return torch.cat([per_rank[rank][k][:nd], *(ts[k][nd:] for ts in per_rank)])
    return torch.cat([ts[k] for ts in per_rank])


@pytest.mark.parametrize("branch, nd, shard", [("B", 1, True), ("D", 0, False), ("E", 1, False)])
@pytest.mark.parametrize("specs", [
    [(BF16, (4,))],
    [(BF16, (512,)), (BF16, (64,))],  # MLA: kv_c_normed and k_pe flattened
    [(BF16, (8,)), (E4M3, (1, 4))],  # different widths and dtypes
    [(torch.float32, (2,)), (torch.bool, ()), (E5M2, (2, 3)), (torch.int64, (1,))],
], ids=["one", "mla", "two-dtypes", "four"])
def test_one_all_gather_per_call_whatever_the_number_of_tensors(runner, specs, branch, nd, shard):
    world_size, num_rows = 3, 3
    per_rank = [tuple(random_tensor(dtype, (num_rows, *trailing), 10 * rank + k)
                      for k, (dtype, trailing) in enumerate(specs)) for rank in range(world_size)]
    outcomes = run_world(runner, per_rank, slots(range(world_size * num_rows)), nd, shard)
    for rank, outcome in enumerate(outcomes):
        wire = packed(tuple(t[nd if branch == "E" else 0:] for t in per_rank[rank]))
        assert outcome.trace == [("all_gather", 0, tuple(wire.shape), str(wire.dtype))]
        for k, got in enumerate(outcome.value[0]):
            assert_same(got, expected_rows(per_rank, rank, k, nd, branch))


@given(data=st.data())
def test_packed_gather_is_bit_identical_to_one_all_gather_per_tensor(runner, data):
    world_size = data.draw(st.integers(2, 4), label="P")
    num_rows = data.draw(st.integers(0, 4), label="L")
    specs = data.draw(st.lists(st.tuples(st.sampled_from(DTYPES), st.sampled_from(TRAILING)),
                               min_size=1, max_size=4), label="tensors")
    nd = data.draw(st.integers(0, num_rows), label="nd")
    shard = data.draw(st.booleans(), label="shard")
    seed = data.draw(st.integers(0, 2**20), label="seed")
    branch = "B" if shard else "C" if nd == num_rows else "D" if nd == 0 else "E"
    per_rank = [tuple(random_tensor(dtype, (num_rows, *trailing), seed + 10 * rank + k)
                      for k, (dtype, trailing) in enumerate(specs)) for rank in range(world_size)]
    # S > L: P*L entries, or any length when L = 0 (no rows to pair).
    slot_map = slots(range(world_size * num_rows or world_size))
    outcomes = run_world(runner, per_rank, slot_map, nd, shard)
    for rank, outcome in enumerate(outcomes):
        assert len(outcome.trace) == (branch != "C")
        for k, got in enumerate(outcome.value[0]):
            assert_same(got, expected_rows(per_rank, rank, k, nd, branch))
            assert got.is_contiguous()


class ReplyGroup:
    """World size 2; all_gather returns ``reply`` whatever it is given."""

    def __init__(self, reply) -> None:
        self.world_size, self.reply = 2, reply

    def all_gather(self, t, dim=0):
        return self.reply


@pytest.mark.parametrize("tensors, reply, message", [
    ((torch.zeros(2, 2),), torch.zeros(3, 2),
     "returned ((3, 2), torch.float32), expected shape (4, 2) dtype torch.float32"),
    ((torch.zeros(2, 2),), torch.zeros(4, 2, dtype=BF16),
     "returned ((4, 2), torch.bfloat16), expected shape (4, 2) dtype torch.float32"),
    ((torch.zeros(2, 2), torch.zeros(2, 3)), torch.zeros(4, 2),  # answered per tensor
     "returned ((4, 2), torch.float32) for the rows of 2 tensors packed side by side, "
     "expected shape (4, 5) dtype torch.float32"),
    ((torch.zeros(2, 2), torch.zeros(2, dtype=I8)), torch.zeros(4, 2),
     "returned ((4, 2), torch.float32) for the rows of 2 tensors packed side by side as bytes, "
     "expected shape (4, 9) dtype torch.uint8"),
    ((torch.zeros(2, 2), torch.zeros(2, dtype=I8)), [torch.zeros(4, 2), torch.zeros(4, dtype=I8)],
     "returned list for the rows of 2 tensors packed side by side as bytes, expected shape (4, 9)"),
])
def test_group_reply_of_wrong_shape_or_dtype_is_named(tensors, reply, message):
    with pytest.raises(RuntimeError) as raised:
        gather_prefill_cache_inputs(tensors, slots(range(4)), 0, True, group=ReplyGroup(reply))
    assert message in str(raised.value)


# ---------------------------------------------------------------------------------------------
# MLA and indexer wrappers


def test_mla_zero_rows_works():
    kv = torch.empty(0, 8, dtype=BF16)
    k_pe = torch.empty(0, 1, 4, dtype=BF16)
    with pytest.raises(RuntimeError):  # vLLM's reshape(L, -1): bug class 9
        k_pe.reshape(0, -1)
    flat = torch.empty(0, 4, dtype=BF16)
    g = FakeGroup(2, 1, [[(kv, flat), (kv, flat)]])
    kv_out, k_pe_out, s_out = gather_mla_cache_inputs(kv, k_pe, slots([-1, -1]), 0, True, True, group=g)
    g.done()
    assert tuple(kv_out.shape) == (0, 8) and tuple(k_pe_out.shape) == (0, 1, 4)
    assert s_out.numel() == 0


def test_mla_restores_k_pe_shape_branch_e():
    kv = [torch.arange(6, dtype=torch.float32).reshape(3, 2) + 10 * r for r in range(2)]
    k_pe = [(torch.arange(12).reshape(3, 1, 4) + 16 * r).to(torch.uint8).view(E5M2) for r in range(2)]
    flat = [t.reshape(3, 4) for t in k_pe]
    g = FakeGroup(2, 0, [[(kv[0][1:], flat[0][1:]), (kv[1][1:], flat[1][1:])]])
    s = slots([1, 2, 3, -1, 5, 6])
    kv_out, k_pe_out, s_out = gather_mla_cache_inputs(kv[0], k_pe[0], s, 1, True, False, group=g)
    g.done()
    assert_same(s_out, slots([1, 2, 3, 5, 6]))
    assert_same(kv_out, torch.cat([kv[0], kv[1][1:]]))
    assert_same(k_pe_out, torch.cat([k_pe[0], k_pe[1][1:]]))
    assert tuple(k_pe_out.shape) == (5, 1, 4)


def test_mla_unchanged_when_nd_none_or_no_pcp():
    kv, k_pe, s = torch.ones(3, 2), torch.ones(3, 1, 2), slots([-1] * 6)
    for nd, use_pcp in ((None, True), (1, False)):
        out = gather_mla_cache_inputs(kv, k_pe, s, nd, use_pcp, True, group=NoCollectiveGroup())
        assert out[0] is kv and out[1] is k_pe and out[2] is s


def test_indexer_unchanged_when_no_pcp():
    k, s = torch.ones(5, 2), slots([-1] * 6)
    out = gather_indexer_cache_inputs(k, s, 1, False, True, group=NoCollectiveGroup())
    assert out[0] is k and out[1] is s


def test_indexer_truncates_to_s_over_p_when_s_exceeds_rows():
    # k carries 6 rows (graph padding beyond W), the expanded map has P*W = 8 entries: W = 4.
    k = [torch.arange(6, dtype=torch.int64) + 100 * r for r in range(2)]
    g = FakeGroup(2, 0, [[(k[0][:4],), (k[1][:4],)]])  # checks the local tensor was cut to 4 rows
    s = slots(list(range(8)))
    k_out, s_out = gather_indexer_cache_inputs(k[0], s, 0, True, True, group=g)
    g.done()
    assert_same(k_out, torch.tensor([0, 1, 2, 3, 100, 101, 102, 103]))
    assert_same(s_out, s)


def test_indexer_truncates_to_s_rows_otherwise():
    k = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    k_out, s_out = gather_indexer_cache_inputs(k, slots([3, 4, 5]), 2, True, False, group=NoCollectiveGroup())
    assert_same(k_out, k[:3])
    assert_same(s_out, slots([3, 4, 5]))


# ---------------------------------------------------------------------------------------------
# write_kv_cache


def test_write_kv_cache_kernel_rule():
    cache = torch.full((3, 4, 2), -7.0)  # 12 slots, sentinel -7 marks untouched
    rows = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    # row 0 -> slot 0 (real), row 1 skipped (-1), row 2 -> slot 5, row 3 skipped (-3),
    # row 4 -> slot 11; row 5 is beyond len(slot_mapping) and ignored.
    write_kv_cache(cache, rows, slots([0, -1, 5, -3, 11]))
    want = torch.full((3, 4, 2), -7.0)
    want[0, 0] = rows[0]
    want[1, 1] = rows[2]
    want[2, 3] = rows[4]
    assert_same(cache, want)


def test_write_kv_cache_fp8_bit_exact_all_bytes():
    for dtype in (E4M3, E5M2):
        cache = torch.zeros(16, 16, 1, dtype=torch.uint8).view(dtype)
        raw = torch.arange(256, dtype=torch.uint8)
        rows = raw.view(dtype).reshape(256, 1)
        perm = torch.randperm(256, generator=torch.Generator().manual_seed(0))
        write_kv_cache(cache, rows, perm)
        got = cache.view(torch.uint8).reshape(256)
        assert torch.equal(got[perm], raw)  # includes NaN and -0 encodings


def test_write_kv_cache_bf16_nan_payload_and_int8():
    cache = torch.zeros(1, 4, dtype=torch.int16).view(BF16).reshape(1, 4, 1)
    raw = torch.tensor([0x7FC1, -0x8000, 0x7F81, 0x0001], dtype=torch.int16)  # NaN payloads, -0
    write_kv_cache(cache, raw.view(BF16).reshape(4, 1), slots([3, 2, 1, 0]))
    assert torch.equal(cache.view(torch.int16).reshape(4), raw.flip(0))
    c8 = torch.zeros(2, 2, 3, dtype=I8)
    write_kv_cache(c8, torch.tensor([[-128, 127, 0]], dtype=I8), torch.tensor([2], dtype=torch.int32))
    want = torch.zeros(2, 2, 3, dtype=I8)
    want[1, 0] = torch.tensor([-128, 127, 0], dtype=I8)
    assert_same(c8, want)


@pytest.mark.parametrize(
    "cache, rows, s, exc, match",
    [
        (torch.zeros(2, 2, 3), torch.zeros(1, 3), slots([0, 1]), ValueError, "fewer rows than slots"),
        (torch.zeros(2, 2, 3), torch.zeros(2, 4), slots([0, 1]), ValueError, "trailing shape"),
        (torch.zeros(2, 2, 3), torch.zeros(2, 3, dtype=BF16), slots([0, 1]), ValueError, "dtype"),
        (torch.zeros(2, 2, 3), torch.zeros(2, 3), slots([0, 4]), ValueError, "out of range"),
        (torch.zeros(2, 2, 3), torch.zeros(2, 3), torch.tensor([0.0, 1.0]), TypeError, "integer"),
        (torch.zeros(4), torch.zeros(2), slots([0, 1]), ValueError, "num_blocks"),
    ],
)
def test_write_kv_cache_errors(cache, rows, s, exc, match):
    before = cache.clone()
    with pytest.raises(exc, match=match):
        write_kv_cache(cache, rows, s)
    assert_same(cache, before)


# ---------------------------------------------------------------------------------------------
# provider


def test_provider_missing_raises():
    with pytest.raises(RuntimeError, match="no PCP group registered"):
        get_pcp_group()
    with pytest.raises(RuntimeError, match="no PCP group registered"):
        gather_prefill_cache_inputs((torch.zeros(2),), slots([0, 1, 2, 3]), 0, True)


def test_provider_callable_per_thread():
    local = threading.local()
    calls = []

    def provider():
        calls.append(threading.get_ident())
        return local.group

    set_pcp_group(provider)
    results = {}

    def run(rank):
        per_rank = [torch.tensor([10 * r, 10 * r + 1], dtype=I8) for r in range(2)]
        local.group = FakeGroup(2, rank, [[(t[1:],) for t in per_rank]])
        (out,), s_out = gather_prefill_cache_inputs((per_rank[rank],), slots([0, 1, -1, 3]), 1, False)
        local.group.done()
        results[rank] = (out.tolist(), s_out.tolist(), get_pcp_group() is local.group)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {0: ([0, 1, 11], [0, 1, 3], True), 1: ([10, 1, 11], [0, 1, 3], True)}
    assert len(calls) == 4  # called on every lookup, not cached


def test_provider_plain_group_and_errors():
    g = FakeGroup(2, 0, [])
    set_pcp_group(g)
    assert get_pcp_group() is g
    set_pcp_group(lambda: None)
    with pytest.raises(RuntimeError, match="returned None"):
        get_pcp_group()
    with pytest.raises(TypeError, match="set_pcp_group"):
        set_pcp_group(42)
    with pytest.raises(TypeError, match="vLLM-style"):
        gather_prefill_cache_inputs((torch.zeros(2),), slots([0, 1, 2, 3]), 0, True, group=object())


# ---------------------------------------------------------------------------------------------
# real gloo processes: a plain ProcessGroup, wrapped by ProcessGroupAdapter


def _gloo_worker(rank: int, port: int, world_size: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=600),  # a guard: spawn_gloo finds a hang
    )
    try:
        pg = dist.group.WORLD
        assert isinstance(pg, dist.ProcessGroup)
        ts = rank_tensors(rank, 4)  # bf16, fp8 e4m3 (gloo cannot carry it), int8
        s = slots([10, 11, 12, 13, -1, 21, 22, 23])
        before = clone_all([*ts, s])
        # E with an explicit ProcessGroup (wrapped automatically).
        out, s_out = gather_prefill_cache_inputs(ts, s, 1, False, group=pg)
        assert_same(s_out, slots([10, 11, 12, 13, 21, 22, 23]))
        want = rows_of([(rank, 0), (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)])
        for got, w in zip(out, want):
            assert_same(got, w)
        assert_unmutated(before, [*ts, s])
        # B through the provider holding the ProcessGroup.
        set_pcp_group(pg)
        out, s_out = gather_prefill_cache_inputs(ts, s, 4, True)
        assert_same(s_out, s)
        want = rows_of([(q, j) for q in range(2) for j in range(4)])
        for got, w in zip(out, want):
            assert_same(got, w)
        # Zero local rows through the MLA wrapper and real gloo (bug class 9).
        kv_out, k_pe_out, s_out = gather_mla_cache_inputs(
            torch.empty(0, 8, dtype=BF16), torch.empty(0, 1, 4, dtype=E4M3), slots([-1, -1]), 0, True, True
        )
        assert [tuple(kv_out.shape), tuple(k_pe_out.shape), tuple(s_out.shape)] == [(0, 8), (0, 1, 4), (0,)]
        # The adapter itself: bool, int16, fp8 e5m2 travel as bytes; dim=1; non-contiguous input.
        ad = ProcessGroupAdapter(pg)
        assert (ad.world_size, ad.rank_in_group) == (world_size, rank)
        for dtype in (torch.bool, torch.int16, E5M2):
            x = (torch.arange(6).reshape(2, 3) + rank).to(torch.uint8).to(dtype)
            y = ad.all_gather(x.t(), dim=1)
            assert_same(y, torch.cat([(torch.arange(6).reshape(2, 3) + q).to(torch.uint8).to(dtype).t()
                                      for q in range(world_size)], dim=1))
    finally:
        set_pcp_group(None)
        dist.destroy_process_group()


def test_gloo_two_processes_process_group_adapter(spawn_gloo):
    spawn_gloo(_gloo_worker, 2, 2)


