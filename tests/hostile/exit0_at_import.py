"""Hostile target: ends its process with exit code 0 while it is being imported.

It cannot be loaded: pcpcheck must say so (exit 2, one line), never exit 0.
"""

import os

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file

os._exit(0)


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(tensors), slot_mapping
