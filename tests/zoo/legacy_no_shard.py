"""Zoo: an older signature without `shard_decode_requests` (bug class 2 when decodes are sharded).

Bug class 2: the layout deals decodes round-robin (sharded regime) but the gather cannot be told:
it treats the map as replicated and picks branch C/D/E from the local nd, which differs across
ranks, so ranks take different branches or gather different shapes (a real run hangs or crashes),
and peer decode KV is missing.

Lines that differ from correct.py: the signature (no `shard_decode_requests`) and branch B removed.
Correct in replicated, dcp, draft, draft-mixed (branches A, C, D, E are correct.py's).

`pcpcheck check` reports the sharded regime not applicable to it (no shard flag: its era has no
decode sharding). Driven sharded anyway, the first report would be COLLECTIVE. Minimal case:
rank 0 holds the decode (nd == L: branch C, no collective), rank 1 holds only padding (nd == 0:
branch D, one all_gather): the ranks' collective traces differ. (pcpcheck's runner detects the
all_gather no peer joins and reports it as COLLECTIVE; a runner that turned it into an error on
the waiting rank would report RETURNS.)
The checker's loader gives `accepts_shard=False`, so the target is called without the flag.
"""

import torch
from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens):
    pcp_group = get_pcp_group()
    world = pcp_group.world_size
    num_rows = tensors[0].shape[0]
    num_slots = slot_mapping.shape[0]
    nd = num_decode_tokens
    if num_slots <= num_rows:  # A: unexpanded map, every real row written
        rows = tuple(t[:num_slots] for t in tensors)
        slots = slot_mapping[:num_slots]
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
