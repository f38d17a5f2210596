"""vllmlike fixture: the sparse indexer's call of its wrapper (pcpcheck's own code, vLLM-style,
not vLLM's), read by pcpcheck and never run."""

from vllm.v1.attention.ops.pcp import maybe_gather_indexer_k


class SparseAttnIndexer:
    def __init__(self, parallel_config):
        self.use_pcp = parallel_config.prefill_context_parallel_size > 1
        self.pcp_shard_decode_requests = parallel_config.pcp_shard_decode_requests

    def insert(self, k, slot_mapping, num_decode_tokens):
        return maybe_gather_indexer_k(k, slot_mapping, num_decode_tokens, self.use_pcp,
                                      pcp_shard_decode_requests=self.pcp_shard_decode_requests)
