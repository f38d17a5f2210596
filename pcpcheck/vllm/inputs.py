"""What a step hands a vLLM release's PCPManager, as the model runner passes it: read by the
worker that runs the manager (pcpcheck.vllm.step) and by the driver that computes what the
manager must build from it (pcpcheck.vllm.judge)."""

from __future__ import annotations

import numpy as np

import pcpcheck_reference as reference
from pcpcheck_spec.names import PAD_SLOT_ID, Batch

# The second KV-cache group's map: the first group's slots moved by this many (a second block
# table), so the 2-D path of `_convert_to_gathered_slot_mappings` is exercised per row.
SECOND_GROUP_OFFSET = 1 << 20


def global_maps(batch: Batch, dcp_rank: int) -> np.ndarray:
    """(2, N) global slot maps of two KV-cache groups as DCP rank `dcp_rank` computes them."""
    first = reference.global_slots(batch, dcp_rank)
    second = np.where(first >= 0, first + SECOND_GROUP_OFFSET, PAD_SLOT_ID)
    return np.stack((first, second))


def step_arrays(batch: Batch):
    """The manager's inputs: (num_scheduled_tokens, num_computed_tokens, is_prefilling,
    query_start_loc_np) as the model runner passes them."""
    q = np.array([r.num_tokens for r in batch.requests], dtype=np.int32)
    computed = np.array([r.context_len for r in batch.requests], dtype=np.int32)
    prefilling = np.array([r.prefilling for r in batch.requests], dtype=np.bool_)
    starts = np.zeros(len(q) + 1, dtype=np.int32)
    np.cumsum(q, out=starts[1:])
    return q, computed, prefilling, starts
