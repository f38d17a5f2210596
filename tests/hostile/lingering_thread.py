"""Hostile target: the bundled, correct gather, but its import starts a non-daemon thread that
never ends (a background logger, say).

Correct: every invariant holds (exit 0), and pcpcheck exits right after its report.
"""

import threading

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs

threading.Thread(target=threading.Event().wait, name="hostile-forever", daemon=False).start()


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=get_pcp_group())
