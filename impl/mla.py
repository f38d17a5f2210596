"""MLA wrapper around the gather: ``(kv_c_normed, k_pe)`` with k_pe flattened for the gather."""

from __future__ import annotations

import math
from typing import Any

import torch

from .gather import _gather, check_tensor

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
    check_nd_agreement: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather MLA cache inputs; unchanged when ``use_pcp`` is false or ``num_decode_tokens`` is
    None (profile / dummy runs).

    k_pe is flattened to ``(L, prod(trailing))`` with the width computed explicitly, so zero
    local rows work (``reshape(L, -1)`` cannot infer -1 when L = 0: bug class 9), and its
    trailing shape is restored after the gather. Inputs are checked by the gather's validation
    (messages name ``kv_c_normed`` and ``k_pe``).
    """
    if not use_pcp or num_decode_tokens is None:
        return kv_c_normed, k_pe, slot_mapping
    check_tensor("k_pe", k_pe)
    num_rows, trailing = k_pe.shape[0], tuple(k_pe.shape[1:])
    k_pe_flat = k_pe.reshape(num_rows, math.prod(trailing))
    (kv_out, k_pe_out), slots_out = _gather(
        (kv_c_normed, k_pe_flat),
        slot_mapping,
        num_decode_tokens,
        shard_decode_requests,
        group,
        check_nd_agreement,
        names=("kv_c_normed", "k_pe"),
    )
    return kv_out, k_pe_out.reshape(k_pe_out.shape[0], *trailing), slots_out
