"""Sparse-indexer wrapper around the gather: ``(k,)``, truncated first.

The wrapper and its truncation: docs/semantics.md section 5.

Signature and defaults of vLLM 0.33.0's ``maybe_gather_indexer_k``: positional
``(k, slot_mapping, num_decode_tokens, use_pcp, pcp_shard_decode_requests=False)``; keyword-only
extras after them.
"""

from __future__ import annotations

from typing import Any

import torch

from pcpcheck_impl.gather import (
    check_flag,
    check_slot_mapping,
    check_tensor,
    check_world_size,
    gather_named,
    resolve_shard_flag,
)
from pcpcheck_impl.parallel_state import as_group, get_pcp_group

__all__ = ["gather_indexer_cache_inputs"]


def gather_indexer_cache_inputs(
    k: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_decode_tokens: int,
    use_pcp: bool,
    pcp_shard_decode_requests: bool = False,
    *,
    shard_decode_requests: bool | None = None,
    group: Any = None,
    check_nd_agreement: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, slot_mapping)`` unchanged when ``use_pcp`` is false; else truncate ``k`` to
    ``S // P`` rows when ``S > rows`` (else to ``S`` rows), then gather.

    The truncation is vLLM's caller's (the sparse indexer cuts ``k`` before calling its wrapper);
    it is idempotent, so a ``k`` that vLLM's caller already cut passes unchanged.
    ``pcp_shard_decode_requests`` is vLLM 0.33.0's name of the gather's ``shard_decode_requests``;
    the older keyword ``shard_decode_requests=`` is accepted too (give one, not both).
    """
    shard = resolve_shard_flag(pcp_shard_decode_requests, shard_decode_requests)
    if not check_flag("use_pcp", use_pcp):
        return k, slot_mapping
    check_tensor("k", k)
    check_slot_mapping(slot_mapping)
    num_slots = slot_mapping.shape[0]
    if num_slots > k.shape[0]:
        group = get_pcp_group() if group is None else as_group(group)
        k = k[: num_slots // check_world_size(group.world_size)]
    else:
        k = k[:num_slots]
    (k_out,), slots_out = gather_named(
        (k,), slot_mapping, num_decode_tokens, shard, group, check_nd_agreement, names=("k",),
    )
    return k_out, slots_out
