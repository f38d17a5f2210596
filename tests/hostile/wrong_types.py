"""Hostile target: returns a list of Python lists instead of (tensors, slot_mapping)."""


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return [t.tolist() for t in tensors]
