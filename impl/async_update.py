"""An asynchronous replication of the prefill cache inputs, as vLLM forks overlap it with
attention: the protocol (start, then finish) a model runner calls around a layer's attention,
written from docs/semantics.md's description of the decode-sharded step (section 2).

`start` writes, on the current stream, every rank's prefill rows (gathered with per-rank
sizes) and this rank's own decode rows, which the layer's attention reads; it then records a
ready event, keeps its inputs alive for a side stream (`record_stream`) and, on that stream,
after the ready event, gathers every rank's decode rows and writes the peers' ones, recording
a done event. `finish` makes the current stream wait for the done event: whatever reads the
peers' decode rows must come after it. Where CUDA is absent, a CUDA graph is being captured, or
the per-rank counts do not describe the inputs, `start` returns False and writes nothing: the
caller then takes the synchronous gather.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# the gather is the caller's synchronous fallback: beside the protocol, as in a fork's file,
# so that a copy of this file is a whole `--async` target
from pcpcheck_impl.gather import gather_prefill_cache_inputs
from pcpcheck_impl.parallel_state import get_pcp_group

__all__ = ["PCPAsyncCacheUpdate", "gather_prefill_cache_inputs"]


class PCPAsyncCacheUpdate:
    """One layer's cache update across PCP ranks, overlapped with its attention."""

    def __init__(self, group: Any = None) -> None:
        self._group = group
        self._done: Any = None  # the side stream's done event while an update is pending

    def start(self, tensors: Sequence[torch.Tensor], slot_mapping: torch.Tensor,
              num_decode_tokens: int, tokens_per_rank: Sequence[int],
              decode_tokens_per_rank: Sequence[int],
              update_cache: Callable[[tuple[torch.Tensor, ...], torch.Tensor], None]) -> bool:
        """Begin the update; False (nothing written) where the caller must gather synchronously."""
        if self._done is not None:
            raise RuntimeError("an asynchronous cache update is still pending: call finish() first")
        if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
            return False
        group = self._group if self._group is not None else get_pcp_group()
        tensors = tuple(tensors)
        world, rank = group.world_size, group.rank_in_group
        rows = tensors[0].shape[0] if tensors else 0
        if not self._consistent(tensors, slot_mapping, num_decode_tokens, tokens_per_rank,
                                decode_tokens_per_rank, world, rank, rows):
            return False
        real = [int(n) for n in tokens_per_rank]
        decodes = [int(d) for d in decode_tokens_per_rank]
        own_real, own_decodes = real[rank], decodes[rank]

        prefill_sizes = [n - d for n, d in zip(real, decodes)]
        if sum(prefill_sizes):
            gathered = tuple(group.all_gatherv(t[own_decodes:own_real].contiguous(), dim=0,
                                               sizes=prefill_sizes) for t in tensors)
            update_cache(gathered, torch.cat([slot_mapping[r * rows + d:r * rows + n]
                                              for r, (n, d) in enumerate(zip(real, decodes))]))
        if own_decodes:
            update_cache(tuple(t[:own_decodes] for t in tensors),
                         slot_mapping[rank * rows:rank * rows + own_decodes])

        main = torch.cuda.current_stream()
        ready = torch.cuda.Event()
        ready.record(main)
        side = torch.cuda.Stream()
        for tensor in (*tensors, slot_mapping):
            tensor.record_stream(side)
        with torch.cuda.stream(side):
            side.wait_event(ready)
            peers = [r for r in range(world) if r != rank and decodes[r]]
            if sum(decodes):
                every = tuple(group.all_gatherv(t[:own_decodes].contiguous(), dim=0, sizes=decodes)
                              for t in tensors)
                if peers:
                    starts = [sum(decodes[:r]) for r in range(world)]
                    index = torch.cat([torch.arange(starts[r], starts[r] + decodes[r])
                                       for r in peers])
                    update_cache(tuple(t.index_select(0, index) for t in every),
                                 torch.cat([slot_mapping[r * rows:r * rows + decodes[r]]
                                            for r in peers]))
            done = torch.cuda.Event()
            done.record(side)
        self._done = done
        return True

    def finish(self, wait: bool = True) -> None:
        """End the update: the current stream waits for the peers' decode rows (wait=False:
        the caller orders its next reader itself)."""
        if self._done is None:
            return
        if wait:
            torch.cuda.current_stream().wait_event(self._done)
        self._done = None

    @staticmethod
    def _consistent(tensors, slot_mapping, num_decode_tokens, tokens_per_rank,
                    decode_tokens_per_rank, world: int, rank: int, rows: int) -> bool:
        """The per-rank counts describe these inputs: one per rank, decodes within real rows
        within the tensors' rows, this rank's decodes its num_decode_tokens, and the slot map
        holding `rows` entries per rank."""
        if not tensors or any(t.shape[0] != rows for t in tensors):
            return False
        if len(tokens_per_rank) != world or len(decode_tokens_per_rank) != world:
            return False
        if any(not 0 <= d <= n <= rows for n, d in zip(tokens_per_rank, decode_tokens_per_rank)):
            return False
        return (int(decode_tokens_per_rank[rank]) == int(num_decode_tokens)
                and slot_mapping.dim() == 1 and slot_mapping.shape[0] == world * rows)
