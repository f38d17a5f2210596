"""vllmlike fixture: the MLA layer's call of its wrapper (pcpcheck's own code, vLLM-style, not
vLLM's), as semantics section 11 describes it: pcpcheck reads how the layer calls the wrapper
from this file and never runs it."""

from vllm.v1.attention.ops.pcp import maybe_gather_mla_latent_cache_inputs


class MLAAttention:
    def __init__(self, parallel_config):
        self.use_pcp = parallel_config.prefill_context_parallel_size > 1
        self.pcp_shard_decode_requests = parallel_config.pcp_shard_decode_requests

    def update_kv_cache(self, kv_c_normed, k_pe, slot_mapping, attn_metadata):
        return maybe_gather_mla_latent_cache_inputs(
            kv_c_normed, k_pe, slot_mapping, attn_metadata.num_decode_tokens, self.use_pcp,
            pcp_shard_decode_requests=self.pcp_shard_decode_requests)
