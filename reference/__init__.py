"""Pure-numpy reference model of vLLM's PCP KV-cache gather (vectorised).

An independent statement of pcp-semantics sections 2-5: imports only the vocabulary in
spec.names, never spec/ logic, impl/ or pcpcheck/.
"""

from reference.cache import expected_caches, write_cache
from reference.gather import branch, gather
from reference.layout import Layout, dcp_size, expand_slot_mapping, global_slots, layout

__all__ = [
    "Layout",
    "branch",
    "dcp_size",
    "expand_slot_mapping",
    "expected_caches",
    "gather",
    "global_slots",
    "layout",
    "write_cache",
]
