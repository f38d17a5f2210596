"""Zoo: bug class 3, num_decode_tokens used as the KV-ownership boundary.

In the sharded branch B, the code believes that a peer's rows past the local nd (its "prefill
part") are the peer's own to write (confusing PCP with DCP) and masks their slots with -1. With
D = 1 every rank must hold every token, so each rank misses its peers' rows at positions >= nd.

Lines that differ from correct.py: branch B, `slots = ...` replaced by the masking block
(`blocks[peers, nd:] = -1`).

Expected first report: REPLICA (rows and slots stay aligned, the masked slots are -1, so nothing
earlier fails; peers' tokens are missing from each rank's cache).
Wrong in sharded only (B is the only branch changed).
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
        # BUG (class 3): nd taken as the KV-ownership boundary: a peer's rows past the local nd
        # are assumed to be written by that peer, so their slots are masked here.
        blocks = slot_mapping[: world * num_rows].reshape(world, num_rows).clone()
        peers = torch.arange(world, device=blocks.device) != pcp_group.rank_in_group
        blocks[peers, nd:] = -1
        slots = blocks.reshape(-1)
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
