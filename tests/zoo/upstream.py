"""Zoo: upstream vLLM's behaviour: correct except branch A keeps only [:nd] (bug class 10).

Bug class 10 (docs/semantics.md section 7): a replicated unexpanded (draft) batch that the attention
kernel classifies as mixed (nd below the real row count) goes through the early return of branch
A, which keeps only `T[:nd]`, `s[:nd]`: the KV of real rows nd..S-1 is never written on any rank.
This file is the zoo's class-10 file (a separate bug10_draft_prefix.py would be the same code).

Lines that differ from correct.py: branch A, `rows = tuple(t[:nd] ...)` and `slots = slot_mapping[:nd]`
(correct: `[:num_slots]`).

Expected first report: REPLICA, tagged hazard. Outputs stay well formed (rows == slots == nd, no
duplicate, no padding row paired, every written slot is its own token's), so nothing before
REPLICA in spec.registry.REGISTRY fails; every rank's cache lacks tokens nd..N-1.
Wrong only in the hazard regime draft-mixed (a draft block of >= 2 tokens the kernel counts as
prefill); the default run passes, as vLLM 0.33.0's own pcp.py does (in draft nd = N, and a
-1-padded map (S = L) loses only -1 slots).
"""

import torch
from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    world = pcp_group.world_size
    num_rows = tensors[0].shape[0]
    num_slots = slot_mapping.shape[0]
    nd = num_decode_tokens
    if num_slots <= num_rows:  # A: unexpanded map
        # BUG (class 10, upstream vLLM): only the kernel's decode rows are kept
        rows = tuple(t[:nd] for t in tensors)
        slots = slot_mapping[:nd]
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
    return rows, slots
