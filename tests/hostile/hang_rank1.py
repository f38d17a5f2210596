"""Hostile target: rank 1 sleeps (a hung kernel or a deadlock outside pcpcheck's collectives).

On every call rank 1 sleeps for HANG_SECONDS (env PCPCHECK_HANG_SECONDS, default 600) before
anything else; the other ranks wait in the all_gather. pcpcheck must give up after --timeout,
report COLLECTIVE (rank 1 did not return) and kill the ranks it started.
"""

import os
import time

from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    if pcp_group.rank_in_group == 1:
        time.sleep(float(os.environ.get("PCPCHECK_HANG_SECONDS", "600")))  # BUG: never returns
    rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
    return rows, slot_mapping[: pcp_group.world_size * tensors[0].shape[0]]
