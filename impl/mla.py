"""MLA wrapper around the gather: ``(kv_c_normed, k_pe)`` with k_pe flattened for the gather."""

from __future__ import annotations

import math
from typing import Any

import torch

from .gather import gather_prefill_cache_inputs

__all__ = ["gather_mla_cache_inputs"]


def gather_mla_cache_inputs(
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_decode_tokens: int | None,
    shard_decode_requests: bool,
    *,
    use_pcp: bool = True,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather MLA cache inputs; unchanged when ``use_pcp`` is false or ``num_decode_tokens`` is
    None (profile / dummy runs).

    k_pe is flattened to ``(L, prod(trailing))`` with the width computed explicitly, so zero
    local rows work (``reshape(L, -1)`` cannot infer -1 when L = 0: bug class 9), and its
    trailing shape is restored after the gather.
    """
    if not use_pcp or num_decode_tokens is None:
        return kv_c_normed, k_pe, slot_mapping
    if not isinstance(k_pe, torch.Tensor):
        raise TypeError(f"k_pe must be a torch.Tensor, got {type(k_pe).__name__}")
    if k_pe.dim() == 0:
        raise ValueError("k_pe is 0-dimensional: it has no rows (dim 0) to gather")
    num_rows, trailing = k_pe.shape[0], tuple(k_pe.shape[1:])
    k_pe_flat = k_pe.reshape(num_rows, math.prod(trailing))
    (kv_out, k_pe_out), slots_out = gather_prefill_cache_inputs(
        (kv_c_normed, k_pe_flat),
        slot_mapping,
        num_decode_tokens,
        shard_decode_requests,
        group=group,
    )
    return kv_out, k_pe_out.reshape(k_pe_out.shape[0], *trailing), slots_out
