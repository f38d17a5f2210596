"""Zoo: bug class 12, the expanded map read token-major instead of rank-major.

The expanded map is laid out rank-major (`E[q*W + j]` is rank q's row j); this file reads it as
token-major / interleaved (`E[j*P + q]`), in branches B, D (reordered to rank-major before pairing
with the rank-major gather) and E (rank blocks taken from the transposed view).

Lines that differ from correct.py: `slots = ... .reshape(num_rows, world).t().reshape(-1)` in
branches B and D, and `blocks = ... .reshape(num_rows, world).t()` in branch E.
(With W = 1 the two orders coincide, so every failing case has W >= 2.)

Expected first report: PAD_HYGIENE. Ranks hold unequal counts, so the transposition pairs padding
rows with real slots (PAD_HYGIENE precedes PAIRING); with no padding involved (e.g. three 1-token
decodes: rank 0 [t0, t2], rank 1 [t1, pad]) it is PAIRING (t2 paired with t1's slot).
Wrong in sharded, replicated and dcp.
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
        slots = slot_mapping[: world * num_rows].reshape(num_rows, world).t().reshape(-1)  # BUG (class 12)
    elif nd == num_rows:  # C: all decode, replicated: local rows, rank 0's block
        rows = tuple(tensors)
        slots = slot_mapping[:num_rows]
    elif nd == 0:  # D: no decode: every rank's rows gathered
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        slots = slot_mapping[: world * num_rows].reshape(num_rows, world).t().reshape(-1)  # BUG (class 12)
    else:  # E: mixed: local decode rows with rank 0's decode slots, prefill rows gathered
        prefill = tuple(pcp_group.all_gather(t[nd:].contiguous(), dim=0) for t in tensors)
        rows = tuple(torch.cat([t[:nd], g], dim=0) for t, g in zip(tensors, prefill))
        blocks = slot_mapping[: world * num_rows].reshape(num_rows, world).t()  # BUG (class 12)
        slots = torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])
    return rows, slots
