"""Hostile target: ranks exchange their rows through a module-level dict instead of a collective
(a single all_gather of one number serves as a barrier, so every rank issues the same collectives).

Across real processes a rank's dict holds only its own rows: it finds no peer rows and uses zero
rows in their place, a wrong gather. Each rank has its own instance of the target, as in vLLM, so
the verdict is PAD_HYGIENE (rows that are no input row paired with real slots) on every rank, on
every backend.
"""

import torch
from vllm.distributed.parallel_state import get_pcp_group

_ROWS = {}  # (call number, rank, tensor index) -> that rank's rows
_CALLS = {}  # rank -> calls made


def _exchange(group, tensors):
    rank, world = group.rank_in_group, group.world_size
    call = _CALLS[rank] = _CALLS.get(rank, 0) + 1
    for k, tensor in enumerate(tensors):
        _ROWS[(call, rank, k)] = tensor.clone()
    group.all_gather(torch.zeros(1), dim=0)  # a barrier, not the data
    return tuple(torch.cat([_ROWS.get((call, peer, k), torch.zeros_like(tensor))
                            for peer in range(world)])
                 for k, tensor in enumerate(tensors))  # BUG: rows behind the collective's back


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    group = get_pcp_group()
    world, nd = group.world_size, num_decode_tokens
    num_rows, num_slots = tensors[0].shape[0], slot_mapping.shape[0]
    if num_slots <= num_rows:
        return tuple(t[:num_slots] for t in tensors), slot_mapping[:num_slots]
    if shard_decode_requests or nd == 0:
        return _exchange(group, tensors), slot_mapping[: world * num_rows]
    if nd == num_rows:
        return tuple(tensors), slot_mapping[:num_rows]
    prefill = _exchange(group, tuple(t[nd:] for t in tensors))
    blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)
    return (tuple(torch.cat([t[:nd], g]) for t, g in zip(tensors, prefill)),
            torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)]))
