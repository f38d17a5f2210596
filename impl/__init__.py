"""impl: torch implementation of vLLM's PCP KV-cache gather (drop-in signature).

Imports only torch and ``spec.names``-level constants; states the behaviour independently of
spec/ and reference/. Its modules import each other by absolute name (``pcpcheck_impl.x``),
so a copy of one checked as a lone file (``pcpcheck check /tmp/gather.py``) still imports.
"""

from .async_update import PCPAsyncCacheUpdate
from .cache import write_kv_cache
from .gather import (
    check_expanded_index_fits,
    check_nd_agreement,
    gather_prefill_cache_inputs,
    select_branch,
    validate_gather_inputs,
)
from .indexer import gather_indexer_cache_inputs
from .mla import gather_mla_cache_inputs
from .parallel_state import ProcessGroupAdapter, as_group, get_pcp_group, set_pcp_group

__all__ = [
    "PCPAsyncCacheUpdate",
    "ProcessGroupAdapter",
    "as_group",
    "check_expanded_index_fits",
    "check_nd_agreement",
    "gather_indexer_cache_inputs",
    "gather_mla_cache_inputs",
    "gather_prefill_cache_inputs",
    "get_pcp_group",
    "select_branch",
    "set_pcp_group",
    "validate_gather_inputs",
    "write_kv_cache",
]
