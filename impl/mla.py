"""MLA wrapper around the gather: ``(kv_c_normed, k_pe)`` with k_pe flattened for the gather.

Signature and defaults of vLLM 0.33.0's ``maybe_gather_mla_latent_cache_inputs``: positional
``(kv_c_normed, k_pe, slot_mapping, num_decode_tokens, use_pcp, pcp_shard_decode_requests=False)``,
so vLLM's call sites work unchanged; keyword-only extras after them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from pcpcheck_impl.gather import check_flag, check_tensor, gather_named, resolve_shard_flag

__all__ = ["gather_mla_cache_inputs"]


def gather_mla_cache_inputs(
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    slot_mapping: torch.Tensor | None,
    num_decode_tokens: int | None,
    use_pcp: bool,
    pcp_shard_decode_requests: bool = False,
    *,
    shard_decode_requests: bool | None = None,
    group: Any = None,
    check_nd_agreement: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gather MLA cache inputs; unchanged (the same objects, unchecked) when ``use_pcp`` is false
    or ``num_decode_tokens`` is None (profile / dummy runs).

    ``pcp_shard_decode_requests`` is vLLM 0.33.0's name of the gather's ``shard_decode_requests``;
    the older keyword ``shard_decode_requests=`` is accepted too (give one, not both).
    k_pe is flattened to ``(L, prod(trailing))`` with the width computed explicitly, so zero
    local rows work (vLLM's ``reshape(L, -1)`` cannot infer -1 when L = 0: bug class 9), and its
    trailing shape is restored after the gather: returns ``(kv (N, ...), k_pe (N, *k_pe.shape[1:]),
    slots)``. Inputs are checked by the gather's validation (messages name ``kv_c_normed`` and
    ``k_pe``).
    """
    shard = resolve_shard_flag(pcp_shard_decode_requests, shard_decode_requests)
    if not check_flag("use_pcp", use_pcp) or num_decode_tokens is None:
        return kv_c_normed, k_pe, slot_mapping
    check_tensor("k_pe", k_pe)
    num_rows, trailing = k_pe.shape[0], tuple(k_pe.shape[1:])
    k_pe_flat = k_pe.reshape(num_rows, math.prod(trailing))
    (kv_out, k_pe_out), slots_out = gather_named(
        (kv_c_normed, k_pe_flat),
        slot_mapping,
        num_decode_tokens,
        shard,
        group,
        check_nd_agreement,
        names=("kv_c_normed", "k_pe"),
    )
    return kv_out, k_pe_out.reshape(k_pe_out.shape[0], *trailing), slots_out
