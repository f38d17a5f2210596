"""What a case exercised: the gather branch each rank takes (A-E, docs/semantics.md section 5) and
the layout features of the step (section 2). Worked out in the driver from the case and the
reference's layout of it (prepare.plan), never from what the target returned (a release's own
manager reports its layout: that is judged, not trusted for coverage), and counted
per regime beside the invariants (engine.RegimeResult), so that every report says what a pass
never exercised: a feature no case reached is shown as 0.
"""

from __future__ import annotations

import functools

import numpy as np

import pcpcheck_reference as reference
from pcpcheck.judge.prepare import plan
from pcpcheck.shared.case import Case
from pcpcheck_spec import model
from pcpcheck_spec.names import (
    BRANCH_ALL_DECODE,
    BRANCH_MIXED,
    BRANCH_NO_DECODE,
    BRANCH_SHARDED,
    BRANCH_UNEXPANDED,
    CAPTURING,
    DCP,
    DRAFT_REGIMES,
    MAIN_STREAM,
    STARTED,
    Batch,
)

BRANCHES = (BRANCH_UNEXPANDED, BRANCH_SHARDED, BRANCH_ALL_DECODE, BRANCH_NO_DECODE, BRANCH_MIXED)

GRAPH_PADDING = "graph padding"  # rows past the widest rank (CUDA-graph batch size)
DP_PADDING = "DP padding"  # draft rows past the real count (data-parallel padding)
MAP_PAST_ND = "unexpanded map longer than nd"  # branch A with slots past num_decode_tokens
INTERLEAVE_2 = "interleave 2"  # dcp with cp_kv_cache_interleave_size 2
EMPTY_RANK = "rank with zero real rows"
ROUND_ROBIN = "decodes dealt round-robin"  # shard flag, two or more decodes with rows
SHORT_PREFILL_REPLICATED = "short prefill replicated (dcp)"  # (2P-1)*ceil(q/2P) >= q, D > 1
KV_GROUPS = "several KV groups"  # a release step whose gather calls were judged per KV group
# (the engine counts it from the observation: a drawn gather case carries one group; see
# `unreachable`)
SPLIT_HEAD_TAIL = "request split head/tail"  # a split prefill whose rank 0 gets both chunks
# An asynchronous step (`--async`): whether the protocol started on some rank, or fell back on
# every rank, and why (the engine counts them from the ranks' stream traces: `asynchronous`).
ASYNC_STARTED = "async protocol started"
ASYNC_CAPTURED = "async fallback: graph capture"
ASYNC_DECLINED = "async fallback: start answered False"
ASYNC_FEATURES = (ASYNC_STARTED, ASYNC_CAPTURED, ASYNC_DECLINED)
# A step of a gather whose file uses the stream API, judged without a protocol: whether some
# rank's gather did work on a stream besides the main one (only then is there an order to judge).
SIDE_STREAMS = "gather used a side stream"
MAIN_STREAM_ONLY = "gather used the main stream alone"
STREAM_FEATURES = (SIDE_STREAMS, MAIN_STREAM_ONLY)
TRACE_FEATURES = (*ASYNC_FEATURES, *STREAM_FEATURES)  # counted from a judged stream trace
# The steps on which an order between streams was exercised: ASYNC_INPUT, _READ, _LIFETIME count
ORDERED = (ASYNC_STARTED, SIDE_STREAMS)
FEATURES = (GRAPH_PADDING, DP_PADDING, MAP_PAST_ND, INTERLEAVE_2, EMPTY_RANK, ROUND_ROBIN,
            SHORT_PREFILL_REPLICATED, KV_GROUPS, SPLIT_HEAD_TAIL, *TRACE_FEATURES)


def asynchronous(traces: list) -> str | None:
    """The ASYNC_FEATURES or STREAM_FEATURES entry of a step, from its ranks' stream traces
    (None: a step whose streams were not judged). A protocol's trace carries start's answer; a
    gather judged alone has none."""
    traces = [trace for trace in traces if trace is not None]
    if not traces:
        return None
    entries = [entry for trace in traces for entry in trace]
    if not any(entry[0] == STARTED for entry in entries):
        return SIDE_STREAMS if any(entry[1] > MAIN_STREAM for entry in entries) \
            else MAIN_STREAM_ONLY
    flags = {op for op, _, _, index, _ in entries if op in (STARTED, CAPTURING) and index}
    if STARTED in flags:
        return ASYNC_STARTED
    return ASYNC_CAPTURED if CAPTURING in flags else ASYNC_DECLINED


def unreachable(regime: str, capabilities: dict | None = None,
                counted: dict | None = None) -> frozenset[str]:
    """The features of FEATURES no case of `regime` can exercise in this kind of run, left out
    of its counts so that a report shows n/a there, never 0. `capabilities`: None for a gather
    checked alone (`pcpcheck check`, a replay: one gather call per case, one KV group), else a
    release's (ReleaseRecord.capabilities: `pcpcheck vllm`), whose step calls the gather again
    for its second KV group only in dcp, where that group is replicated
    (protocol.Capabilities.replicated_group_call). `counted`: the regime's counts so far; the
    ASYNC_FEATURES are reachable once a step counted one of them (a run with `--async`), the
    STREAM_FEATURES likewise (a gather whose file uses streams)."""
    unreached = {feature for group in (ASYNC_FEATURES, STREAM_FEATURES)
                 if not any((counted or {}).get(f) for f in group) for feature in group}
    if not (capabilities is not None and regime == DCP and capabilities.get("replicated_kv_group")):
        unreached.add(KV_GROUPS)
    return frozenset(unreached)


def exercised(case: Case, era: str = reference.ERA_CURRENT) -> tuple[frozenset, frozenset]:
    """(branches, features) of a case: what the search counts per case, kept per batch (both
    read the batch alone, and batches recur)."""
    try:
        return _kept(case.batch, era)
    except TypeError:  # a Batch built by hand with a list somewhere: not kept
        return _exercised(case.batch, era)


def _exercised(batch: Batch, era: str) -> tuple[frozenset, frozenset]:
    planned = plan(batch, era)
    return frozenset(_branches(planned)), frozenset(_features(batch, era, planned))


_kept = functools.lru_cache(maxsize=1024)(_exercised)


def branches(case: Case, era: str = reference.ERA_CURRENT) -> set[str]:
    """The branches the ranks of a case take (spec.model.branch of each rank's call in the
    reference layout of `era`, a release's own; a well-formed case's ranks all take the same
    one)."""
    return _branches(plan(case.batch, era))


def _branches(planned: tuple) -> set[str]:
    tokens, slot_maps, nds, shard = planned[:4]
    return {model.branch(tokens.shape[1], len(slots), nd, shard)
            for slots, nd in zip(slot_maps, nds)}


def features(case: Case, era: str = reference.ERA_CURRENT) -> set[str]:
    """The layout features of FEATURES a case exercises (in the reference layout of `era`)."""
    return _features(case.batch, era, plan(case.batch, era))


def _features(batch: Batch, era: str, planned: tuple) -> set[str]:
    """features of the batch, from its plan (prepare.plan)."""
    tokens, slot_maps, nds, shard = planned[:4]
    real_per_rank = (tokens >= 0).sum(axis=1)
    found = set()
    if batch.regime not in DRAFT_REGIMES and tokens.shape[1] > real_per_rank.max(initial=0):
        found.add(GRAPH_PADDING)
    if batch.regime in DRAFT_REGIMES and batch.dp_pad:
        found.add(DP_PADDING)
    if any(len(slots) <= tokens.shape[1] and len(slots) > nd
           for slots, nd in zip(slot_maps, nds)):
        found.add(MAP_PAST_ND)
    if batch.regime == DCP and batch.interleave == 2:
        found.add(INTERLEAVE_2)
    if np.any(real_per_rank == 0):
        found.add(EMPTY_RANK)
    decodes = [r for r in batch.requests if r.num_tokens and not r.prefilling]
    if shard and len(decodes) >= 2:
        found.add(ROUND_ROBIN)
    if batch.regime not in DRAFT_REGIMES:
        two_p = 2 * batch.pcp_size
        replicated = reference.replicated_requests(batch, era)
        for request, copied in zip(batch.requests, replicated):
            if not request.prefilling or not request.num_tokens:
                continue
            if copied and batch.regime == DCP:
                found.add(SHORT_PREFILL_REPLICATED)
            elif not copied and (two_p - 1) * -(-request.num_tokens // two_p) < request.num_tokens:
                found.add(SPLIT_HEAD_TAIL)
    return found
