"""A fork's pcp.py with an asynchronous replication beside its gather (bug class 16): the
protocol as docs/async.md describes it, and one mutant per way of breaking it.

`pcpcheck check tests/zoo/async_fork.py --async PCPAsyncCacheUpdate` holds; each mutant class
below fails with the invariant named in its docstring. The caller's two mistakes (finish(wait=False)
before a reader, a reader before finish) are `--async-order`s of the correct class
(tests/test_async.py).
"""

import torch
from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
from vllm.distributed.parallel_state import get_pcp_group
from vllm.platforms import current_platform


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """The synchronous gather (branches A-E of docs/semantics.md section 5), the fallback."""
    pcp_group = get_pcp_group()
    world = pcp_group.world_size
    num_rows = tensors[0].shape[0]
    num_slots = slot_mapping.shape[0]
    nd = num_decode_tokens
    if num_slots <= num_rows:
        return tuple(t[:num_slots] for t in tensors), slot_mapping[:num_slots]
    if shard_decode_requests or nd == 0:
        return (tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors),
                slot_mapping[: world * num_rows])
    if nd == num_rows:
        return tuple(tensors), slot_mapping[:num_rows]
    prefill = tuple(pcp_group.all_gather(t[nd:].contiguous(), dim=0) for t in tensors)
    rows = tuple(torch.cat([t[:nd], g], dim=0) for t, g in zip(tensors, prefill))
    blocks = slot_mapping[: world * num_rows].reshape(world, num_rows)
    return rows, torch.cat([slot_mapping[:nd], blocks[:, nd:].reshape(-1)])


def _runs(slot_mapping, width, counts, ranks):
    """The slots of rows [begin, end) of each listed rank (counts[r] = (begin, end))."""
    parts = [slot_mapping[r * width + counts[r][0]: r * width + counts[r][1]] for r in ranks]
    return torch.cat(parts) if parts else slot_mapping[:0]


class PCPAsyncCacheUpdate:
    WAIT_FOR_READY = True  # the side stream waits for the inputs' ready event
    KEEP_INPUTS = True  # record_stream on every input for the side stream
    FALL_BACK_WHILE_CAPTURING = True  # no asynchronous update inside a CUDA graph capture

    def __init__(self):
        self.pending = None

    def start(self, tensors, slot_mapping, num_decode_tokens, tokens_per_rank,
              decode_tokens_per_rank, update_cache):
        if self.pending is not None:
            raise RuntimeError("previous asynchronous cache update still pending")
        capturing = (torch.cuda.is_current_stream_capturing()
                     or BreakableCUDAGraphCapture.is_active())
        if not (torch.cuda.is_available() and current_platform.is_cuda()) or (
                capturing and self.FALL_BACK_WHILE_CAPTURING):
            return False
        group = get_pcp_group()
        world, rank = group.world_size, group.rank_in_group
        width = tensors[0].shape[0]
        if (len(tokens_per_rank) != world or decode_tokens_per_rank[rank] != num_decode_tokens
                or slot_mapping.shape[0] != world * width):
            return False
        prefill = [(d, n) for n, d in zip(tokens_per_rank, decode_tokens_per_rank)]
        decode = [(0, d) for d in decode_tokens_per_rank]
        low, high = prefill[rank]
        update_cache(tuple(group.all_gatherv(t[low:high], dim=0,
                                             sizes=[n - d for d, n in prefill]) for t in tensors),
                     _runs(slot_mapping, width, prefill, range(world)))
        update_cache(tuple(t[:num_decode_tokens] for t in tensors),
                     _runs(slot_mapping, width, decode, [rank]))
        with torch.cuda.device(torch.cuda.current_device()):
            return self._start_side_stream(tensors, slot_mapping, num_decode_tokens, world, rank,
                                           width, decode_tokens_per_rank, update_cache)

    def _start_side_stream(self, tensors, slot_mapping, num_decode_tokens, world, rank, width,
                           decode_tokens_per_rank, update_cache):
        decode = [(0, d) for d in decode_tokens_per_rank]
        group = get_pcp_group()
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream())
        side = torch.cuda.Stream()
        if self.KEEP_INPUTS:
            for t in (*tensors, slot_mapping):
                t.record_stream(side)
        torch.cuda.nvtx.range_push("pcp async decode replication")
        with torch.cuda.stream(side):
            if self.WAIT_FOR_READY:
                side.wait_event(ready)
            gathered = tuple(group.all_gatherv(t[:num_decode_tokens], dim=0,
                                               sizes=list(decode_tokens_per_rank)) for t in tensors)
            offsets = [sum(decode_tokens_per_rank[:r]) for r in range(world)]
            peers = [r for r in range(world) if r != rank]
            keep = [i for r in peers for i in range(offsets[r], offsets[r] + decode_tokens_per_rank[r])]
            index = torch.tensor(keep, dtype=torch.long)
            update_cache(tuple(g.index_select(0, index) for g in gathered),
                         _runs(slot_mapping, width, decode, peers))
            done = torch.cuda.Event()
            done.record(side)
        torch.cuda.nvtx.range_pop()
        self.pending = done
        return True

    def finish(self, wait=True):
        if self.pending is not None and wait:
            torch.cuda.current_stream().wait_event(self.pending)
        self.pending = None


class NoReadyWait(PCPAsyncCacheUpdate):
    """ASYNC_INPUT: the side stream reads the inputs before their producer is ordered before it."""

    WAIT_FOR_READY = False


class NoRecordStream(PCPAsyncCacheUpdate):
    """ASYNC_LIFETIME: the caller releases its inputs while the side stream still reads them."""

    KEEP_INPUTS = False


class StartsWhileCapturing(PCPAsyncCacheUpdate):
    """ASYNC_FALLBACK: an asynchronous update inside a CUDA graph capture."""

    FALL_BACK_WHILE_CAPTURING = False
