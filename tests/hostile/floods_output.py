"""Hostile target: writes nothing, and prints 2 MB to stdout and to stderr on every call.

Its behaviour deserves REPLICA; what a rank printed is captured and shown per rank, truncated,
in the counterexample: the report stays a report.
"""

import sys

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file

_LINE = "flood " + "x" * 1017 + "\n"  # 1 KiB


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    sys.stdout.write(_LINE * 2048)
    sys.stderr.write(_LINE * 2048)
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # BUG: nothing reaches the cache
