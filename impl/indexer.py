"""Sparse-indexer wrapper around the gather: ``(k,)``, truncated first (pcp-semantics s. 5)."""

from __future__ import annotations

from typing import Any

import torch

from .gather import _check_world_size, _gather, check_slot_mapping, check_tensor
from .parallel_state import as_group, get_pcp_group

__all__ = ["gather_indexer_cache_inputs"]


def gather_indexer_cache_inputs(
    k: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_decode_tokens: int,
    shard_decode_requests: bool,
    *,
    group: Any = None,
    check_nd_agreement: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncate ``k`` to ``S // P`` rows when ``S > rows`` (else to ``S`` rows), then gather."""
    check_tensor("k", k)
    check_slot_mapping(slot_mapping)
    num_slots = slot_mapping.shape[0]
    if num_slots > k.shape[0]:
        group = get_pcp_group() if group is None else as_group(group)
        k = k[: num_slots // _check_world_size(group.world_size)]
    else:
        k = k[:num_slots]
    (k_out,), slots_out = _gather(
        (k,), slot_mapping, num_decode_tokens, shard_decode_requests, group, check_nd_agreement,
        names=("k",),
    )
    return k_out, slots_out
