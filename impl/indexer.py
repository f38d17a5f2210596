"""Sparse-indexer wrapper around the gather: ``(k,)``, truncated first (pcp-semantics s. 5)."""

from __future__ import annotations

from typing import Any

import torch

from .gather import gather_prefill_cache_inputs
from .parallel_state import as_group, get_pcp_group

__all__ = ["gather_indexer_cache_inputs"]


def gather_indexer_cache_inputs(
    k: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_decode_tokens: int,
    shard_decode_requests: bool,
    *,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncate ``k`` to ``S // P`` rows when ``S > rows`` (else to ``S`` rows), then gather."""
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a torch.Tensor, got {type(k).__name__}")
    if k.dim() == 0:
        raise ValueError("k is 0-dimensional: it has no rows (dim 0) to gather")
    if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dim() != 1:
        raise TypeError("slot_mapping must be a 1-D integer torch.Tensor")
    num_slots = slot_mapping.shape[0]
    if num_slots > k.shape[0]:
        group = get_pcp_group() if group is None else as_group(group)
        k = k[: num_slots // group.world_size]
    else:
        k = k[:num_slots]
    (k_out,), slots_out = gather_prefill_cache_inputs(
        (k,), slot_mapping, num_decode_tokens, shard_decode_requests, group=group
    )
    return k_out, slots_out
