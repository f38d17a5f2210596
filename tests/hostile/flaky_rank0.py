"""Hostile target: a correct gather except that rank 0 drops its slots on every other call.

Which calls fail depends on how many calls came before, not on the case: the call count lives in
the file named by PCPCHECK_FLAKY_COUNTER (shared by every process, so it counts the same on
threads and on processes); without it, a call fails at random (one in two, os.urandom). Rank 0
writes nothing into its cache on a failing call: REPLICA on rank 0, which no replay of the same
case reproduces reliably. pcpcheck must report it as flaky, with how many replays showed it.
"""

import os

import torch
from vllm.distributed.parallel_state import get_pcp_group


def _failing_call() -> bool:
    path = os.environ.get("PCPCHECK_FLAKY_COUNTER")
    if not path:
        return os.urandom(1)[0] < 128
    with open(path, "a+") as handle:
        handle.seek(0)
        count = len(handle.read()) + 1
        handle.write(".")
    return count % 2 == 1


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    world = pcp_group.world_size
    num_rows, num_slots = tensors[0].shape[0], slot_mapping.shape[0]
    nd = num_decode_tokens
    if num_slots <= num_rows:  # as tests/zoo/correct.py, branch by branch
        rows, slots = tuple(t[:num_slots] for t in tensors), slot_mapping[:num_slots]
    elif shard_decode_requests or nd == 0:
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        slots = slot_mapping[: world * num_rows]
    elif nd == num_rows:
        rows, slots = tuple(tensors), slot_mapping[:num_rows]
    else:
        prefill = tuple(pcp_group.all_gather(t[nd:].contiguous(), dim=0) for t in tensors)
        rows = tuple(torch.cat([t[:nd], g], dim=0) for t, g in zip(tensors, prefill))
        blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)
        slots = torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])
    if pcp_group.rank_in_group == 0 and _failing_call():
        slots = slots.clone().fill_(-1)  # BUG, now and then: rank 0 writes nothing
    return rows, slots
