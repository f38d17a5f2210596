"""Zoo: bug class 5, tensor rows L differing from the rank stride W of the expanded map.

The gather pads every tensor to a multiple of 4 rows before the all_gather (an alignment step
added after the map was built), but keeps reading the map with that padded stride: every rank
block after the first shifts against its slots.

Lines that differ from correct.py: branch B pads the tensors and slices the map by the padded
row count.
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
        padded = -(-num_rows // 4) * 4  # BUG: rows padded after the map was built with stride L
        grown = tuple(torch.cat([t, t.new_zeros((padded - num_rows, *t.shape[1:]))]) for t in tensors)
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in grown)
        slots = torch.cat([slot_mapping, slot_mapping.new_full((world * (padded - num_rows),), -1)])
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
        slots = torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])
    return rows, slots
