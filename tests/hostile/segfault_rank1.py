"""Hostile target: rank 1's process is killed by SIGSEGV in the call (a bad pointer in a kernel),
before its collective; its peers wait for it. COLLECTIVE naming rank 1, nothing left behind."""

import os
import signal

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    group = get_pcp_group()
    if group.rank_in_group == 1:
        os.kill(os.getpid(), signal.SIGSEGV)  # BUG: the process crashes
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=group)
