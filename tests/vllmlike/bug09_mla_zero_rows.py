"""vllmlike bug class 9 (a release's gather file): the MLA wrapper flattens k_pe with
`reshape(num_tokens, -1)`, which torch cannot infer when the rank has zero rows. Drawn with empty
steps (`--empty-steps`), every rank crashes: RETURNS.

Differs from release/.../ops/pcp.py in the MLA wrapper's flattening only.
"""

from tests.vllmlike.release.vllm.v1.attention.ops.pcp import (  # noqa: F401 - the release file
    _gather_prefill_cache_inputs,
    maybe_gather_indexer_k,
)


def maybe_gather_mla_latent_cache_inputs(kv_c_normed, k_pe, slot_mapping, num_decode_tokens,
                                         use_pcp, pcp_shard_decode_requests=False):
    if not use_pcp or num_decode_tokens is None:
        return kv_c_normed, k_pe, slot_mapping
    k_pe_flat = k_pe.reshape(kv_c_normed.shape[0], -1)  # BUG: -1 is ambiguous with no rows
    (kv_c, k_pe_out), slots = _gather_prefill_cache_inputs(
        (kv_c_normed, k_pe_flat), slot_mapping, num_decode_tokens, pcp_shard_decode_requests)
    return kv_c, k_pe_out.view(-1, *k_pe.shape[1:]), slots
