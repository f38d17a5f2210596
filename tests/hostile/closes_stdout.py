"""Hostile target: writes nothing, and closes its process's sys.stdout (and stderr) at import.

Its behaviour deserves REPLICA on every rank that expects a cache entry, reported as usual:
pcpcheck's own output never goes through the target's streams.
"""

import sys

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file

sys.stdout.close()
sys.stderr.close()


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # BUG: nothing reaches the cache
