"""What a step hands a vLLM release's PCPManager, as the model runner passes it: read by the
worker that runs the manager (pcpcheck.worker.release_step) and by the driver that computes what the
manager must build from it (pcpcheck.judge.release_case)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

import pcpcheck_reference as reference
from pcpcheck_spec.names import DRAFT_REGIMES, REPLICATED, Batch

if TYPE_CHECKING:  # annotations only
    from pcpcheck.shared.protocol import Capabilities

# The second KV-cache group's block table: the first group's block ids moved by this many, so
# the 2-D path of `_convert_to_gathered_slot_mappings` (and of the slot kernel's grid) is
# exercised per group.
SECOND_GROUP_BLOCKS = 1 << 16


def group_blocks(batch: Batch, second_replicated: bool = False
                 ) -> list[tuple[tuple[int, ...], ...]]:
    """Per request, its block table in each of the two KV-cache groups. A second group that is
    replicated under DCP (`dcp_sharded` False: every rank holds every token at its global
    position) has D blocks of B positions for each of the first group's blocks of B*D."""
    size = reference.dcp_size(batch) if second_replicated else 1
    return [(r.blocks, tuple(SECOND_GROUP_BLOCKS + b * size + k for b in r.blocks
                             for k in range(size))) for r in batch.requests]


def global_maps(batch: Batch, dcp_rank: int, second_replicated: bool = False) -> np.ndarray:
    """(2, N) global slot maps of the two KV-cache groups as DCP rank `dcp_rank` computes them
    (semantics section 3, per group's block table; a replicated second group as with D = 1)."""
    second = dataclasses.replace(batch, requests=tuple(
        dataclasses.replace(r, blocks=tables[1])
        for r, tables in zip(batch.requests, group_blocks(batch, second_replicated))))
    if second_replicated:
        second = dataclasses.replace(second, regime=REPLICATED, interleave=1)
    return np.stack((reference.global_slots(batch, dcp_rank),
                     reference.global_slots(second, dcp_rank if not second_replicated else 0)))


def step_arrays(batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The manager's inputs: (num_scheduled_tokens, num_computed_tokens, is_prefilling,
    query_start_loc_np) as the model runner passes them."""
    q = np.array([r.num_tokens for r in batch.requests], dtype=np.int32)
    computed = np.array([r.context_len for r in batch.requests], dtype=np.int32)
    prefilling = np.array([r.prefilling for r in batch.requests], dtype=np.bool_)
    starts = np.zeros(len(q) + 1, dtype=np.int32)
    np.cumsum(q, out=starts[1:])
    return q, computed, prefilling, starts


def positions(batch: Batch) -> np.ndarray:
    """Each token's sequence position, in batch order (its request's context, then onwards)."""
    return np.array([r.context_len + k for r in batch.requests for k in range(r.num_tokens)],
                    dtype=np.int64)


def dummy_tokens(batch: Batch, caps: Capabilities) -> int:
    """Tokens of the dummy request (`idx_mapping == -1`) the step's slot kernel is given after
    its real requests, as the model runner pads a CUDA-graph batch: the graph padding rows past
    the widest rank of the release's era, where its kernel masks dummy requests (`caps`:
    Capabilities.dummy_requests); else 0. It owns no blocks and must write no slot."""
    if not caps.dummy_requests or not batch.graph_size or batch.regime in DRAFT_REGIMES:
        return 0
    widest = int(reference.layout(dataclasses.replace(batch, graph_size=0),
                                  era=caps.era).counts.max(initial=0))
    return max(batch.graph_size - widest, 0)
