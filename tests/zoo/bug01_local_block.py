"""Zoo: bug class 1, local decode rows paired with the local rank's block of the expanded map.

In the mixed branch E, the local decode rows T[:nd] are paired with `blocks[rank, :nd]` (this
rank's block) instead of rank 0's `s[:nd]`. Replicated decode copies are masked (-1) on every
rank but 0, so ranks 1..P-1 never write the decode KV (vllm-ascend #6346).

Lines that differ from correct.py: branch E, the `slots = torch.cat([...])` line now starts
from `blocks[rank, :nd]` (plus `rank = pcp_group.rank_in_group`).

Expected first report: REPLICA. Rank r>0 pairs its decode rows with -1: nothing written, no
duplicate, no padding row paired, no mispairing; its cache just lacks the decodes. (In dcp the
same bug is a SHARD violation: the decode owned by DCP rank r>0 is written by no rank.)
Wrong in replicated and dcp (branch E); sharded uses B, drafts use A.
"""

import torch
from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    world = pcp_group.world_size
    num_rows = tensors[0].shape[0]
    num_slots = slot_mapping.shape[0]
    nd = num_decode_tokens
    if num_slots <= num_rows:  # A: unexpanded map, every real row written
        rows = tuple(t[:num_slots] for t in tensors)
        slots = slot_mapping[:num_slots]
    elif shard_decode_requests:  # B: sharded decodes, every rank's rows gathered
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        slots = slot_mapping[: world * num_rows]
    elif nd == num_rows:  # C: all decode, replicated: local rows, rank 0's block
        rows = tuple(tensors)
        slots = slot_mapping[:num_rows]
    elif nd == 0:  # D: no decode: every rank's rows gathered
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        slots = slot_mapping[: world * num_rows]
    else:  # E: mixed: local decode rows with rank 0's decode slots, prefill rows gathered
        prefill = tuple(pcp_group.all_gather(t[nd:].contiguous(), dim=0) for t in tensors)
        rows = tuple(torch.cat([t[:nd], g], dim=0) for t, g in zip(tensors, prefill))
        blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)
        rank = pcp_group.rank_in_group
        # BUG (class 1): local decode rows paired with the local rank's block, not rank 0's
        slots = torch.cat([blocks[rank, :nd], blocks[:, nd:].reshape(-1)])
    return rows, slots
