"""Zoo: bug class 13, decode rows assumed to be the last nd rows instead of the first.

In the mixed branch E the local decode rows are taken as `T[L-nd:]` with rank 0's slots
`s[L-nd:L]`, and the prefill rows as `T[:L-nd]` of every rank with `s[q*L : q*L+L-nd]`. The
manager puts decodes first, so on rank 0 this is right only by accident of symmetry, and on other
ranks local rows (often padding) are paired with rank 0's slots.

Lines that differ from correct.py: branch E, `npf = num_rows - nd` and the three lines using it
(gather of `t[:npf]`, local rows `t[npf:]`, slots `s[npf:num_rows] ++ blocks[:, :npf]`).

Expected first report: PAD_HYGIENE (rank 1's padding row, at the tail, is paired with rank 0's
real slot). Without padding on rank 1 (equal counts) it is PAIRING (rank 1's prefill row paired
with rank 0's prefill slot). Wrong in replicated and dcp (branch E).
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
        # BUG (class 13): decode rows assumed to be the last nd rows, prefill rows the first L-nd
        npf = num_rows - nd
        prefill = tuple(pcp_group.all_gather(t[:npf].contiguous(), dim=0) for t in tensors)
        rows = tuple(torch.cat([t[npf:], g], dim=0) for t, g in zip(tensors, prefill))
        blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)
        slots = torch.cat([slot_mapping[npf:num_rows], blocks[:, :npf].reshape(-1)])
    return rows, slots
