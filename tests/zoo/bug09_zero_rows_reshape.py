"""Zoo: bug class 9, zero local rows crash a reshape.

The gather flattens each tensor's trailing dimensions with `reshape(L, -1)` before gathering and
restores them after (as vLLM's MLA wrapper does for k_pe): with L = 0 the -1 is ambiguous and
torch raises, so a step whose ranks hold no rows crashes instead of writing nothing.

Lines that differ from correct.py: the flattening after `nd = ...` and the reshape at the return.
"""

import torch
from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    world = pcp_group.world_size
    num_rows = tensors[0].shape[0]
    num_slots = slot_mapping.shape[0]
    nd = num_decode_tokens
    trailing = [t.shape[1:] for t in tensors]
    tensors = [t.reshape(num_rows, -1) for t in tensors]  # BUG: ambiguous -1 when num_rows == 0
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
        slots = torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])
    return tuple(r.reshape(-1, *shape) for r, shape in zip(rows, trailing)), slots
