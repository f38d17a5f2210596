"""Pure-numpy reference model of vLLM's PCP KV-cache gather (vectorised).

An independent statement of docs/semantics.md sections 2-5: imports only the vocabulary in
spec.names, never spec/ logic, impl/ or pcpcheck/.
"""

from .cache import expected_caches, write_cache
from .gather import branch, gather
from .layout import (
    ERA_CURRENT,
    ERA_V026,
    ERAS,
    Layout,
    dcp_size,
    expand_slot_mapping,
    global_slot_maps,
    global_slots,
    hidden_restore_index,
    layout,
    rank_counts,
    replicated_requests,
)

__all__ = [
    "ERAS",
    "ERA_CURRENT",
    "ERA_V026",
    "Layout",
    "branch",
    "dcp_size",
    "expand_slot_mapping",
    "expected_caches",
    "gather",
    "global_slot_maps",
    "global_slots",
    "hidden_restore_index",
    "layout",
    "rank_counts",
    "replicated_requests",
    "write_cache",
]
