"""Zoo: bug class 6, shard mode accepts L < S < P*L and derives the rank count as S // L.

In branch B the map's trailing -1 padding is trimmed first (as one would for an unexpanded map),
so the map looks partially expanded (L < S' < P*L); the number of rank blocks is then taken as
S' // L instead of the group's world size, and later ranks' rows (with their slots) are dropped.
Note: with untrimmed, well-formed input S = P*L exactly, so the plain "P = S // L" form of this
class is invisible under WF_WIDTH; the trimming makes it reachable by well-formed cases: whenever
the last rank that holds a real row has fewer real rows than W, its rows are dropped.

Lines that differ from correct.py: branch B, the `real`/`trimmed`/`num_ranks` lines and the two
slices `[: num_ranks * num_rows]` (correct: no slice / `[: world * num_rows]`).

Expected first report: REPLICA (rows and slots are cut to the same length and stay paired; the
dropped rank's tokens are missing from every cache). Wrong in sharded only.
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
        # BUG (class 6): trailing -1 padding is trimmed, the map then looks partially expanded
        # (L < S < P*L) and the rank count is taken as S // L: later ranks' rows are dropped.
        real = torch.nonzero(slot_mapping >= 0).flatten()
        trimmed = int(real[-1]) + 1 if real.numel() else 0
        num_ranks = trimmed // max(num_rows, 1)
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0)[: num_ranks * num_rows] for t in tensors)
        slots = slot_mapping[: num_ranks * num_rows]
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
