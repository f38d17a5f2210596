"""Hostile target: rank 0 raises before any collective; its peers wait for it."""

from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    if pcp_group.rank_in_group == 0:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
    return rows, slot_mapping[: pcp_group.world_size * tensors[0].shape[0]]
