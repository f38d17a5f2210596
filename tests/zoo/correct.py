"""Zoo: a correct `_gather_prefill_cache_inputs`, written from docs/semantics.md section 5.

Branches, in order (S = len(slot_mapping), L = rows of every tensor, nd = num_decode_tokens,
P = PCP world size):
  A  S <= L                       unexpanded (replicated draft): T[:S], s[:S] (spec's answer)
  B  S > L, shard                 all_gather every T: P*L rows, s[:P*L]
  C  S > L, not shard, nd == L    T, s[:L] (rank 0's block)
  D  S > L, not shard, nd == 0    all_gather every T: P*L rows, s[:P*L]
  E  S > L, not shard, 0<nd<L     T[:nd] ++ all_gather(T[nd:]); s[:nd] ++ concat_q s[q*L+nd:(q+1)*L]

Every other zoo file is a copy of this one with a few lines changed (marked `# BUG`).
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
    return rows, slots
