"""Hostile target: the bundled, correct gather, taking 0.7 s per call on every rank. Each call
marks its process in the folder PCPCHECK_HOSTILE_DIR names (`call-PID`), so a test knows a call
ran.

Correct: every invariant holds. The timeout is per rank: at P = 8 with --timeout 5 no rank is
anywhere near its limit, even where the ranks run one after another (8 x 0.7 s = 5.6 s).
"""

import os
import time

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    folder = os.environ.get("PCPCHECK_HOSTILE_DIR")
    if folder:
        open(os.path.join(folder, f"call-{os.getpid()}"), "w").close()
    time.sleep(0.7)
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=get_pcp_group())
