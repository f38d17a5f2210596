"""Hostile target: returns the rows flattened to 1-D (a reshape gone wrong)."""


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(t.reshape(-1) for t in tensors), slot_mapping
