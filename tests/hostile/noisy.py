"""Hostile target: correct, but prints debugging noise on every rank, to stdout and stderr."""

import sys

import torch
from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    print(f"DEBUG rank {pcp_group.rank_in_group}: {tensors[0].shape}")
    print("WARNING: noisy", file=sys.stderr)
    world, nd = pcp_group.world_size, num_decode_tokens
    num_rows, num_slots = tensors[0].shape[0], slot_mapping.shape[0]
    if num_slots <= num_rows:
        return tuple(t[:num_slots] for t in tensors), slot_mapping[:num_slots]
    if shard_decode_requests or nd == 0:
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        return rows, slot_mapping[: world * num_rows]
    if nd == num_rows:
        return tuple(tensors), slot_mapping[:num_rows]
    rows = tuple(torch.cat([t[:nd], pcp_group.all_gather(t[nd:].contiguous(), dim=0)]) for t in tensors)
    blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)[:, nd:].reshape(-1)
    return rows, torch.cat([slot_mapping[:nd], blocks])
