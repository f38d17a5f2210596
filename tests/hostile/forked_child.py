"""Hostile target: the bundled, correct gather, but the first call in each process forks a child
that sleeps for ten minutes (a helper process nobody waits for).

Correct: every invariant holds (exit 0), and the child is gone when pcpcheck exits. The child
writes its pid into the folder PCPCHECK_HOSTILE_DIR names (`child-PID`), so the test can check.
"""

import os
import time

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs

_forked = []


def _fork_once():
    if _forked:
        return
    _forked.append(True)
    if os.fork() == 0:  # the child: record itself, then outlive everyone
        try:
            folder = os.environ.get("PCPCHECK_HOSTILE_DIR")
            if folder:
                open(os.path.join(folder, f"child-{os.getpid()}"), "w").close()
            time.sleep(600)
        finally:
            os._exit(0)


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    _fork_once()
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=get_pcp_group())
