"""Greedy reductions: hypothesis' shrink can stop in a local minimum (a case of 10 tokens where
7 show the bug); the search then tries these well-formed, strictly smaller variants greedily."""

from __future__ import annotations

import dataclasses

import pcpcheck_reference as reference
from pcpcheck.search.draw import kernel_decode_tokens
from pcpcheck.shared.case import Case, TensorSpec
from pcpcheck_spec.names import DCP, DRAFT_DECODE_THRESHOLD, DRAFT_MIXED, DRAFT_REGIMES, Batch


def _fit_blocks(batch: Batch) -> Batch:
    """Every request with exactly the blocks its positions need: its own blocks first, fresh
    ones (above every block in use) when it needs more."""
    span = batch.block_size * (batch.pcp_size if batch.regime == DCP else 1)
    fresh = 1 + max((b for r in batch.requests for b in r.blocks), default=-1)
    requests = []
    for request in batch.requests:
        needed = -(-(request.context_len + request.num_tokens) // span)
        blocks = request.blocks[:needed]
        extra = needed - len(blocks)
        blocks += tuple(range(fresh, fresh + extra))
        fresh += extra
        requests.append(dataclasses.replace(request, blocks=blocks))
    batch = dataclasses.replace(batch, requests=tuple(requests))
    if batch.regime == DRAFT_MIXED:
        batch = dataclasses.replace(batch, num_decode_tokens=kernel_decode_tokens(batch.requests))
    return batch


def _well_formed(batch: Batch) -> bool:
    if batch.regime in DRAFT_REGIMES and any(r.num_tokens < 1 or r.prefilling for r in batch.requests):
        return False
    if batch.regime == DRAFT_MIXED and all(r.num_tokens <= DRAFT_DECODE_THRESHOLD
                                           for r in batch.requests):
        return False
    if batch.regime == DCP and batch.block_size % batch.interleave:
        return False
    try:
        reference.layout(batch)
    except ValueError:
        return False
    return True


def _width(batch: Batch) -> int:
    """Rows per rank (W) of an expanded step."""
    return int(reference.layout(batch).width)


def smaller(case: Case, pcp_sizes=None):
    """Well-formed cases strictly smaller than `case`, most reducing first: fewer ranks (the next
    smaller of `pcp_sizes`, the world sizes the search may use; default any), requests, tokens
    (also at the same width W, graph padding keeping the rows a bug needs), context, padding,
    tensors, a smaller block size; never a wider rank (W)."""
    batch = case.batch
    candidates = []
    fewer = [p for p in (pcp_sizes or range(2, batch.pcp_size)) if 2 <= p < batch.pcp_size]
    if fewer:
        candidates.append(dataclasses.replace(batch, pcp_size=max(fewer)))
    for i in range(len(batch.requests)):
        others = batch.requests[:i] + batch.requests[i + 1:]
        candidates.append(dataclasses.replace(batch, requests=others))
    for i, request in enumerate(batch.requests):
        def with_request(**change):
            changed = dataclasses.replace(request, **change)
            return dataclasses.replace(batch, requests=batch.requests[:i] + (changed,)
                                       + batch.requests[i + 1:])
        if request.num_tokens > 0:
            fewer = with_request(num_tokens=request.num_tokens - 1)
            candidates.append(fewer)
            if batch.regime not in DRAFT_REGIMES:  # one token less at the same rank width W
                candidates.append(dataclasses.replace(fewer, graph_size=_width(batch)))
        if request.context_len:
            candidates.append(with_request(context_len=0))
            candidates.append(with_request(context_len=request.context_len - 1))
        if request.prefilling and request.num_tokens <= 3:
            candidates.append(with_request(prefilling=False))
    if batch.graph_size:
        candidates.append(dataclasses.replace(batch, graph_size=0))
        candidates.append(dataclasses.replace(batch, graph_size=batch.graph_size - 1))
    if batch.dp_pad:
        candidates.append(dataclasses.replace(batch, dp_pad=batch.dp_pad - 1))
    if batch.pad_slot_map:
        candidates.append(dataclasses.replace(batch, pad_slot_map=False))
    for block_size in (1, 2, 4):
        if block_size < batch.block_size:
            candidates.append(dataclasses.replace(batch, block_size=block_size, interleave=1))
    if batch.interleave > 1:
        candidates.append(dataclasses.replace(batch, interleave=1))
    ordered = sorted(b for r in batch.requests for b in r.blocks)
    if ordered != list(range(len(ordered))):  # blocks renumbered 0.. in the same order
        rename = {b: k for k, b in enumerate(ordered)}
        candidates.append(dataclasses.replace(batch, requests=tuple(
            dataclasses.replace(r, blocks=tuple(rename[b] for b in r.blocks)) for r in batch.requests)))
    expanded = batch.regime not in DRAFT_REGIMES
    width = _width(batch) if expanded else 0
    for candidate in candidates:
        candidate = _fit_blocks(candidate)
        if _well_formed(candidate) and (not expanded or _width(candidate) <= width):
            yield Case(candidate, case.tensors)
    if len(case.tensors) > 1:
        for k in range(len(case.tensors)):
            yield Case(batch, case.tensors[:k] + case.tensors[k + 1:])
    if case.tensors != (TensorSpec((4,), "float32"),):
        yield Case(batch, (TensorSpec((4,), "float32"),))


def size(case: Case) -> tuple:
    """Hypothesis's shrink order, roughly: fewer ranks, requests, tokens, then shorter JSON."""
    return (case.batch.pcp_size, len(case.batch.requests),
            sum(r.num_tokens for r in case.batch.requests), len(case.to_json()))


EXPANSIONS_PER_SIZE = 40  # cases whose reductions `ascending` works out, per world size


def ascending(case: Case, pcp_sizes):
    """Cases smaller than `case` in order of size, smallest first, then `case` itself: at each
    world size in `pcp_sizes` up to the case's own, the case with that many ranks and what its
    reductions reach, best first (the smallest case found so far is reduced next). Nothing is
    run, and each world size is worked out only when the one before is used up: what a search
    tries in this order, the first that fails again is the smallest."""
    seen = {case.to_json()}
    for pcp_size in sorted(p for p in set(pcp_sizes) if p <= case.batch.pcp_size):
        start = _fit_blocks(dataclasses.replace(case.batch, pcp_size=pcp_size))
        if not _well_formed(start):  # fewer ranks widen them past the graph size: no graph
            start = dataclasses.replace(start, graph_size=0)
            if not _well_formed(start):
                continue
        found, frontier = [], [Case(start, case.tensors)]
        for _ in range(EXPANSIONS_PER_SIZE):
            if not frontier:
                break
            frontier.sort(key=size)
            node = frontier.pop(0)
            if node.to_json() in seen:
                continue
            seen.add(node.to_json())
            found.append(node)
            frontier += [c for c in smaller(node, (pcp_size,)) if c.to_json() not in seen]
        yield from sorted(found, key=size)
    yield case
