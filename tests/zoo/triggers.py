"""Zoo: one trigger per invariant ID, each the correct gather with one output made wrong in the
way that breaks that ID and nothing reported before it (spec.registry priority order).

tests/test_zoo.py::test_every_invariant_fires_in_every_regime_it_applies_to replays a pinned
case per regime against `--function fires_<ID>` and asserts the exact ID: every (ID, regime)
pair of spec.registry must fire at checker level. A trigger changes a rank's outputs only where
the rank has what it needs (written slots), so a case with none shows nothing.
"""

import torch
from vllm.distributed.parallel_state import get_pcp_group


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """The gather of correct.py (branches A-E of docs/semantics.md section 5): the default function,
    which every trigger calls first; its outputs are fresh tensors the trigger may change."""
    pcp_group = get_pcp_group()
    world = pcp_group.world_size
    num_rows = tensors[0].shape[0]
    num_slots = slot_mapping.shape[0]
    nd = num_decode_tokens
    if num_slots <= num_rows:
        rows = tuple(t[:num_slots] for t in tensors)
        slots = slot_mapping[:num_slots]
    elif shard_decode_requests or nd == 0:
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        slots = slot_mapping[: world * num_rows]
    elif nd == num_rows:
        rows = tuple(tensors)
        slots = slot_mapping[:num_rows]
    else:
        prefill = tuple(pcp_group.all_gather(t[nd:].contiguous(), dim=0) for t in tensors)
        rows = tuple(torch.cat([t[:nd], g], dim=0) for t, g in zip(tensors, prefill))
        blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)
        slots = torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])
    return [t.clone() for t in rows], slots.clone()


def _written(slots) -> list[int]:
    return torch.nonzero(slots >= 0).flatten().tolist()


def fires_RETURNS(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    return tuple(rows), slots.to(torch.int32)  # bug class 8, direct form: int32 for an int64 map


def fires_COLLECTIVE(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    pcp_group = get_pcp_group()
    if pcp_group.rank_in_group == 0:
        pcp_group.all_gather(slot_mapping.contiguous(), dim=0)  # only rank 0 calls it
    return tuple(rows), slots


def fires_NO_MUTATION(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    slot_mapping.add_(1)  # the caller's map, after the outputs were taken from it
    return tuple(rows), slots


def fires_LENGTH(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    if slots.numel():
        rows = [t[: slots.numel() - 1] for t in rows]  # one row fewer than slots
    return tuple(rows), slots


def fires_UNIQUE(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    written = _written(slots)
    if written:  # the first written row and slot once more: one slot written twice
        k = written[0]
        rows = [torch.cat([t, t[k : k + 1]]) for t in rows]
        slots = torch.cat([slots, slots[k : k + 1]])
    return tuple(rows), slots


def fires_PAD_HYGIENE(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    written = _written(slots)
    if written:  # a written slot paired with a row that is no input row
        for t in rows:
            t[written[0]] = 0.5
    return tuple(rows), slots


def fires_PAIRING(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    written = _written(slots)
    if len(written) >= 2:  # two real rows swapped against their slots
        first, second = written[0], written[1]
        for t in rows:
            t[[first, second]] = t[[second, first]]
    return tuple(rows), slots


def fires_cache(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """REPLICA (D = 1) or SHARD (D > 1): the last written slot is dropped on every rank."""
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    written = _written(slots)
    if written:
        slots[written[-1]] = -1
    return tuple(rows), slots


fires_REPLICA = fires_SHARD = fires_cache


def returns_slots_on_meta(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """RETURNS by device: right dtype, right content, but not on the input map's device."""
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    return tuple(rows), slots.to("meta")


def returns_rows_as_int32(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """RETURNS by dtype: the rows' bytes intact, reinterpreted as int32 (float32 inputs)."""
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    return tuple(t.view(torch.int32) for t in rows), slots


def returns_rows_reshaped(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """RETURNS by shape: the rows' bytes intact, trailing shape (4,) returned as (2, 2)."""
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    return tuple(t.reshape(t.shape[0], 2, 2) for t in rows), slots


def returns_one_tensor_less(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """RETURNS by count: the last input tensor's gathered rows are not returned."""
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    return tuple(rows[:-1]), slots


def returns_rows_past_their_storage(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """RETURNS, not a pass: the right rows, then their storage freed under them (the freed memory
    may still hold the right bytes; reading it is no evidence, and may crash)."""
    rows, slots = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    rows[0].untyped_storage().resize_(0)
    return tuple(rows), slots


def leaves_an_input_past_its_storage(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """NO_MUTATION: the right outputs, and tensors[0] left on a storage freed under it."""
    result = _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    moved = tensors[0].clone()
    tensors[0].set_(moved.untyped_storage(), 0, moved.shape, moved.stride())
    moved.untyped_storage().resize_(0)
    return result
