"""impl is a drop-in for vLLM 0.33.0's gather and its wrappers (issue 12).

Driven exactly as vLLM's model code and unit tests drive ``vllm/v1/attention/ops/pcp.py``: one
call as rank 0; the group is a test double with only ``world_size`` and ``all_gather(t, dim=0)``
returning canned data, registered with the provider (model code never passes a group); positional
and keyword calls; the defaults; the MLA and indexer wrappers with vLLM's argument order and the
keyword ``pcp_shard_decode_requests``. Expected values come from docs/semantics.md: the golden
examples of section 2 and the branch table of section 5. The public signatures are pinned, and a
behavioural test fails if the default of the shard flag changes.

One deliberate difference from 0.33.0 is stated in ``test_branch_a_*``.

One difference in the collectives, not in the results: with several tensors (MLA's kv_c_normed
and k_pe) impl issues ONE all_gather of the tensors' rows packed side by side, where vLLM issues
one per tensor. A single tensor (the indexer's k, any 1-tensor call) is gathered as itself, as in
vLLM, so vLLM's test doubles answer it unchanged; a double that answers a multi-tensor call per
tensor must answer the packed form instead (wire format: impl/gather.py's docstring; here
``torch.cat((kv, k_pe.reshape(N, -1)), dim=1)`` when the dtypes are equal, bytes otherwise).
"""

from __future__ import annotations

import ast
import inspect
import types
import zipfile

import pytest
import torch

from pcpcheck_impl import (
    gather_indexer_cache_inputs,
    gather_mla_cache_inputs,
    gather_prefill_cache_inputs,
    set_pcp_group,
    write_kv_cache,
)

PAD = -1  # PAD_SLOT_ID


def slots(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def rows(values, width: int = 2) -> torch.Tensor:
    """One row per value v: [v, v + 0.5, ...] (width columns), float32."""
    base = torch.tensor(values, dtype=torch.float32).unsqueeze(1)
    return base + 0.5 * torch.arange(width, dtype=torch.float32)


def assert_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (got, want)
    assert torch.equal(got, want), (got, want)


def canned_group(world_size: int, *replies: torch.Tensor):
    """vLLM's test double: a plain object with ``world_size`` and ``all_gather(t, dim=0)`` that
    returns the canned replies in call order. Returns (group, calls): each call's local input."""
    queue, calls = list(replies), []

    def all_gather(t, dim=0):
        assert dim == 0
        assert queue, f"unexpected all_gather of shape {tuple(t.shape)}"
        calls.append(t.clone())
        return queue.pop(0)

    group = types.SimpleNamespace(world_size=world_size, all_gather=all_gather)
    return group, calls


@pytest.fixture(autouse=True)
def _provider_cleared():
    set_pcp_group(None)
    yield
    set_pcp_group(None)


# ---------------------------------------------------------------------------------------------
# 1. the group: world_size and all_gather, nothing else


class RecordingGroup:
    """Has only ``world_size`` and ``all_gather``; records every (non-dunder) attribute read."""

    def __init__(self, world_size: int, replies) -> None:
        object.__setattr__(self, "_state", (world_size, list(replies), []))

    def __getattribute__(self, name):
        world_size, replies, read = object.__getattribute__(self, "_state")
        if name.startswith("__"):
            return object.__getattribute__(self, name)
        read.append(name)
        if name == "world_size":
            return world_size
        if name == "all_gather":
            return lambda t, dim=0: replies.pop(0)
        raise AttributeError(name)


def attributes_read(group: RecordingGroup) -> set[str]:
    return set(object.__getattribute__(group, "_state")[2])


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("check", [False, True])
def test_group_with_only_world_size_and_all_gather(registered, check):
    """Branch B on the golden sharded layout; with the agreement check one extra all_gather of
    [nd, L, S, shard] per rank. impl reads nothing from the group but the two attributes."""
    local, e = rows([11, 33]), slots([123, 789, 456, PAD])
    replies = ([torch.tensor([2, 2, 4, 1, 1, 2, 4, 1])] if check else []) + [rows([11, 33, 22, 0])]
    group = RecordingGroup(2, replies)
    if registered:
        set_pcp_group(group)
    kwargs = {} if registered else {"group": group}
    (out,), s_out = gather_prefill_cache_inputs((local,), e, 2, True, check_nd_agreement=check,
                                                **kwargs)
    assert_equal(out, rows([11, 33, 22, 0]))
    assert_equal(s_out, e)
    assert attributes_read(group) == {"world_size", "all_gather"}


# ---------------------------------------------------------------------------------------------
# 2. golden examples of docs/semantics.md section 2, as vLLM's tests call the gather


def test_golden_sharded_three_decodes_positional_and_keyword():
    """P = 2, sharded, three 1-token decodes, slots [123, 456, 789]: counts [2, 1],
    E = [123, 789, 456, -1]; rank 0 holds rows [11, 33], rank 1 [22, 0 (padding)]."""
    local, e = rows([11, 33]), slots([123, 789, 456, PAD])
    calls_by_form = []
    for call in (
        lambda: gather_prefill_cache_inputs((local,), e, 2, True),
        lambda: gather_prefill_cache_inputs(tensors=(local,), slot_mapping=e, num_decode_tokens=2,
                                            shard_decode_requests=True),
    ):
        group, calls = canned_group(2, rows([11, 33, 22, 0]))
        set_pcp_group(group)
        (out,), s_out = call()
        assert_equal(out, rows([11, 33, 22, 0]))
        assert_equal(s_out, slots([123, 789, 456, PAD]))
        calls_by_form.append(calls)
    for calls in calls_by_form:  # one all_gather, of rank 0's own rows
        assert len(calls) == 1 and torch.equal(calls[0], local)


def test_default_shard_flag_is_false_sharded_layout_without_flag_takes_branch_c():
    """The default matters: the sharded layout called without the flag (the 3-argument call of
    0.31 and of DCP) is branch C on rank 0 (nd = L = 2): its own rows with rank 0's block of the
    map, no collective. With a default of True it would be branch B (four rows, one all_gather)."""
    local, e = rows([11, 33]), slots([123, 789, 456, PAD])
    group, calls = canned_group(2)  # no reply: any all_gather fails the test
    set_pcp_group(group)
    (out,), s_out = gather_prefill_cache_inputs((local,), e, 2)
    assert calls == []
    assert out is local
    assert_equal(s_out, slots([123, 789]))


def test_default_shard_flag_rank_1_takes_branch_e():
    """Rank 1 of the same layout (rows [22, pad], nd = 1) without the flag: branch E, its decode
    row with rank 0's decode slot and every rank's non-decode rows with their own slots."""
    local, e = rows([22, 0]), slots([123, 789, 456, PAD])
    group, calls = canned_group(2, rows([33, 0]))  # all_gather of T[1:]: rank 0's row 1, rank 1's
    set_pcp_group(group)
    (out,), s_out = gather_prefill_cache_inputs((local,), e, 1)
    assert len(calls) == 1 and torch.equal(calls[0], local[1:])
    assert_equal(out, rows([22, 33, 0]))
    assert_equal(s_out, slots([123, 789, PAD]))


def test_golden_sharded_graph_padding():
    """Sharded with graph padding W = 4: gidx = [0,2,0,0,1,0,0,0], wmask = [T,T,F,F,T,F,F,F];
    E = where(wmask, S[gidx], -1) with S = [123, 456, 789]."""
    gidx = torch.tensor([0, 2, 0, 0, 1, 0, 0, 0])
    wmask = torch.tensor([True, True, False, False, True, False, False, False])
    e = torch.where(wmask, slots([123, 456, 789])[gidx], PAD)
    assert e.tolist() == [123, 789, PAD, PAD, 456, PAD, PAD, PAD]
    local = rows([11, 33, 0, 0])
    gathered = rows([11, 33, 0, 0, 22, 0, 0, 0])
    group, _ = canned_group(2, gathered)
    set_pcp_group(group)
    (out,), s_out = gather_prefill_cache_inputs((local,), e, 2, True)
    assert_equal(out, gathered)
    assert_equal(s_out, e)


def test_golden_replicated_graph_padding():
    """Replicated with W = 4: counts [3, 3], gidx = [0,1,2,0,0,1,2,0], mask true only for rank
    0's three rows. Rank 0, nd = 3 < L = 4, flag False: branch E. Called with the flag (B) the
    result is correct too: rank 1's replicated copies carry -1."""
    gidx = torch.tensor([0, 1, 2, 0, 0, 1, 2, 0])
    wmask = torch.tensor([True, True, True, False, False, False, False, False])
    e = torch.where(wmask, slots([123, 456, 789])[gidx], PAD)
    local = rows([11, 22, 33, 0])
    group, calls = canned_group(2, rows([0, 0]))  # T[3:] of rank 0 and rank 1 (padding rows)
    set_pcp_group(group)
    (out,), s_out = gather_prefill_cache_inputs((local,), e, 3, False)
    assert torch.equal(calls[0], local[3:])
    assert_equal(out, rows([11, 22, 33, 0, 0]))
    assert_equal(s_out, slots([123, 456, 789, PAD, PAD]))

    group, _ = canned_group(2, rows([11, 22, 33, 0, 11, 22, 33, 0]))
    set_pcp_group(group)
    (out,), s_out = gather_prefill_cache_inputs((local,), e, 3, True)
    assert_equal(s_out, slots([123, 456, 789, PAD, PAD, PAD, PAD, PAD]))
    assert_equal(out, rows([11, 22, 33, 0, 11, 22, 33, 0]))


def test_golden_legacy_mixed_gather():
    """Legacy mixed gather (0.31's 3-argument call, DCP's call): nd = 1, expanded slots
    [10,11,12,13,-1,21,22,23] (W = 4) give cache slots [10,11,12,13,21,22,23]."""
    local = rows([0, 1, 2, 3])
    e = slots([10, 11, 12, 13, PAD, 21, 22, 23])
    group, calls = canned_group(2, rows([1, 2, 3, 101, 102, 103]))
    set_pcp_group(group)
    (out,), s_out = gather_prefill_cache_inputs((local,), e, 1)
    assert torch.equal(calls[0], local[1:])
    assert_equal(s_out, slots([10, 11, 12, 13, 21, 22, 23]))
    assert_equal(out, rows([0, 1, 2, 3, 101, 102, 103]))


# ---------------------------------------------------------------------------------------------
# 3. public signatures and defaults

POK, KO, NONE = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty
_EXTRAS = [("group", KO, None), ("check_nd_agreement", KO, None)]
EXPECTED = {
    # vLLM 0.33.0's _gather_prefill_cache_inputs, then impl's keyword-only extras
    gather_prefill_cache_inputs: [
        ("tensors", POK, NONE), ("slot_mapping", POK, NONE), ("num_decode_tokens", POK, NONE),
        ("shard_decode_requests", POK, False), *_EXTRAS],
    # maybe_gather_mla_latent_cache_inputs; the older name of the flag keyword-only
    gather_mla_cache_inputs: [
        ("kv_c_normed", POK, NONE), ("k_pe", POK, NONE), ("slot_mapping", POK, NONE),
        ("num_decode_tokens", POK, NONE), ("use_pcp", POK, NONE),
        ("pcp_shard_decode_requests", POK, False), ("shard_decode_requests", KO, None), *_EXTRAS],
    # maybe_gather_indexer_k
    gather_indexer_cache_inputs: [
        ("k", POK, NONE), ("slot_mapping", POK, NONE), ("num_decode_tokens", POK, NONE),
        ("use_pcp", POK, NONE), ("pcp_shard_decode_requests", POK, False),
        ("shard_decode_requests", KO, None), *_EXTRAS],
}
VLLM_NAMES = {
    gather_prefill_cache_inputs: "_gather_prefill_cache_inputs",
    gather_mla_cache_inputs: "maybe_gather_mla_latent_cache_inputs",
    gather_indexer_cache_inputs: "maybe_gather_indexer_k",
}


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("fn", list(EXPECTED), ids=lambda f: f.__name__)
def test_public_signature_and_defaults(fn):
    assert _params(fn) == EXPECTED[fn]


def test_expected_signatures_are_vllm_033s(wheel):
    """The pinned positional part is vLLM 0.33.0's, read (never copied) from its wheel (fetched
    into pcpcheck's wheel cache) with ast: names, order and literal defaults."""
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("vllm/v1/attention/ops/pcp.py").decode()
    defs = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    for fn, vllm_name in VLLM_NAMES.items():
        args = defs[vllm_name].args
        assert not args.posonlyargs and not args.kwonlyargs and args.vararg is None
        defaults = [NONE] * (len(args.args) - len(args.defaults)) + [
            ast.literal_eval(d) for d in args.defaults]
        vllm = [(a.arg, POK, d) for a, d in zip(args.args, defaults)]
        assert [p for p in EXPECTED[fn] if p[1] is POK] == vllm, vllm_name


# ---------------------------------------------------------------------------------------------
# 4. the wrappers, called as vLLM's model code calls them


def _mla_inputs(local_values):
    kv = rows(local_values, width=4).to(torch.bfloat16)
    k_pe = rows(local_values, width=2).reshape(-1, 1, 2).to(torch.bfloat16)
    return kv, k_pe


def test_mla_wrapper_as_mla_attention_calls_it():
    """mla_attention: (kv_c_normed, k_pe, slot_mapping, attn_metadata.num_decode_tokens,
    self.use_pcp, pcp_shard_decode_requests=self.pcp_shard_decode_requests). Sharded golden
    layout, rank 0: kv (N, 512-like), k_pe (N, *k_pe.shape[1:]), slots (N,)."""
    kv, k_pe = _mla_inputs([11, 33])
    kv_all, k_pe_all = _mla_inputs([11, 33, 22, 0])
    e = slots([123, 789, 456, PAD])
    # One all_gather of both tensors' rows side by side (vLLM: one per tensor), k_pe flattened.
    group, calls = canned_group(2, torch.cat((kv_all, k_pe_all.reshape(4, 2)), dim=1))
    set_pcp_group(group)
    kv_out, k_pe_out, s_out = gather_mla_cache_inputs(kv, k_pe, e, 2, True,
                                                      pcp_shard_decode_requests=True)
    assert len(calls) == 1
    assert_equal(calls[0], torch.cat((kv, k_pe.reshape(2, 2)), dim=1))
    assert_equal(kv_out, kv_all)
    assert_equal(k_pe_out, k_pe_all)
    assert_equal(s_out, e)


@pytest.mark.parametrize("form", ["default", "pcp keyword False", "older keyword False", "positional"])
def test_mla_wrapper_flag_forms_and_default(form):
    """deepseek_v32 passes use_pcp=True positionally and the flag by keyword; the flag omitted
    is False (vLLM's default): on the sharded layout's rank 0 that is branch C, no collective."""
    kv, k_pe = _mla_inputs([11, 33])
    e = slots([123, 789, 456, PAD])
    group, calls = canned_group(2)
    set_pcp_group(group)
    call = {
        "default": lambda: gather_mla_cache_inputs(kv, k_pe, e, 2, True),
        "pcp keyword False": lambda: gather_mla_cache_inputs(kv, k_pe, e, 2, True,
                                                             pcp_shard_decode_requests=False),
        "older keyword False": lambda: gather_mla_cache_inputs(kv, k_pe, e, 2, True,
                                                               shard_decode_requests=False),
        "positional": lambda: gather_mla_cache_inputs(kv, k_pe, e, 2, True, False),
    }[form]
    kv_out, k_pe_out, s_out = call()
    assert calls == []
    assert_equal(kv_out, kv)
    assert_equal(k_pe_out, k_pe)
    assert_equal(s_out, slots([123, 789]))


@pytest.mark.parametrize("keyword", ["pcp_shard_decode_requests", "shard_decode_requests"])
def test_wrappers_take_both_names_of_the_flag(keyword):
    e = slots([123, 789, 456, PAD])
    kv, k_pe = _mla_inputs([11, 33])
    kv_all, k_pe_all = _mla_inputs([11, 33, 22, 0])
    group, _ = canned_group(2, torch.cat((kv_all, k_pe_all.reshape(4, 2)), dim=1))
    set_pcp_group(group)
    kv_out, k_pe_out, s_out = gather_mla_cache_inputs(kv, k_pe, e, 2, True, **{keyword: True})
    assert_equal(kv_out, kv_all) and assert_equal(k_pe_out, k_pe_all)
    assert_equal(s_out, e)
    k_all = rows([11, 33, 22, 0], width=3)
    group, _ = canned_group(2, k_all)
    set_pcp_group(group)
    k_out, s_out = gather_indexer_cache_inputs(rows([11, 33], width=3), e, 2, True, **{keyword: True})
    assert_equal(k_out, k_all)
    assert_equal(s_out, e)


def test_indexer_wrapper_as_sparse_attn_indexer_calls_it():
    """sparse_attn_indexer cuts k to S // P rows (S > rows) before calling
    (k, slot_mapping, num_decode_tokens, use_pcp, pcp_shard_decode_requests=...); the wrapper's
    own cut is then a no-op. Default flag on the sharded layout's rank 0: branch C."""
    k = rows([11, 33], width=3)
    e = slots([123, 789, 456, PAD])
    group, calls = canned_group(2)
    set_pcp_group(group)
    k_out, s_out = gather_indexer_cache_inputs(k, e, 2, True)
    assert calls == []
    assert_equal(k_out, k)
    assert_equal(s_out, slots([123, 789]))


def test_wrappers_return_inputs_unchanged_without_pcp_or_nd():
    kv, k_pe, k, e = rows([1, 2]), rows([1, 2]).reshape(2, 1, 2), rows([1, 2]), slots([5, 6])
    group, calls = canned_group(2)
    set_pcp_group(group)
    out = gather_mla_cache_inputs(kv, k_pe, e, 2, False, pcp_shard_decode_requests=True)
    assert out[0] is kv and out[1] is k_pe and out[2] is e
    out = gather_mla_cache_inputs(kv, k_pe, None, None, True)  # dummy run: no metadata, no map
    assert out[0] is kv and out[1] is k_pe and out[2] is None
    out = gather_indexer_cache_inputs(k, e, 2, False)
    assert out[0] is k and out[1] is e
    assert calls == []


@pytest.mark.parametrize("shard, num_slots, gathers", [(True, 2, True), (False, 2, False), (True, 0, False)])
def test_wrappers_zero_local_rows_shapes(shard, num_slots, gathers):
    """L = 0 (a rank with no rows): vLLM's shapes, (N, kv width), (N, *k_pe.shape[1:]), (N,),
    where vLLM's own reshape(L, -1) of k_pe fails (bug class 9). MLA's packed reply: bf16 and
    float32 rows differ in dtype, so bytes, 8*2 + 4*4 = 32 per row."""
    kv, k_pe, k = torch.empty(0, 8, dtype=torch.bfloat16), torch.empty(0, 1, 4), torch.empty(0, 5)
    e = slots([PAD] * num_slots)
    with pytest.raises(RuntimeError):
        k_pe.reshape(0, -1)
    group, _ = canned_group(2, *([torch.empty(0, 32, dtype=torch.uint8)] if gathers else []))
    set_pcp_group(group)
    kv_out, k_pe_out, s_out = gather_mla_cache_inputs(kv, k_pe, e, 0, True, shard)
    assert [tuple(kv_out.shape), tuple(k_pe_out.shape), tuple(s_out.shape)] == [(0, 8), (0, 1, 4), (0,)]
    assert kv_out.dtype == torch.bfloat16 and s_out.dtype == torch.int64
    group, _ = canned_group(2, *([torch.empty(0, 5)] if gathers else []))
    set_pcp_group(group)
    k_out, s_out = gather_indexer_cache_inputs(k, e, 0, True, shard)
    assert tuple(k_out.shape) == (0, 5) and tuple(s_out.shape) == (0,)


# ---------------------------------------------------------------------------------------------
# 5. the one deliberate difference: branch A keeps T[:S], not T[:num_decode_tokens]
#
# vLLM 0.33.0 returns rows and slots [:num_decode_tokens] for an unexpanded map (S <= L); impl
# returns [:S]. num_decode_tokens is the kernel's decode/prefill split, not KV ownership: every
# real row of an unexpanded (replicated draft) map must be written. In every step 0.33.0
# produces, a draft step's rows are all decodes (nd = every real row), so the two write the same
# cache; impl's output may be longer (trailing DP-padding rows paired with -1, skipped by the
# kernel). They differ only in the class-10 hazard: a multi-token draft block classified prefill
# (nd below the real row count), where [:nd] never writes the KV of the other real rows.


def _cache_after(rows_out: torch.Tensor, slots_out: torch.Tensor) -> torch.Tensor:
    cache = torch.full((4, 4, rows_out.shape[1]), -7.5)  # 4 blocks of 4 slots
    write_kv_cache(cache, rows_out, slots_out)
    return cache


def _vllm_033_branch_a(tensor, slot_mapping, nd):
    """vLLM 0.33.0's branch A as docs/semantics.md section 5 states it: ``T[:nd]``, ``s[:nd]``."""
    return tensor[:nd], slot_mapping[:nd]


@pytest.mark.parametrize("map_padded", [False, True])
def test_branch_a_same_cache_as_vllm_in_a_draft_step(map_padded):
    """A later draft step (#56107) with DP padding: 3 real 1-token decodes, 2 padding rows
    (L = 5), nd = 3 (every real row a decode), map real-length or padded with -1 to L."""
    local = rows([11, 22, 33, 0, 0])
    s = slots([5, 9, 2] + [PAD, PAD] * map_padded)
    (out,), s_out = gather_prefill_cache_inputs((local,), s, 3)  # no group needed: no collective
    assert_equal(out, local[: len(s)])
    assert_equal(s_out, s)
    vllm_rows, vllm_slots = _vllm_033_branch_a(local, s, 3)
    assert_equal(_cache_after(out, s_out), _cache_after(vllm_rows, vllm_slots))
    assert out.shape[0] == (5 if map_padded else 3) and vllm_rows.shape[0] == 3


def test_branch_a_class_10_hazard_impl_writes_every_real_row():
    """A causal multi-token draft block classified prefill: 3 real rows, nd = 1. vLLM 0.33.0's
    [:nd] writes one row and never the KV of rows 1 and 2 (slots 9 and 2); impl writes all three.
    The only case where impl's cache and 0.33.0's differ; 0.33.0 never produces it (its draft
    steps with an unexpanded map are 1-token decodes, nd = every row)."""
    local = rows([11, 22, 33])
    s = slots([5, 9, 2])
    (out,), s_out = gather_prefill_cache_inputs((local,), s, 1)
    impl_cache = _cache_after(out, s_out)
    vllm_cache = _cache_after(*_vllm_033_branch_a(local, s, 1))
    flat_impl, flat_vllm = impl_cache.reshape(16, -1), vllm_cache.reshape(16, -1)
    assert_equal(flat_impl[[5, 9, 2]], local)
    assert_equal(flat_vllm[5], local[0])
    assert (flat_vllm[[9, 2]] == -7.5).all()  # the lost KV
