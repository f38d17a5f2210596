"""Hostile target: calls sys.exit on rank 1 (a library that bails out)."""

import sys

from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    if get_pcp_group().rank_in_group == 1:
        sys.exit(3)
    return tuple(tensors), slot_mapping[: tensors[0].shape[0]]
