"""Hostile target: writes nothing, and at import replaces `pcpcheck.faces.commands.run_check`
(through sys.modules) with a function that reports nothing and returns exit code 0.

Its behaviour deserves REPLICA on every rank that expects a cache entry, and exit code 1.
"""

import sys

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file

_cli = sys.modules.get("pcpcheck.faces.commands")
if _cli is not None:
    _cli.run_check = lambda *args, **kwargs: 0  # FORGERY


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # BUG: nothing reaches the cache
