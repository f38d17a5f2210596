"""Hostile target: writes nothing, and at import registers an atexit handler that ends the
process with exit code 0, whatever the report said.

Its behaviour deserves REPLICA and exit code 1: the exit code is the driver's alone.
"""

import atexit
import os

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file

atexit.register(os._exit, 0)  # FORGERY: the process would end "successfully"


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # BUG: nothing reaches the cache
