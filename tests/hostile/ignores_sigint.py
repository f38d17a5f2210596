"""Hostile target: the bundled, correct gather, taking 0.2 s per call, that ignores SIGINT from
its import on.

Ctrl-C must still stop pcpcheck at once (exit 130) and leave no process behind. Each call marks
its process in the folder PCPCHECK_HOSTILE_DIR names (`call-PID`), so the test knows a call ran.
"""

import os
import signal
import time

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs

signal.signal(signal.SIGINT, signal.SIG_IGN)


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    folder = os.environ.get("PCPCHECK_HOSTILE_DIR")
    if folder:
        open(os.path.join(folder, f"call-{os.getpid()}"), "w").close()
    time.sleep(0.2)
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=get_pcp_group())
