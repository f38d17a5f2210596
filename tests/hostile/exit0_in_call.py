"""Hostile target: the bundled, correct gather, except that rank 1's process ends with exit code 0
in the call, before its collective; its peers wait for it.

A rank that never returns gets COLLECTIVE naming rank 1 (and exit code 1), not a silent exit 0.
"""

import os

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    group = get_pcp_group()
    if group.rank_in_group == 1:
        os._exit(0)  # BUG: the process ends "successfully" mid-step
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=group)
