"""Hostile target: rank 1 never joins the all_gather its peers wait in (branches B, D, E).

A vLLM-style `_gather_prefill_cache_inputs` (correct.py) except that rank 1 returns its local
rows instead of gathering. On real ranks its peers would wait forever: pcpcheck must end the case
with a COLLECTIVE verdict (never hang) and leave no process behind.
"""

import torch
from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    world = pcp_group.world_size
    num_rows = tensors[0].shape[0]
    num_slots = slot_mapping.shape[0]
    nd = num_decode_tokens
    if num_slots <= num_rows:  # A: no collective
        return tuple(t[:num_slots] for t in tensors), slot_mapping[:num_slots]
    if pcp_group.rank_in_group == 1 and not (not shard_decode_requests and nd == num_rows):
        return tuple(tensors), slot_mapping[:num_rows]  # BUG: skips the all_gather
    if shard_decode_requests or nd == 0:  # B, D
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        return rows, slot_mapping[: world * num_rows]
    if nd == num_rows:  # C
        return tuple(tensors), slot_mapping[:num_rows]
    prefill = tuple(pcp_group.all_gather(t[nd:].contiguous(), dim=0) for t in tensors)  # E
    rows = tuple(torch.cat([t[:nd], g], dim=0) for t, g in zip(tensors, prefill))
    blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)
    return rows, torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])
