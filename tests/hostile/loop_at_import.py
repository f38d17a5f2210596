"""Hostile target: never finishes importing (an endless loop at module level).

Loading is bounded: pcpcheck must give up after its timeout with exit 2 and one line.
"""

import time

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file

while True:
    time.sleep(0.05)


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(tensors), slot_mapping
