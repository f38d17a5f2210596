"""Hostile target: gathers the right rows but returns a slot map that writes nothing (every slot
-1), as a Tensor subclass whose `tolist()` and `numpy()` claim the right slots.

What the kernel would write is what the tensor's storage holds: REPLICA on every rank that
expects a cache entry. pcpcheck must read the storage, never ask the returned object.
"""

import torch
from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs


class _LyingSlots(torch.Tensor):
    claimed = None

    def tolist(self):
        return list(self.claimed)

    def numpy(self, *args, **kwargs):
        import numpy
        return numpy.asarray(self.claimed, dtype=numpy.int64)


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                              shard_decode_requests, group=get_pcp_group())
    lying = torch.full_like(slots, -1).as_subclass(_LyingSlots)  # BUG: the kernel writes nothing
    lying.claimed = slots.tolist()  # ... but the object says otherwise
    return rows, lying
