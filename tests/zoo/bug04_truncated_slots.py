"""Zoo: bug class 4, slot map truncated to the local row count after the gather.

After the full gather (branches B and D) the slot map is cut to `s[:L]` (the local row count)
instead of `s[:P*L]` (vllm-ascend #16775). Rows P*L >= slots L is allowed by the kernel's weak
length rule, so the call looks well formed: the first L gathered rows (rank 0's) are written with
rank 0's block, and every other rank's rows are silently dropped.

Lines that differ from correct.py: `slots = slot_mapping[:num_rows]` in branches B and D
(correct: `[: world * num_rows]`).

Expected first report: REPLICA (no earlier invariant fails: rows >= slots, rank 0's rows pair with
rank 0's slots); in dcp it is SHARD. Wrong in sharded (B), replicated and dcp (D: no-decode steps).
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
        slots = slot_mapping[:num_rows]  # BUG (class 4): truncated to the local row count
    elif nd == num_rows:  # C: all decode, replicated: local rows, rank 0's block
        rows = tuple(tensors)
        slots = slot_mapping[:num_rows]
    elif nd == 0:  # D: no decode: every rank's rows gathered
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        slots = slot_mapping[:num_rows]  # BUG (class 4): truncated to the local row count
    else:  # E: mixed: local decode rows with rank 0's decode slots, prefill rows gathered
        prefill = tuple(pcp_group.all_gather(t[nd:].contiguous(), dim=0) for t in tensors)
        rows = tuple(torch.cat([t[:nd], g], dim=0) for t, g in zip(tensors, prefill))
        blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)
        slots = torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])
    return rows, slots
