"""Hostile target: correct outputs, but it zeroes the caller's first tensor in place."""

from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    num_rows, num_slots = tensors[0].shape[0], slot_mapping.shape[0]
    if num_slots <= num_rows:
        return tuple(t[:num_slots] for t in tensors), slot_mapping[:num_slots]
    rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
    slots = slot_mapping[: pcp_group.world_size * num_rows]
    tensors[0].zero_()  # BUG: scribbles over the caller's rows after gathering them
    return rows, slots
