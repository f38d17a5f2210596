"""Hostile target: returns the local rows with the whole expanded map: fewer rows than slots
(the cache-write kernel would read past the rows)."""


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(tensors), slot_mapping
