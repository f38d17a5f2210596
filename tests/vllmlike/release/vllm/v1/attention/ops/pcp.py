"""vllmlike fixture: a release's gather file (pcpcheck's own code, vLLM-style, not vLLM's).

The gather is the zoo's correct one (docs/semantics.md section 5); the MLA and indexer wrappers take
the shard flag as `pcp_shard_decode_requests`, as vLLM 0.32-0.33 name it. The MLA wrapper
flattens k_pe with an explicit width, so zero local rows work (bug class 9 is its absence).
"""

import math

from tests.zoo.correct import _gather_prefill_cache_inputs


def maybe_gather_mla_latent_cache_inputs(kv_c_normed, k_pe, slot_mapping, num_decode_tokens,
                                         use_pcp, pcp_shard_decode_requests=False):
    if not use_pcp or num_decode_tokens is None:
        return kv_c_normed, k_pe, slot_mapping
    k_pe_flat = k_pe.reshape(k_pe.shape[0], math.prod(k_pe.shape[1:]))
    (kv_c, k_pe_out), slots = _gather_prefill_cache_inputs(
        (kv_c_normed, k_pe_flat), slot_mapping, num_decode_tokens, pcp_shard_decode_requests)
    return kv_c, k_pe_out.reshape(k_pe_out.shape[0], *k_pe.shape[1:]), slots


def maybe_gather_indexer_k(k, slot_mapping, num_decode_tokens, use_pcp,
                           pcp_shard_decode_requests=False):
    if not use_pcp:
        return k, slot_mapping
    (k_out,), slots = _gather_prefill_cache_inputs((k,), slot_mapping, num_decode_tokens,
                                                   pcp_shard_decode_requests)
    return k_out, slots
