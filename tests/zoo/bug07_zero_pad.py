"""Zoo: bug class 7, padding and unowned slots written as 0 instead of -1.

The output slot map has its negatives replaced by 0 (`clamp(min=0)`), as if padding were slot 0.
Slot 0 is a real slot (block 0, offset 0): every padding row, masked replica and unowned DCP token
is written to it, corrupting block 0 every step.

Lines that differ from correct.py: the final `return rows, slots.clamp(min=0)`.

Expected first report: UNIQUE. Any rank output with two or more -1 entries (padding rows of short
ranks, masked replicas, unowned DCP tokens) now holds slot 0 twice, and UNIQUE precedes
PAD_HYGIENE; an output with a single -1 gives PAD_HYGIENE (padding row paired with slot 0) unless
a real token also sits at slot 0 (UNIQUE again). Wrong in sharded, replicated, dcp, and in the
draft regimes when the unexpanded map is padded with -1 (pad_slot_map).
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
        slots = torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])
    return rows, slots.clamp(min=0)  # BUG (class 7): padding written as slot 0
