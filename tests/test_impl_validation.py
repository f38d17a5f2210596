"""Bad input to impl/'s gather gets a clear TypeError/ValueError naming the problem (issue 5).

- ``CASES``: one malformed input class each, with the exception type and a message fragment; the
  same list generates the table of docs/errors.md, and a test checks the doc against the real
  messages (regenerate with ``python tests/test_impl_validation.py``).
- The cross-rank ``num_decode_tokens`` agreement check (debug flag), with real threads.
- Zero local rows in every reachable branch and through both wrappers.
- A hypothesis test feeding random, mostly malformed inputs: either a clear TypeError/ValueError
  raised by impl/ itself, or a result an independent oracle accepts; never anything else, never a
  hang.
"""

from __future__ import annotations

import linecache
import os
import pathlib
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

import pcpcheck_impl as impl
import pcpcheck_impl.gather as impl_gather
import pcpcheck_reference as reference
from pcpcheck_impl import (
    check_expanded_index_fits,
    gather_indexer_cache_inputs,
    gather_mla_cache_inputs,
    gather_prefill_cache_inputs,
    set_pcp_group,
)

IMPL_DIR = pathlib.Path(impl.__file__).resolve().parent
DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "errors.md"
TABLE_START, TABLE_END = "<!-- errors-table:start -->", "<!-- errors-table:end -->"
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def slots(values, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()]) if t.dtype != _BITS[t.element_size()] else t


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    return a.device.type == "meta" or torch.equal(bits(a), bits(b))  # meta: no values to compare


# ---------------------------------------------------------------------------------------------
# groups


class NoCollectiveGroup:
    """Any collective fails the test."""

    def __init__(self, world_size: Any = 2, rank: int = 0) -> None:
        self.world_size = world_size
        self.rank_in_group = rank

    def all_gather(self, t, dim=0):  # pragma: no cover - reaching it is the failure
        raise AssertionError(f"all_gather called (shape {tuple(t.shape)}) where none is expected")


class CopiesGroup:
    """World size P; all_gather returns P copies of the local tensor, concatenated (every rank
    identical). Records the shape of each call."""

    def __init__(self, world_size: int, rank: int = 0) -> None:
        self.world_size = world_size
        self.rank_in_group = rank
        self.calls: list[tuple[int, ...]] = []

    def all_gather(self, t, dim=0):
        self.calls.append(tuple(t.shape))
        return torch.cat([t] * self.world_size, dim=dim)


class ThreadWorld:
    """P ranks as threads; all_gather meets at a barrier (a real hang shows as a barrier timeout)."""

    def __init__(self, world_size: int, timeout: float = 5.0) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.slots: list[Any] = [None] * world_size

    def group(self, rank: int) -> ThreadGroup:
        return ThreadGroup(self, rank)

    def run(self, fn: Callable[[int, ThreadGroup], Any]) -> list[tuple[Any, BaseException | None]]:
        results: list[Any] = [(None, None)] * self.world_size

        def target(rank: int) -> None:
            try:
                results[rank] = (fn(rank, self.group(rank)), None)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                results[rank] = (None, exc)

        threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "a rank thread hung"
        return results


class ThreadGroup:
    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self.world = world
        self.world_size = world.world_size
        self.rank_in_group = rank

    def all_gather(self, t, dim=0):
        w = self.world
        w.barrier.wait()
        w.slots[self.rank_in_group] = t.clone()
        w.barrier.wait()
        out = torch.cat(w.slots, dim=dim)  # unequal shapes across ranks: torch error, as in NCCL
        w.barrier.wait()
        return out


@pytest.fixture(autouse=True)
def _no_registered_group():
    set_pcp_group(None)
    yield
    set_pcp_group(None)


def raise_site(exc: BaseException) -> tuple[pathlib.Path, str]:
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    return pathlib.Path(filename).resolve(), linecache.getline(filename, tb.tb_lineno).strip()


def assert_raised_by_impl(exc: BaseException) -> None:
    """The exception comes from a ``raise`` statement in impl/, not from inside torch."""
    path, line = raise_site(exc)
    assert path.parent == IMPL_DIR and line.startswith("raise "), (path, line, exc)
    assert str(exc).strip(), "empty message"


# ---------------------------------------------------------------------------------------------
# the malformed input classes: one case each, also the source of docs/errors.md


@dataclass(frozen=True)
class Case:
    key: str
    what: str  # the malformed input class, as the doc's first column says it
    call: Callable[[], Any]
    exc: type
    fragment: str  # a regex that must be found in the message


_T3 = (torch.zeros(3, 2),)


def _g(world_size: Any = 2) -> NoCollectiveGroup:
    return NoCollectiveGroup(world_size)


def _gather(tensors, s, nd, shard=False, group=None):
    return lambda: gather_prefill_cache_inputs(tensors, s, nd, shard, group=_g() if group is None else group)


def _disagreeing_nd():
    """P = 2 threads, replicated, L = 4, S = 8: rank 0 says nd = 4 (branch C, no collective),
    rank 1 says nd = 1 (branch E). Without the check, rank 1 waits forever in all_gather."""
    world = ThreadWorld(2)
    nds = [4, 1]
    results = world.run(lambda rank, group: gather_prefill_cache_inputs(
        (torch.zeros(4, 2),), slots(list(range(8))), nds[rank], False, group=group,
        check_nd_agreement=True))
    errors = [exc for _, exc in results]
    assert all(isinstance(e, ValueError) for e in errors), errors
    assert str(errors[0]) == str(errors[1])
    raise errors[0]


def _nested():
    return torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(1, 3)], layout=torch.jagged)


def _meta_overflow():
    # int32 slot map, L = 2**30 rows, P = 2: P*L = 2**31 > 2**31 - 1. Meta tensors: no memory.
    rows = torch.empty(2**30, 8, device="meta")
    s = torch.empty(2**31, dtype=torch.int32, device="meta")
    return gather_prefill_cache_inputs((rows,), s, 0, True, group=_g())


CASES = [
    Case("not-a-sequence", "`tensors` not a tuple/list", _gather(torch.zeros(3, 2), slots([0]), 0),
         TypeError, r"tensors must be a tuple or list of tensors, got 2-d torch.Tensor"),
    Case("empty", "`tensors` empty", _gather((), slots([0]), 0), ValueError, "at least one tensor"),
    Case("non-tensor", "an element of `tensors` not a tensor",
         _gather((torch.zeros(3), [1, 2, 3]), slots([0]), 0), TypeError,
         r"tensors\[1\] must be a torch.Tensor, got list"),
    Case("0-d", "a 0-d tensor", _gather((torch.zeros(3), torch.tensor(1.0)), slots([0]), 0),
         ValueError, r"tensors\[1\] is 0-dimensional"),
    Case("rows-differ", "tensors with different row counts",
         _gather((torch.zeros(3), torch.zeros(2, 4)), slots([0]), 0), ValueError,
         r"row counts differ: tensors\[0\] has 3 rows, tensors\[1\] has 2"),
    Case("mla-rows-differ", "MLA: `kv_c_normed` and `k_pe` row counts differ",
         lambda: gather_mla_cache_inputs(torch.zeros(3, 4), torch.zeros(2, 1, 2), slots([0]), 0,
                                         True, group=_g()),
         ValueError, "kv_c_normed has 3 rows, k_pe has 2"),
    Case("mla-k_pe", "MLA: `k_pe` not a tensor",
         lambda: gather_mla_cache_inputs(torch.zeros(3, 4), None, slots([0]), 0, True, group=_g()),
         TypeError, "k_pe must be a torch.Tensor, got NoneType"),
    Case("indexer-k", "indexer: `k` 0-d",
         lambda: gather_indexer_cache_inputs(torch.tensor(2.0), slots([0]), 0, True, group=_g()),
         ValueError, "k is 0-dimensional"),
    Case("sparse", "a sparse tensor (any non-strided layout)",
         _gather((torch.zeros(3, 2).to_sparse(),), slots([0]), 0), TypeError,
         r"tensors\[0\] has the layout torch.sparse_coo: expected a dense \(torch.strided\) tensor"),
    Case("nested", "a nested tensor",
         _gather((_nested(),), slots([0]), 0), TypeError, r"tensors\[0\] is a nested tensor"),
    Case("slot-sparse", "`slot_mapping` sparse",
         _gather(_T3, slots([0, -1]).to_sparse(), 0), TypeError,
         "slot_mapping has the layout torch.sparse_coo"),
    Case("shard-str", "`shard_decode_requests` a string (\"False\" would read as True)",
         _gather(_T3, slots(list(range(6))), 0, "False"), TypeError,
         "shard_decode_requests must be a bool .True or False., got str 'False'$"),
    Case("shard-int", "`shard_decode_requests` an int",
         _gather(_T3, slots([0]), 0, 2), TypeError,
         "shard_decode_requests must be a bool .True or False., got int 2$"),
    Case("shard-group", "a group passed positionally as `shard_decode_requests`",
         lambda: gather_prefill_cache_inputs(_T3, slots(list(range(6))), 0, _g()), TypeError,
         "shard_decode_requests must be a bool .True or False., got NoCollectiveGroup$"),
    Case("shard-numpy", "`shard_decode_requests` a numpy bool",
         _gather(_T3, slots([0]), 0, np.bool_(False)), TypeError,
         r"got numpy.bool_? np.False_: pass bool\(x\)"),
    Case("shard-tensor", "`shard_decode_requests` a bool tensor",
         _gather(_T3, slots([0]), 0, torch.tensor(True)), TypeError,
         r"got 0-d torch.Tensor of torch.bool: pass bool\(x\)"),
    Case("use_pcp-int", "wrappers: `use_pcp` not a bool",
         lambda: gather_indexer_cache_inputs(torch.zeros(3, 2), slots([0]), 0, 1), TypeError,
         "use_pcp must be a bool .True or False., got int 1"),
    Case("pcp-shard-str", "wrappers: `pcp_shard_decode_requests` not a bool",
         lambda: gather_mla_cache_inputs(torch.zeros(3, 4), torch.zeros(3, 1, 2), slots([0]), 0, True,
                                         "no"),
         TypeError, "pcp_shard_decode_requests must be a bool .True or False., got str 'no'"),
    Case("shard-twice", "wrappers: the shard flag given under both names",
         lambda: gather_mla_cache_inputs(torch.zeros(3, 4), torch.zeros(3, 1, 2), slots([0]), 0, True,
                                         pcp_shard_decode_requests=True, shard_decode_requests=True),
         TypeError, "the shard flag was given twice"),
    Case("nd-negative", "`num_decode_tokens` negative", _gather(_T3, slots([0]), -1), ValueError,
         r"num_decode_tokens=-1 is negative: expected 0 <= num_decode_tokens <= L=3"),
    Case("nd-above", "`num_decode_tokens` above the row count L", _gather(_T3, slots([0]), 5),
         ValueError, "num_decode_tokens=5 is above the local row count L=3"),
    Case("nd-bool", "`num_decode_tokens` a bool", _gather(_T3, slots([0]), True), TypeError,
         "num_decode_tokens must be an int, got bool True"),
    Case("nd-float", "`num_decode_tokens` a float", _gather(_T3, slots([0]), 1.0), TypeError,
         "num_decode_tokens must be an int, got float 1.0"),
    Case("nd-none", "`num_decode_tokens` None (gather; the MLA wrapper returns inputs unchanged)",
         _gather(_T3, slots([0]), None), TypeError, "num_decode_tokens must be an int, got NoneType"),
    Case("nd-tensor", "`num_decode_tokens` a tensor (even 0-d integer)",
         _gather(_T3, slots([0]), torch.tensor(1)), TypeError,
         r"num_decode_tokens must be a Python int .* got a 0-d torch.Tensor of torch.int64: pass int\(t\)"),
    Case("slot-not-tensor", "`slot_mapping` not a tensor", _gather(_T3, [0, 1], 0), TypeError,
         "slot_mapping must be a torch.Tensor, got list"),
    Case("slot-2d", "`slot_mapping` not 1-D", _gather(_T3, slots([[0, 1]]), 0), ValueError,
         r"slot_mapping must be 1-D .* got shape \(1, 2\)"),
    Case("slot-float", "`slot_mapping` floating point", _gather(_T3, torch.tensor([0.0, 1.0]), 0),
         TypeError, "slot_mapping must have an integer dtype .* got torch.float32"),
    Case("slot-bool", "`slot_mapping` bool", _gather(_T3, torch.tensor([True]), 0), TypeError,
         "slot_mapping must have an integer dtype .* got torch.bool"),
    Case("slot-unsigned", "`slot_mapping` unsigned (cannot hold -1)",
         _gather(_T3, slots([0, 1], torch.uint8), 0), TypeError,
         "unsigned dtype torch.uint8, which cannot hold PAD_SLOT_ID=-1"),
    Case("slot-between", "`L < S < P*L` (rows and slots would not pair)",
         _gather(_T3, slots(list(range(4))), 0), ValueError,
         r"slot_mapping has 4 entries, between the local row count L=3 and P\*L=2\*3=6"),
    Case("slot-longer", "`S > P*L`, L > 0 (rows and slots would not pair)",
         _gather(_T3, slots(list(range(8))), 0, True), ValueError,
         r"slot_mapping has 8 entries, more than P\*L=2\*3=6"),
    Case("slot-overflow", "`P*L` overflows the slot dtype (int32 map, P*L > 2**31-1)",
         _meta_overflow, ValueError,
         r"P\*L = 2\*1073741824 = 2147483648 overflows slot_mapping's dtype torch.int32"),
    Case("slot-overflow-int8", "`P*L` overflows the slot dtype (int8 map)",
         _gather((torch.zeros(100),), slots([-1] * 200, torch.int8), 0, True), ValueError,
         r"P\*L = 2\*100 = 200 overflows slot_mapping's dtype torch.int8 \(max 127\)"),
    Case("device-tensors", "tensors on different devices",
         _gather((torch.zeros(3), torch.zeros(3, device="meta")), slots([0]), 0), ValueError,
         r"devices differ: tensors\[0\] is on cpu, tensors\[1\] is on meta"),
    Case("device-slots", "`slot_mapping` on another device than the tensors",
         _gather(_T3, torch.zeros(1, dtype=torch.int64, device="meta"), 0), ValueError,
         "devices differ: tensors.0. is on cpu, slot_mapping is on meta"),
    Case("world-size", "the group's `world_size` not a positive int",
         _gather(_T3, slots(list(range(6))), 0, True, group=NoCollectiveGroup(0)), ValueError,
         "world_size must be a positive int, got 0"),
    Case("group-kind", "`group` not a group",
         _gather(_T3, slots(list(range(6))), 0, True, group=object()), TypeError,
         "a PCP group must be a torch.distributed.ProcessGroup or a vLLM-style group"),
    Case("nd-disagree", "ranks disagree on `num_decode_tokens` (flag on; P=2 threads)",
         _disagreeing_nd, ValueError,
         r"PCP ranks disagree .* rank 0: num_decode_tokens=4, L=4, S=8, shard_decode_requests=False; "
         r"rank 1: num_decode_tokens=1,"),
]


def run_case(case: Case) -> BaseException:
    try:
        case.call()
    except BaseException as exc:  # noqa: BLE001 - the case's exception is what it checks
        return exc
    raise AssertionError(f"{case.key}: no exception")


@pytest.mark.parametrize("case", CASES, ids=[c.key for c in CASES])
def test_malformed_input_class(case: Case):
    exc = run_case(case)
    assert type(exc) is case.exc, (type(exc), exc)
    assert re.search(case.fragment, str(exc)), str(exc)
    assert_raised_by_impl(exc)


def test_validation_accepts_list_numpy_int_and_signed_small_dtypes():
    out, s_out = gather_prefill_cache_inputs(
        [torch.ones(3)], torch.tensor([1, 2], dtype=torch.int32), np.int64(2), group=_g()
    )
    assert isinstance(out, tuple) and out[0].shape == (2,) and s_out.dtype == torch.int32
    # int8/int16 hold -1: accepted while P*L fits.
    g = CopiesGroup(2)
    (out,), s_out = gather_prefill_cache_inputs((torch.ones(3),), slots([0, 1, 2, 3, 4, -1], torch.int8),
                                                0, True, group=g)
    assert out.shape == (6,) and s_out.dtype == torch.int8


def test_check_expanded_index_fits_sizes():
    check_expanded_index_fits(2**30 - 1, 2, torch.int32)
    check_expanded_index_fits(2**31 - 1, 1, torch.int32)
    with pytest.raises(ValueError, match="overflows"):
        check_expanded_index_fits(2**30, 2, torch.int32)
    with pytest.raises(ValueError, match="overflows"):
        check_expanded_index_fits(8192, 4, torch.int16)
    check_expanded_index_fits(2**40, 8, torch.int64)
    with pytest.raises(ValueError, match="overflows"):
        check_expanded_index_fits(2**62, 2, torch.int64)


def test_unexpanded_map_needs_no_overflow_check():
    # S <= L is branch A: no expansion, an int8 map over many rows is fine.
    (out,), s_out = gather_prefill_cache_inputs((torch.zeros(300),), slots([1, 2], torch.int8), 0)
    assert out.shape == (2,)


def test_errors_table_matches_real_messages():
    """docs/errors.md's table is exactly what the code raises today."""
    doc = DOC.read_text()
    assert TABLE_START in doc and TABLE_END in doc
    current = doc.split(TABLE_START)[1].split(TABLE_END)[0].strip()
    assert current == render_table().strip(), (
        "docs/errors.md is stale: run `python tests/test_impl_validation.py` to regenerate"
    )


def render_table() -> str:
    lines = ["| malformed input | exception | message |", "|---|---|---|"]
    for case in CASES:
        exc = run_case(case)
        message = str(exc).replace("|", "\\|")
        lines.append(f"| {case.what} | {type(exc).__name__} | {message} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# cross-rank num_decode_tokens agreement (debug flag)


def test_agreement_off_by_default_no_extra_collective():
    assert impl_gather.CHECK_ND_AGREEMENT is False
    # Branch C needs no collective: with the check off none is made.
    gather_prefill_cache_inputs((torch.zeros(2),), slots([1, 2, -1, -1]), 2, False, group=_g())


@pytest.mark.parametrize("nd, shard, branch_calls", [
    (2, False, 0), (0, False, 1), (1, False, 1), (1, True, 1)])  # C, D, E, B
def test_agreement_on_agreeing_ranks_same_result_one_extra_call(nd, shard, branch_calls):
    t, s = torch.arange(4).reshape(2, 2), slots([5, 6, 7, 8])
    plain = CopiesGroup(2)
    want = gather_prefill_cache_inputs((t,), s, nd, shard, group=plain)
    checked = CopiesGroup(2)
    got = gather_prefill_cache_inputs((t,), s, nd, shard, group=checked, check_nd_agreement=True)
    assert same(got[0][0], want[0][0]) and same(got[1], want[1])
    assert checked.calls[0] == (4,) and len(checked.calls) == 1 + branch_calls == 1 + len(plain.calls)


def test_agreement_module_flag_and_keyword_override(monkeypatch):
    monkeypatch.setattr(impl_gather, "CHECK_ND_AGREEMENT", True)
    g = CopiesGroup(2)
    gather_prefill_cache_inputs((torch.zeros(2),), slots([1, 2, -1, -1]), 2, False, group=g)
    assert g.calls == [(4,)]
    gather_prefill_cache_inputs((torch.zeros(2),), slots([1, 2, -1, -1]), 2, False, group=_g(),
                                check_nd_agreement=False)
    # Wrappers pass the keyword through (and honour the module flag).
    g = CopiesGroup(2)
    gather_mla_cache_inputs(torch.zeros(2, 3), torch.zeros(2, 1, 2), slots([1, 2, -1, -1]), 2, True,
                            group=g)
    assert g.calls == [(4,)]
    g = CopiesGroup(2)
    gather_indexer_cache_inputs(torch.zeros(2, 3), slots([1, 2, -1, -1]), 2, True, group=g,
                                check_nd_agreement=True)
    assert g.calls == [(4,)]


def test_disagreeing_nd_without_check_hangs_with_check_raises_on_every_rank():
    s = slots(list(range(8)))
    nds = [4, 1]  # rank 0: branch C (no collective); rank 1: branch E (all_gather)

    def call(check):
        def fn(rank, group):
            return gather_prefill_cache_inputs((torch.zeros(4, 2),), s, nds[rank], False,
                                               group=group, check_nd_agreement=check)
        return fn

    # Without the check: rank 0 returns, rank 1 waits for a peer that never comes (barrier times
    # out here; a real NCCL run hangs).
    results = ThreadWorld(2, timeout=0.5).run(call(False))
    assert results[0][1] is None and isinstance(results[1][1], threading.BrokenBarrierError)
    # With the check: every rank raises the same ValueError naming each rank's nd.
    results = ThreadWorld(2).run(call(True))
    for _, exc in results:
        assert isinstance(exc, ValueError)
        assert "rank 0: num_decode_tokens=4" in str(exc) and "rank 1: num_decode_tokens=1" in str(exc)


@pytest.mark.parametrize("nds", [[1, 2], [2, 1, 1]])
def test_disagreeing_nd_mixed_branch(nds):
    # Both ranks in E with different nd: the prefill all_gather would get unequal shapes.
    p, s = len(nds), slots(list(range(4 * len(nds))))
    results = ThreadWorld(p).run(lambda rank, group: gather_prefill_cache_inputs(
        (torch.zeros(4),), s, nds[rank], False, group=group, check_nd_agreement=True))
    for _, exc in results:
        assert isinstance(exc, ValueError) and "PCP ranks disagree" in str(exc)
        for q, nd in enumerate(nds):
            assert f"rank {q}: num_decode_tokens={nd}," in str(exc)


def test_sharded_branch_nd_may_differ_but_rows_and_shard_must_agree():
    s = slots(list(range(4)))
    ok = ThreadWorld(2).run(lambda rank, group: gather_prefill_cache_inputs(
        (torch.full((2,), float(rank)),), s, rank, True, group=group, check_nd_agreement=True))
    assert all(exc is None for _, exc in ok)
    assert ok[0][0][0][0].tolist() == [0.0, 0.0, 1.0, 1.0]
    shards = [True, False]
    bad = ThreadWorld(2).run(lambda rank, group: gather_prefill_cache_inputs(
        (torch.zeros(2),), s, 0, shards[rank], group=group, check_nd_agreement=True))
    for _, exc in bad:
        assert isinstance(exc, ValueError) and "shard_decode_requests=True; rank 1" in str(exc)


def _gloo_agreement_worker(rank: int, port: int) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=600))  # a guard: spawn_gloo finds a hang
    try:
        pg = dist.group.WORLD  # a plain ProcessGroup: wrapped by ProcessGroupAdapter
        s = slots(list(range(8)))
        # Agreeing ranks (E, nd = 1): the check passes, the gather runs.
        out, s_out = gather_prefill_cache_inputs((torch.full((4,), float(rank)),), s, 1, False,
                                                 group=pg, check_nd_agreement=True)
        assert s_out.tolist() == [0, 1, 2, 3, 5, 6, 7] and out[0].shape == (7,)
        # Disagreeing ranks (C on rank 0, E on rank 1): both raise instead of hanging.
        try:
            gather_prefill_cache_inputs((torch.zeros(4),), s, [4, 1][rank], False, group=pg,
                                        check_nd_agreement=True)
        except ValueError as exc:
            assert "rank 0: num_decode_tokens=4" in str(exc) and "rank 1: num_decode_tokens=1" in str(exc)
        else:
            raise AssertionError("no ValueError on disagreeing nd")
    finally:
        dist.destroy_process_group()


def test_agreement_check_two_gloo_processes(spawn_gloo):
    spawn_gloo(_gloo_agreement_worker, 2)


# ---------------------------------------------------------------------------------------------
# zero local rows (L = 0): valid in every reachable branch and through both wrappers.
# With L = 0 the branch order reaches A (S = 0), B (shard) and C (nd == L == 0); D and E need L > 0.


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("num_slots, shard, branch", [(0, False, "A"), (0, True, "A"), (2, True, "B"),
                                                      (2, False, "C"), (6, False, "C")])
def test_zero_rows_every_reachable_branch(num_slots, shard, branch, check):
    assert impl.select_branch(0, num_slots, 0, shard) == branch
    s = slots([-1] * num_slots)
    empty = (torch.empty(0, 2, dtype=torch.bfloat16), torch.empty(0, 3, dtype=torch.float8_e4m3fn))
    g = CopiesGroup(2)
    out, s_out = gather_prefill_cache_inputs(empty, s, 0, shard, group=g, check_nd_agreement=check)
    assert [(tuple(t.shape), t.dtype) for t in out] == [((0, 2), torch.bfloat16), ((0, 3), torch.float8_e4m3fn)]
    assert s_out.numel() == 0 and s_out.dtype == torch.int64
    kv, k_pe, s_mla = gather_mla_cache_inputs(empty[0], torch.empty(0, 1, 4), s, 0, True, shard, group=g,
                                              check_nd_agreement=check)
    assert tuple(kv.shape) == (0, 2) and tuple(k_pe.shape) == (0, 1, 4) and s_mla.numel() == 0
    k, s_idx = gather_indexer_cache_inputs(torch.empty(0, 5), s, 0, True, shard, group=g,
                                           check_nd_agreement=check)
    assert tuple(k.shape) == (0, 5) and s_idx.numel() == 0


def test_zero_rows_nd_above_zero_is_an_error():
    with pytest.raises(ValueError, match="num_decode_tokens=1 is above the local row count L=0"):
        gather_prefill_cache_inputs((torch.empty(0, 2),), slots([-1, -1]), 1, False, group=_g())


# ---------------------------------------------------------------------------------------------
# random malformed input: a clear error or an accepted result, nothing else


_TENSOR_DTYPES = [torch.float32, torch.bfloat16, torch.int8, torch.int64, torch.bool, torch.float8_e4m3fn]
_COMPONENTS = ["tensors", "container", "S", "slot kind", "slot dtype", "nd", "shard"]
_SLOT_DTYPES = [torch.int64, torch.int64, torch.int64, torch.int32, torch.int32, torch.int16,
                torch.int8, torch.uint8, torch.uint32, torch.float32, torch.bool]


@st.composite
def malformed_inputs(draw):
    # "valid": well-formed input only (so that results, not just errors, get checked);
    # "one": one component drawn from valid and invalid choices, the others well formed;
    # "mixed": every component drawn from valid and invalid choices.
    mode = draw(st.sampled_from(["valid", "valid", "one", "one", "mixed"]), label="mode")
    free = draw(st.sampled_from(_COMPONENTS), label="free component") if mode == "one" else None
    valid = mode == "valid"
    event(f"mode={mode}" + (f" ({free})" if free else ""))

    def loose(component):
        return mode == "mixed" or component == free

    def pick(choices, good, component, label):
        return draw(st.sampled_from(choices if loose(component) else good), label=label)

    world_size = draw(st.integers(2, 4), label="P")
    num_rows = draw(st.integers(0, 5), label="L")
    n = draw(st.integers(0 if loose("tensors") else 1, 3), label="number of tensors")
    tensors = []
    for k in range(n):
        kind = pick(["ok"] * 8 + ["rows", "0-d", "list", "meta"], ["ok"], "tensors", f"tensor {k} kind")
        dtype = draw(st.sampled_from(_TENSOR_DTYPES), label=f"tensor {k} dtype")
        trailing = tuple(draw(st.lists(st.integers(0, 3), max_size=2), label=f"tensor {k} trailing"))
        rows = draw(st.integers(0, 6), label=f"tensor {k} rows") if kind == "rows" else num_rows
        numel = rows * int(np.prod(trailing, dtype=np.int64))
        t = (torch.arange(numel) % 7).to(torch.uint8).reshape(rows, *trailing)
        t = t.view(dtype) if dtype.itemsize == 1 and dtype != torch.bool else t.to(dtype)
        if kind == "0-d":
            t = torch.tensor(3, dtype=dtype)
        elif kind == "list":
            t = t.tolist()
        elif kind == "meta":
            t = torch.empty(rows, *trailing, dtype=dtype, device="meta")
        tensors.append(t)
        event(f"tensor kind={kind}")
    container = pick(["tuple", "tuple", "list", "bare"], ["tuple", "list"], "container", "container")
    if container == "bare":
        tensors = tensors[0] if tensors else torch.zeros(2)
    elif container == "tuple":
        tensors = tuple(tensors)

    total = world_size * num_rows
    # well-formed: an expanded map (branches B-E) twice as often as an unexpanded one (A)
    length_kind = pick(["<=L", "between", "P*L", ">P*L", "any"], ["<=L", "P*L", "P*L"], "S", "S class")
    length = {
        "<=L": lambda: draw(st.integers(0, num_rows)),
        "between": lambda: draw(st.integers(num_rows + 1, max(num_rows + 1, total - 1))),
        "P*L": lambda: total,
        ">P*L": lambda: draw(st.integers(total + 1, total + 3)),
        "any": lambda: draw(st.integers(0, total + 3)),
    }[length_kind]()
    values = draw(st.lists(st.integers(-1, 60), min_size=length, max_size=length), label="slots")
    slot_kind = pick(["1-D"] * 6 + ["2-D", "list", "meta"], ["1-D"], "slot kind", "slot kind")
    slot_dtype = pick(_SLOT_DTYPES, [torch.int64, torch.int32], "slot dtype", "slot dtype")
    s = torch.tensor(values, dtype=torch.int64).to(slot_dtype)
    if slot_kind == "2-D":
        s = s.reshape(1, -1)
    elif slot_kind == "list":
        s = values
    elif slot_kind == "meta":
        s = torch.empty(length, dtype=slot_dtype, device="meta")

    nd_kind = pick(["int"] * 6 + ["numpy", "bool", "float", "none", "tensor"], ["int", "numpy"],
                   "nd", "nd kind")
    entry = draw(st.sampled_from(["gather", "gather", "mla", "indexer"]), label="entry")
    # The indexer cuts k to S rows when S <= L: a well-formed nd is then at most S.
    nd_max = min(num_rows, length) if entry == "indexer" and length <= num_rows else num_rows
    nd_value = draw(st.integers(-2, num_rows + 2) if loose("nd") else st.integers(0, nd_max), label="nd")
    nd = {"int": nd_value, "numpy": np.int32(nd_value), "bool": bool(nd_value % 2),
          "float": float(nd_value), "none": None, "tensor": torch.tensor(nd_value)}[nd_kind]
    shard_kind = pick(["bool"] * 6 + ["str", "int", "numpy", "none"], ["bool"], "shard", "shard kind")
    shard_value = draw(st.booleans(), label="shard")
    shard = {"bool": shard_value, "str": str(shard_value), "int": int(shard_value) + 1,
             "numpy": np.bool_(shard_value), "none": None}[shard_kind]
    event(f"shard kind={shard_kind}")
    check = draw(st.booleans(), label="check_nd_agreement")
    event(f"S class={length_kind}")
    event(f"slot kind={slot_kind} dtype={slot_dtype}")
    event(f"nd kind={nd_kind}")
    event(f"entry={entry}")
    return valid, world_size, tensors, s, nd, shard, entry, check


def call_with_timeout(fn, timeout=10.0):
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the call did not return within {timeout} s"
    return box.get("value"), box.get("error")


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's bits as numpy (bf16, fp8 and bool have no or no exact numpy dtype); a meta
    tensor has no values: zeros of its shape stand in (only shapes are then compared)."""
    if t.device.type == "meta":
        return np.zeros(tuple(t.shape), dtype=np.int64)
    return bits(t).numpy()


def _slot_values(s: torch.Tensor) -> np.ndarray:
    """The slot map's integer values: its bits would turn an int8 PAD_SLOT_ID -1 into 255."""
    if s.device.type == "meta":
        return np.zeros(tuple(s.shape), dtype=np.int64)
    return s.numpy()


def oracle(inputs, outputs, slots_in, slots_out, world_size, nd, shard):
    """An accepted result equals the numpy reference's (reference.gather) in every branch.

    The fake group gives every rank this rank's inputs, so the reference runs P identical ranks
    and rank 0's answer is the expected one: rows bit for bit, slots exactly, dtypes (the slot
    dtype is the input map's, a signed one that holds PAD_SLOT_ID -1) and trailing shapes kept.
    """
    assert isinstance(slots_out, torch.Tensor) and slots_out.dim() == 1
    assert slots_out.dtype == slots_in.dtype and torch.iinfo(slots_out.dtype).min < 0  # holds -1
    assert len({t.device for t in [*outputs, slots_out]}) == 1, "outputs on different devices"
    assert len(outputs) == len(inputs)
    rank_in = (tuple(_as_numpy(t) for t in inputs), _slot_values(slots_in))
    (want_rows, want_slots), *_ = reference.gather(
        [rank_in[0]] * world_size, [rank_in[1]] * world_size, [int(nd)] * world_size, shard)
    for t_in, t_out, want in zip(inputs, outputs, want_rows, strict=True):
        assert t_out.dtype == t_in.dtype and t_out.device == t_in.device
        assert tuple(t_out.shape) == want.shape, (tuple(t_out.shape), want.shape)
        if t_out.device.type != "meta":
            assert np.array_equal(_as_numpy(t_out), want)
    assert tuple(slots_out.shape) == want_slots.shape, (tuple(slots_out.shape), want_slots.shape)
    if slots_out.device.type != "meta":
        assert np.array_equal(slots_out.numpy(), want_slots)


# no deadline: a loaded machine can take any time over one example
@settings(max_examples=int(os.environ.get("PCPCHECK_FUZZ_EXAMPLES", "300")), deadline=None)
@given(drawn=malformed_inputs())
# an int8 map holding PAD_SLOT_ID (-1), returned as int8 -1: the reference must see -1, not 255
@example(drawn=(False, 2, (torch.zeros(1),), slots([-1], torch.int8), 0, False, "gather", False))
def test_random_malformed_input_clear_error_or_accepted_result(drawn):
    valid, world_size, tensors, s, nd, shard, entry, check = drawn
    group = CopiesGroup(world_size)
    seq = list(tensors) if isinstance(tensors, (tuple, list)) else None

    if entry == "mla" and seq is not None and len(seq) >= 2:
        k_pe_in = seq[1]

        def fn():
            return gather_mla_cache_inputs(seq[0], k_pe_in, s, nd, True, shard, group=group,
                                           check_nd_agreement=check)
    elif entry == "indexer" and seq is not None and len(seq) >= 1:
        def fn():
            return gather_indexer_cache_inputs(seq[0], s, nd, True, shard, group=group,
                                               check_nd_agreement=check)
    else:
        entry = "gather"

        def fn():
            return gather_prefill_cache_inputs(tensors, s, nd, shard, group=group,
                                               check_nd_agreement=check)

    value, error = call_with_timeout(fn)
    if error is not None:
        event(f"outcome={type(error).__name__}")
        assert not valid, f"well-formed input rejected: {type(error).__name__}: {error}"
        assert type(error) in (ValueError, TypeError), f"{type(error).__name__}: {error}"
        assert_raised_by_impl(error)
        return
    event("outcome=result")
    if entry == "mla" and nd is None:  # profile / dummy run: inputs returned unchanged, unchecked
        assert value[0] is seq[0] and value[1] is k_pe_in and value[2] is s
        return
    if entry == "mla":
        inputs, (*outs, s_out) = [seq[0], k_pe_in], value
    elif entry == "indexer":
        k_in, num_slots = seq[0], s.shape[0]
        # the indexer cuts k to S // P rows (S > rows) or S rows before the gather
        inputs = [k_in[: num_slots // world_size] if num_slots > k_in.shape[0] else k_in[:num_slots]]
        (*outs, s_out) = value
    else:
        (outs, s_out), inputs = value, seq
        assert isinstance(outs, tuple)
    event(f"branch={impl.select_branch(inputs[0].shape[0], s.shape[0], int(nd), shard)}")
    oracle(inputs, list(outs), s, s_out, world_size, nd, shard)


if __name__ == "__main__":  # regenerate docs/errors.md's table from the code
    text = DOC.read_text()
    head, rest = text.split(TABLE_START)
    _, tail = rest.split(TABLE_END)
    DOC.write_text(f"{head}{TABLE_START}\n{render_table()}\n{TABLE_END}{tail}")
    print(f"wrote {DOC}", file=sys.stderr)
