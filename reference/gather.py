"""The gather's five branches (docs/semantics.md section 5), modelled over all ranks at once.

Rows are copied bit-exactly (slicing and concatenation only, never arithmetic on values), so any
dtype and trailing shape works: float16/32, int8, uint8 views of bf16/fp8 bytes, ...
"""

from __future__ import annotations

import numpy as np

from pcpcheck_spec.names import (
    BRANCH_ALL_DECODE,
    BRANCH_MIXED,
    BRANCH_NO_DECODE,
    BRANCH_SHARDED,
    BRANCH_UNEXPANDED,
)


def branch(num_rows: int, num_slots: int, nd: int, shard: bool) -> str:
    """Branch letter taken by a rank with L rows, S slots, nd decode tokens (table order)."""
    if not 0 <= nd <= num_rows:
        raise ValueError(f"num_decode_tokens {nd} outside 0..{num_rows} (rows)")
    if num_slots <= num_rows:
        return BRANCH_UNEXPANDED
    if shard:
        return BRANCH_SHARDED
    if nd == num_rows:
        return BRANCH_ALL_DECODE
    if nd == 0:
        return BRANCH_NO_DECODE
    return BRANCH_MIXED


def _rank_inputs(tensors, slot_map, rank):
    ts = tuple(np.asarray(t) for t in tensors)
    if not ts:
        raise ValueError(f"rank {rank}: no tensors")
    if any(t.ndim == 0 for t in ts):
        raise ValueError(f"rank {rank}: a tensor has no leading dimension")
    rows = ts[0].shape[0]
    if any(t.shape[0] != rows for t in ts):
        raise ValueError(f"rank {rank}: tensors disagree on the leading dimension")
    s = np.asarray(slot_map)
    if s.ndim != 1:
        raise ValueError(f"rank {rank}: slot mapping must be 1-D")
    return ts, s, rows


def gather(tensors_per_rank, slot_maps, nds, shard: bool) -> list:
    """Every rank's (tensors out, slots out) for one call of the gather on P ranks.

    tensors_per_rank[r]: rank r's tuple of arrays sharing a leading dimension L_r;
    slot_maps[r]: rank r's slot mapping; nds[r]: its num_decode_tokens; shard: the
    shard_decode_requests flag. Branch A returns the spec's answer T[:S], s[:S] (upstream keeps
    [:nd]: bug class 10). A collective that ranks would not all issue with equal shapes and dtypes
    (a hang or crash in a real run) raises ValueError.
    """
    pp = len(tensors_per_rank)
    if len(slot_maps) != pp or len(nds) != pp:
        raise ValueError("tensors_per_rank, slot_maps and nds must have one entry per rank")
    inputs = [_rank_inputs(tensors_per_rank[r], slot_maps[r], r) for r in range(pp)]
    letters = [branch(inputs[r][2], inputs[r][1].shape[0], int(nds[r]), shard) for r in range(pp)]

    # What each rank contributes to the all_gather (None: it issues no collective).
    contrib = []
    for r, (ts, _, _) in enumerate(inputs):
        if letters[r] in (BRANCH_SHARDED, BRANCH_NO_DECODE):
            contrib.append(ts)
        elif letters[r] == BRANCH_MIXED:
            nd = int(nds[r])
            contrib.append(tuple(t[nd:] for t in ts))
        else:
            contrib.append(None)
    if any(c is not None for c in contrib):
        sigs = [None if c is None else tuple((t.shape, t.dtype) for t in c) for c in contrib]
        if any(sig != sigs[0] for sig in sigs):
            raise ValueError(
                f"collective disagreement: branches {letters}, all_gather inputs {sigs}"
            )
        gathered = tuple(
            np.concatenate([contrib[q][i] for q in range(pp)], axis=0)
            for i in range(len(contrib[0]))
        )

    out = []
    for r, (ts, s, rows) in enumerate(inputs):
        letter = letters[r]
        nslots = s.shape[0]
        if letter == BRANCH_UNEXPANDED:
            res = (tuple(t[:nslots].copy() for t in ts), s[:nslots].copy())
        elif letter in (BRANCH_SHARDED, BRANCH_NO_DECODE):
            res = (tuple(g.copy() for g in gathered), s[: pp * rows].copy())
        elif letter == BRANCH_ALL_DECODE:
            res = (tuple(t.copy() for t in ts), s[:rows].copy())
        else:  # BRANCH_MIXED
            nd = int(nds[r])
            tensors = tuple(
                np.concatenate((t[:nd], g), axis=0) for t, g in zip(ts, gathered)
            )
            tail = (np.arange(pp)[:, None] * rows + np.arange(nd, rows)).ravel()
            idx = np.concatenate((np.arange(nd), tail))
            res = (tensors, s[idx[idx < nslots]])  # slicing past S truncates, as in torch
        out.append(res)
    return out
