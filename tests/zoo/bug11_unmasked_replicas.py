"""Zoo: bug class 11, replicated rows on ranks other than 0 written with rank 0's slots.

In the mixed branch E the whole local tensors are gathered (decode copies included) and every
rank block's decode positions are filled with rank 0's decode slots, i.e. the replicated decode
copies of ranks 1..P-1 are not masked: one launch writes the same slot P times (a race).

Lines that differ from correct.py: branch E, the gather of `t` instead of `t[nd:]` (rows are the
plain gather) and `blocks[:, :nd] = slot_mapping[:nd]` replacing the concatenated slot map.

Expected first report: UNIQUE (the decode slot appears P times in every rank's output; LENGTH and
COLLECTIVE hold: P*L rows, P*L slots, same shapes on every rank). In dcp, UNIQUE on the rank that
owns a decode token. Wrong in replicated and dcp (branch E).
"""

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
        # BUG (class 11): every rank's copy of the replicated decode rows is gathered and paired
        # with rank 0's (unmasked) decode slots: the same slot P times in one launch.
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        blocks = slot_mapping[: world * num_rows].reshape(world, num_rows).clone()
        blocks[:, :nd] = slot_mapping[:nd]
        slots = blocks.reshape(-1)
    return rows, slots
