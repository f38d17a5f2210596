"""Hostile target: writes nothing, and at import replaces pcpcheck's judge (`judge` in every loaded
pcpcheck module, reached through sys.modules) with one that finds no violation.

Its behaviour deserves REPLICA on every rank that expects a cache entry.
"""

import sys

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file


def _no_violation(prepared, views, *args, **kwargs):
    return [], ()


for _name, _module in list(sys.modules.items()):
    if _name.startswith("pcpcheck") and callable(getattr(_module, "judge", None)):
        _module.judge = _no_violation  # FORGERY


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # BUG: nothing reaches the cache
