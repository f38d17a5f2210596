"""Token layout of the PCP manager and the DCP slot formula (docs/semantics.md sections 2 and 3).

Vectorised numpy. Imports only the shared vocabulary `spec.names`: this is an independent
statement of the behaviour, not a re-export of spec/model.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pcpcheck_spec.names import (
    DCP,
    DRAFT,
    DRAFT_MIXED,
    DRAFT_REGIMES,
    EXPANDED_REGIMES,
    PAD_SLOT_ID,
    SHARDED,
    Batch,
)

_I64 = np.int64


def dcp_size(batch: Batch) -> int:
    """D: the P ranks shard the KV cache in the dcp regime; elsewhere each holds a replica."""
    return batch.pcp_size if batch.regime == DCP else 1


@dataclass(frozen=True, eq=False)
class Layout:
    """Per-rank rows and slot maps of one step.

    width: W (expanded regimes) or L (draft regimes); num_rows: L, the rows of every rank's tensors.
    counts (P,): real rows per rank. gidx/wmask (P*W,): expanded index and write mask, rank-major
    (None for draft regimes). tokens (P, L): row labels (token id, or pad_label(r, j, L)).
    slot_maps: the slot mapping each rank passes to the gather. num_decode_tokens: nd per rank.
    shard: the gather's shard_decode_requests.
    """

    width: int
    num_rows: int
    counts: np.ndarray
    gidx: np.ndarray | None
    wmask: np.ndarray | None
    tokens: np.ndarray
    slot_maps: list
    num_decode_tokens: list
    shard: bool


# ---------------------------------------------------------------------------------------------
# Section 3: global slot mapping


def _token_requests(batch: Batch):
    """(request of each token, position of each token)."""
    reqs = batch.requests
    q = [r.num_tokens for r in reqs]
    if min(q, default=0) < 0:
        raise ValueError("a request has a negative num_tokens")
    shift = []  # per request: its context minus its first token's global index
    start = 0
    for r, n in zip(reqs, q):
        shift.append(r.context_len - start)
        start += n
    req_of = np.repeat(np.arange(len(reqs), dtype=_I64), q)
    pos = np.arange(start, dtype=_I64) + np.array(shift, dtype=_I64)[req_of]
    return req_of, pos


def _owner_and_slot(batch: Batch):
    """For every token: its DCP owner and its slot in the owner's cache (section 3)."""
    bs, dd, il = batch.block_size, dcp_size(batch), batch.interleave
    if bs <= 0 or dd <= 0 or il <= 0:
        raise ValueError("block_size, dcp size and interleave must be positive")
    req_of, pos = _token_requests(batch)
    if not pos.size:
        return pos, np.zeros(0, dtype=_I64)
    vb, off = np.divmod(pos, bs * dd)
    if dd == 1:  # one owner; the interleave permutes nothing within a block
        owner, local = np.zeros_like(pos), off
    else:
        owner = (off // il) % dd
        local = (off // (il * dd)) * il + off % il
    flat: list[int]
    nblocks, base, flat = [], [], []  # per request: block count, first entry in flat; all tables
    for r in batch.requests:
        base.append(len(flat))
        nblocks.append(len(r.blocks))
        flat.extend(r.blocks)
    short = vb >= np.array(nblocks, dtype=_I64)[req_of]
    if short.any():
        bad = int(req_of[np.argmax(short)])
        raise ValueError(f"request {bad}: block table too short for its positions")
    slot = np.array(flat, dtype=_I64)[np.array(base, dtype=_I64)[req_of] + vb] * bs + local
    return owner, slot


def global_slots(batch: Batch, dcp_rank: int) -> np.ndarray:
    """Global slot mapping S as seen by DCP rank `dcp_rank` (N,), int64; -1 where not owned."""
    if not 0 <= dcp_rank < dcp_size(batch):
        raise ValueError(f"dcp_rank {dcp_rank} outside 0..{dcp_size(batch) - 1}")
    owner, slot = _owner_and_slot(batch)
    return np.where(owner == dcp_rank, slot, PAD_SLOT_ID).astype(_I64, copy=False)


def global_slot_maps(batch: Batch) -> list:
    """S_d for every DCP rank d (section 3's formula): computed once, it can be handed to
    `layout` and `expected_caches` as their `slots` (what each would compute itself)."""
    owner, slot = _owner_and_slot(batch)
    dd = dcp_size(batch)
    if dd == 1:
        return [slot]
    return [np.where(owner == d, slot, PAD_SLOT_ID) for d in range(dd)]


def all_global_slots(batch: Batch, slots) -> list:
    """S_d for every DCP rank d, from the formula or the caller's override."""
    if slots is None:
        return global_slot_maps(batch)
    dd = dcp_size(batch)
    n = sum(r.num_tokens for r in batch.requests)
    single = (isinstance(slots, np.ndarray) and slots.ndim == 1) or (
        isinstance(slots, (list, tuple)) and (len(slots) == 0 or np.ndim(slots[0]) == 0)
    )
    if single:
        if dd != 1:
            raise ValueError("a single slot array is only accepted when D = 1")
        slots = [slots]
    out = [np.asarray(s, dtype=_I64) for s in slots]
    if len(out) != dd:
        raise ValueError(f"expected {dd} per-DCP-rank slot arrays, got {len(out)}")
    for s in out:
        if s.shape != (n,):
            raise ValueError(f"slot array of shape {s.shape}, expected ({n},)")
    return out


# ---------------------------------------------------------------------------------------------
# Section 2: layout


def expand_slot_mapping(gidx, wmask, slots) -> np.ndarray:
    """E = where(wmask, slots[gidx], -1), int64 (masked-off entries never index `slots`)."""
    gidx = np.asarray(gidx, dtype=_I64)
    wmask = np.asarray(wmask, dtype=bool)
    slots = np.asarray(slots, dtype=_I64)
    if gidx.shape != wmask.shape:
        raise ValueError("gidx and wmask differ in shape")
    out = np.full(gidx.shape, PAD_SLOT_ID, dtype=_I64)
    out[wmask] = slots[gidx[wmask]]
    return out


# Layout eras: where vLLM's PCP manager really changed (docs/semantics.md section 9).
ERA_CURRENT = "0.30"  # 0.30 onward: section 2 (decodes first; DCP short prefills replicated)
ERA_V026 = "0.26"  # 0.26-0.29: every prefill split, pure prefills last, decodes not first
ERAS = (ERA_CURRENT, ERA_V026)


def layout(batch: Batch, slots=None, era: str = ERA_CURRENT) -> Layout:
    """The PCP manager's layout of `batch` (section 2) and each rank's gather inputs.

    slots: optional override of the global slot mapping: a list of per-DCP-rank (N,) arrays, or
    one array when D = 1. Default: section 3's formula. era: which manager's layout (ERAS).
    """
    if batch.pcp_size < 1:
        raise ValueError("pcp_size must be >= 1")
    if era not in ERAS:
        raise ValueError(f"unknown layout era {era!r}, expected one of {ERAS}")
    if batch.regime in DRAFT_REGIMES:
        return _draft_layout(batch, slots)
    if batch.regime not in EXPANDED_REGIMES:
        raise ValueError(f"unknown regime {batch.regime!r}")
    if era == ERA_V026 and batch.regime == SHARDED:
        raise ValueError("the 0.26 layout has no decode sharding")
    pp = batch.pcp_size
    dd = dcp_size(batch)
    sharded = batch.regime == SHARDED
    per_rank = _rank_segments(batch) if era == ERA_CURRENT else _rank_segments_v026(batch)
    segs = []  # (first token, length, written?) of every segment, rank by rank
    seg_rank_l = []
    nds = []
    counts_l = []  # real rows per rank
    for r in range(pp):
        rows = [seg[1:] for seg in sorted(per_rank[r], key=lambda seg: seg[0])]  # stable
        segs += [(start, length, write) for start, length, write, _ in rows]
        seg_rank_l += [r] * len(rows)
        counts_l.append(sum(length for _, length, _, _ in rows))
        leading = 0  # nd: the leading decode rows (the kernel's split, docs/semantics.md section 9)
        for _, length, _, decode in rows:
            if not decode:
                break
            leading += length
        nds.append(leading)
    counts = np.array(counts_l, dtype=_I64)
    nmax = max(counts_l, default=0)
    graph = batch.graph_size
    if graph < 0:
        raise ValueError("graph_size must be >= 0")
    if 0 < graph < nmax:
        raise ValueError(f"graph_size {graph} below the largest rank-local count {nmax}")
    width = max(nmax, graph)

    size = pp * width
    gidx = np.zeros(size, dtype=_I64)
    wmask = np.zeros(size, dtype=bool)
    if segs:
        seg_arr = np.array(segs, dtype=_I64)
        seg_tok, seg_len = seg_arr[:, 0], seg_arr[:, 1]
        seg_excl = np.cumsum(seg_len) - seg_len  # first row of each segment, over all ranks
        rank_base = np.cumsum(counts) - counts
        seg_rank = np.array(seg_rank_l, dtype=_I64)
        # row i overall (rank-major, real rows only) lands at i + dest shift, holds i + token shift
        shifts = np.stack((seg_rank * width - rank_base[seg_rank], seg_tok - seg_excl))
        dest, tok = np.repeat(shifts, seg_len, axis=1) + np.arange(int(seg_excl[-1] + seg_len[-1]),
                                                                   dtype=_I64)
        gidx[dest] = tok
        wmask[dest] = np.repeat(seg_arr[:, 2].astype(bool), seg_len)
    else:
        dest = tok = np.zeros(0, dtype=_I64)
    labels = -1 - np.arange(size, dtype=_I64)  # pad_label(r, j, W) == -(1 + r*W + j)
    labels[dest] = tok
    per_dcp = all_global_slots(batch, slots)
    if dd == 1:
        e = expand_slot_mapping(gidx, wmask, per_dcp[0])
        slot_maps = [e] + [e.copy() for _ in range(pp - 1)]
    else:
        slot_maps = [expand_slot_mapping(gidx, wmask, per_dcp[r]) for r in range(pp)]
    return Layout(
        width=width,
        num_rows=width,
        counts=counts,
        gidx=gidx,
        wmask=wmask,
        tokens=labels.reshape(pp, width),
        slot_maps=slot_maps,
        num_decode_tokens=nds,
        shard=sharded,
    )


def rank_counts(batch: Batch) -> list[int]:
    """Each rank's real rows in the current layout (Layout.counts) of an expanded regime's
    batch, from its segments alone: what sizing CUDA-graph padding needs, without the maps."""
    return [sum(segment[2] for segment in segments) for segments in _rank_segments(batch)]


def _split_chunks(q: int, two_p: int, rank: int):
    """(offset, length) of rank's head and tail DualChunkSwap chunks, empty chunks dropped."""
    c = -(-q // two_p)
    for lo in (rank * c, (two_p - 1 - rank) * c):
        if lo < q:
            yield lo, min(c, q - lo)


def _rank_segments(batch: Batch) -> list:
    """Section 2 (0.30 on): per rank, (sort key, first token, length, written?, decode?) per
    segment; sorted by (is_prefilling, request index, chunk start)."""
    pp, dd, two_p = batch.pcp_size, dcp_size(batch), 2 * batch.pcp_size
    sharded = batch.regime == SHARDED
    out: list[list[tuple[tuple[bool, int, int], int, int, bool, bool]]] = [[] for _ in range(pp)]
    start = ordinal = 0
    for index, request in enumerate(batch.requests):
        q = request.num_tokens
        if q < 0:
            raise ValueError("a request has a negative num_tokens")
        if q == 0:
            continue
        c = -(-q // two_p)
        decode = not request.prefilling
        if decode or (dd > 1 and (two_p - 1) * c >= q):  # replicated
            key = (request.prefilling, index, 0)
            if sharded:  # one owner, round robin over replicated requests with rows
                out[ordinal % pp].append((key, start, q, True, decode))
                ordinal += 1
            else:  # every rank; rank 0 is the canonical writer
                for r in range(pp):
                    out[r].append((key, start, q, r == 0, decode))
        else:  # split prefill: head chunk r, tail chunk 2P-1-r
            for r in range(pp):
                out[r] += [((True, index, lo), start + lo, n, True, False)
                           for lo, n in _split_chunks(q, two_p, r)]
        start += q
    return out


def _rank_segments_v026(batch: Batch) -> list:
    """The 0.26-0.29 manager: decodes on every rank (rank 0 writes), every prefill split (D > 1
    too), each rank's rows in request order except pure prefill chunks (first position 0 of
    the sequence) moved last, stably."""
    pp, two_p = batch.pcp_size, 2 * batch.pcp_size
    out: list[list[tuple[bool, int, int, bool, bool]]] = [[] for _ in range(pp)]
    start = 0
    for request in batch.requests:
        q = request.num_tokens
        if q < 0:
            raise ValueError("a request has a negative num_tokens")
        if q == 0:
            continue
        for r in range(pp):
            if not request.prefilling:
                out[r].append((False, start, q, r == 0, True))
            else:
                out[r] += [(request.context_len + lo == 0, start + lo, n, True, False)
                           for lo, n in _split_chunks(q, two_p, r)]
        start += q
    return out


def hidden_restore_index(lay: Layout, num_tokens: int) -> np.ndarray:
    """(N,) position of each global token's written copy in the padded gathered rows (the
    manager's hidden restore index: global = gathered[restore])."""
    assert lay.gidx is not None and lay.wmask is not None  # expanded layouts only: drafts have none
    restore = np.zeros(num_tokens, dtype=_I64)
    written = np.flatnonzero(lay.wmask)
    restore[lay.gidx[written]] = written
    return restore


def replicated_requests(batch: Batch, era: str = ERA_CURRENT) -> list[bool]:
    """Per request: every rank gets the whole query (decodes; D > 1 and 0.30 on, short prefills)."""
    two_p = 2 * batch.pcp_size
    out = []
    for request in batch.requests:
        q = request.num_tokens
        short = (two_p - 1) * -(-q // two_p) >= q
        out.append(not request.prefilling
                   or (era == ERA_CURRENT and dcp_size(batch) > 1 and short))
    return out


def _draft_layout(batch: Batch, slots) -> Layout:
    """Replicated speculative step: every rank the same rows in batch order, unexpanded map."""
    if any(r.prefilling for r in batch.requests):
        raise ValueError("draft regimes hold decodes only (a request is prefilling)")
    if dcp_size(batch) != 1:
        raise ValueError("draft regimes run with D = 1")
    if batch.dp_pad < 0:
        raise ValueError("dp_pad must be >= 0")
    pp = batch.pcp_size
    n = sum(r.num_tokens for r in batch.requests)
    rows = n + batch.dp_pad
    nd: int | None  # draft-mixed: the batch's, None refused below
    if batch.regime == DRAFT:
        nd = n
    else:
        assert batch.regime == DRAFT_MIXED
        nd = batch.num_decode_tokens
        if nd is None or not 0 <= nd < n:
            raise ValueError(f"draft-mixed needs 0 <= num_decode_tokens < {n}, got {nd}")
    s = all_global_slots(batch, slots)[0]
    if batch.pad_slot_map:
        s = np.concatenate((s, np.full(rows - n, PAD_SLOT_ID, dtype=_I64)))
    base = np.arange(rows, dtype=_I64)
    labels = -1 - (np.arange(pp, dtype=_I64)[:, None] * rows + base)  # pad_label(r, j, L)
    labels[:, :n] = base[:n]
    return Layout(
        width=rows,
        num_rows=rows,
        counts=np.full(pp, n, dtype=_I64),
        gidx=None,
        wmask=None,
        tokens=labels,
        slot_maps=[s.copy() for _ in range(pp)],
        num_decode_tokens=[nd] * pp,
        shard=False,
    )
