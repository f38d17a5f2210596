"""Hostile target: the bundled, correct gather, except that rank 0 writes nothing on every other
call (REPLICA on rank 0), whatever the case.

Which calls fail depends on the calls before, not on the case: pcpcheck must report the violation
as flaky, with how many replays of its case showed it, not as an ordinary counterexample. The
call count lives in the file `flaky-calls` in the folder PCPCHECK_HOSTILE_DIR names (shared by
every process, so it counts alike on threads and on processes); without it, a call fails at
random, one in two (os.urandom).
"""

import os

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs


def _failing_call() -> bool:
    folder = os.environ.get("PCPCHECK_HOSTILE_DIR")
    if not folder:
        return os.urandom(1)[0] < 128
    with open(os.path.join(folder, "flaky-calls"), "a+") as calls:
        calls.seek(0)
        count = len(calls.read()) + 1
        calls.write(".")
    return count % 2 == 1


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    group = get_pcp_group()
    rows, slots = gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                              shard_decode_requests, group=group)
    if group.rank_in_group == 0 and _failing_call():
        slots = slots.clone().fill_(-1)  # BUG, now and then: rank 0 writes nothing
    return rows, slots
