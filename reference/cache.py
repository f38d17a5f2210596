"""The cache-write kernel rule (docs/semantics.md section 4) and the caches a step must produce."""

from __future__ import annotations

import numpy as np

from pcpcheck_spec.names import Batch

from .layout import all_global_slots, dcp_size


def write_cache(cache: np.ndarray, rows, slots) -> None:
    """Write rows into cache (num_blocks, B, *row_shape) in place, one write per entry of slots.

    Row k goes to block slots[k] // B, offset slots[k] % B; slot < 0 is skipped (0 is real); rows
    past len(slots) are ignored; fewer rows than slots raises ValueError (an out-of-bounds read).
    Bit-exact: rows must have the cache's dtype and row shape. Two equal non-negative slots are a
    write race in the kernel; here one of them wins, unspecified which.
    """
    rows = np.asarray(rows)
    slots = np.asarray(slots)
    if slots.ndim != 1:
        raise ValueError("slot mapping must be 1-D")
    if slots.size and slots.dtype.kind not in "iu":
        raise ValueError(f"slot mapping must be integer, got {slots.dtype}")
    if cache.ndim < 2:
        raise ValueError("cache must be (num_blocks, block_size, *row_shape)")
    if rows.ndim < 1 or rows.shape[0] < slots.shape[0]:
        raise ValueError(
            f"fewer rows ({rows.shape[0] if rows.ndim else 0}) than slots ({slots.shape[0]}): "
            "the kernel would read past the inputs"
        )
    if rows.shape[1:] != cache.shape[2:]:
        raise ValueError(f"row shape {rows.shape[1:]} differs from cache row shape {cache.shape[2:]}")
    if rows.dtype != cache.dtype:
        raise ValueError(f"rows dtype {rows.dtype} differs from cache dtype {cache.dtype}")
    keep = slots >= 0
    sel = slots[keep].astype(np.int64, copy=False)
    bs = cache.shape[1]
    if sel.size and sel.max() >= cache.shape[0] * bs:
        raise ValueError(f"slot {int(sel.max())} beyond the cache ({cache.shape[0]} x {bs})")
    cache[sel // bs, sel % bs] = rows[: slots.shape[0]][keep]


def expected_caches(batch: Batch, slots=None) -> list:
    """Per PCP rank: (slots, tokens), int64, sorted by slot, that the rank's cache must hold.

    D = 1: every real token at its slot, on every rank. D > 1: rank r holds exactly the tokens DCP
    rank r owns. slots: optional override as in reference.layout.
    """
    owned = []
    for s in all_global_slots(batch, slots):
        tokens = np.flatnonzero(s >= 0).astype(np.int64)
        order = np.argsort(s[tokens], kind="stable")
        owned.append((s[tokens][order], tokens[order]))
    if dcp_size(batch) > 1:
        return owned
    return [owned[0]] + [(s.copy(), t.copy()) for s, t in owned * (batch.pcp_size - 1)]
