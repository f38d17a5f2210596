"""Hostile target: rank 1's process dies in the call (a segfault or abort in a kernel).

Rank 1 calls os._exit(3) while its peers wait in the all_gather. pcpcheck must report
COLLECTIVE (rank 1 died), tear the ranks down and start fresh ones for the next case.
"""

import os

from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    if pcp_group.rank_in_group == 1:
        print("rank 1: simulated crash", flush=True, file=__import__("sys").stderr)
        os._exit(3)  # BUG: the process dies
    rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
    return rows, slot_mapping[: pcp_group.world_size * tensors[0].shape[0]]
