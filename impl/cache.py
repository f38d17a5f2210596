"""``write_kv_cache``: the cache-write kernel rule (docs/semantics.md section 4) as a torch op."""

from __future__ import annotations

import torch

__all__ = ["write_kv_cache"]

# Same-size integer dtype per itemsize: writing through it copies bits exactly (fp8, NaN payloads).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    dtype = _BITS.get(t.element_size())
    return t if dtype is None or dtype == t.dtype else t.view(dtype)


def write_kv_cache(kv_cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``rows[k]`` to slot ``slot_mapping[k]`` of ``kv_cache`` (num_blocks, B, *row_shape).

    One write per entry of slot_mapping; ``slot < 0`` is skipped; block ``slot // B``, offset
    ``slot % B``; rows beyond ``len(slot_mapping)`` are ignored. In place. Two equal non-negative
    slots are a write race in the kernel; here the winner is unspecified.
    """
    for name, t in (("kv_cache", kv_cache), ("rows", rows), ("slot_mapping", slot_mapping)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if kv_cache.dim() < 2:
        raise ValueError(
            f"kv_cache must have shape (num_blocks, block_size, ...), got {tuple(kv_cache.shape)}"
        )
    if slot_mapping.dim() != 1:
        raise ValueError(f"slot_mapping must be 1-D, got shape {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype.is_floating_point or slot_mapping.dtype.is_complex or slot_mapping.dtype == torch.bool:
        raise TypeError(f"slot_mapping must have an integer dtype, got {slot_mapping.dtype}")
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    row_shape = tuple(kv_cache.shape[2:])
    num_slots = slot_mapping.shape[0]
    if rows.dim() == 0 or rows.shape[0] < num_slots:
        raise ValueError(
            f"fewer rows than slots: rows has shape {tuple(rows.shape)}, slot_mapping has "
            f"{num_slots} entries (the kernel would read out of bounds)"
        )
    if tuple(rows.shape[1:]) != row_shape:
        raise ValueError(
            f"trailing shape mismatch: rows {tuple(rows.shape[1:])} vs cache rows {row_shape}"
        )
    if rows.dtype != kv_cache.dtype:
        raise ValueError(f"dtype mismatch: rows {rows.dtype} vs kv_cache {kv_cache.dtype}")

    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0  # the kernel's test: PAD_SLOT_ID (-1) and every negative slot are skipped
    slots = slots[keep]
    capacity = num_blocks * block_size
    if slots.numel() and int(slots.max()) >= capacity:
        raise ValueError(
            f"slot {int(slots.max())} out of range: the cache holds {capacity} slots "
            f"({num_blocks} blocks of {block_size})"
        )
    values = rows[:num_slots][keep.to(rows.device)].to(kv_cache.device).contiguous()
    slots = slots.to(kv_cache.device)
    # Index the two leading dims directly: works on any strides, no flattening copy.
    _bits(kv_cache).index_put_((slots // block_size, slots % block_size), _bits(values))
