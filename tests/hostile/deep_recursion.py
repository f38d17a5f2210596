"""Hostile target: the bundled, correct gather, except that rank 1 recurses without end with the
recursion limit lifted, through a C call at every level, so its interpreter overflows the C stack
within a fraction of a second and dies (SIGSEGV: a crash, no exception, little memory).

A rank that dies gets COLLECTIVE naming rank 1, exit code 1: the checker itself never crashes.
"""

import sys

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs


def _descend(depth):
    return list(map(_descend, [depth + 1]))  # through C (map): every level takes C stack


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    group = get_pcp_group()
    if group.rank_in_group == 1:
        sys.setrecursionlimit(10**8)
        _descend(0)  # BUG: the stack overflows
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=group)
