"""Hostile target: the bundled, correct gather, except that rank 1 recurses without end with the
recursion limit lifted, so its interpreter overflows the C stack and aborts (a crash, no exception).

A rank that dies gets COLLECTIVE naming rank 1, exit code 1: the checker itself never crashes.
"""

import sys

from impl import gather_prefill_cache_inputs
from vllm.distributed.parallel_state import get_pcp_group


def _descend(depth):
    return _descend(depth + 1) + 1


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    group = get_pcp_group()
    if group.rank_in_group == 1:
        sys.setrecursionlimit(10**8)
        _descend(0)  # BUG: the stack overflows
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=group)
