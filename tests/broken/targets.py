"""Broken targets in the shapes a broken pull request takes: every call hangs, only large steps
hang, every call crashes the worker (SIGSEGV, a C-stack overflow, os._exit), a hang that does
not come back, a correct but slow gather, and slow gathers that are wrong or crash on some
steps. Pick one with `--function`; each wraps the bundled
gather. tests/test_broken.py asserts their verdicts, benchmarks/broken_targets.py times them."""

import os
import signal
import sys
import time

from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs


def _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests):
    return gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                       shard_decode_requests, group=get_pcp_group())


def correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)


def hangs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    time.sleep(10**6)  # BUG: every call hangs


def hangs_at_p4(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    if get_pcp_group().world_size >= 4:
        time.sleep(10**6)  # BUG: a step on 4 or more ranks hangs
    return _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)


def hangs_at_p8(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    if get_pcp_group().world_size == 8:
        time.sleep(10**6)  # BUG: a step on 8 ranks hangs
    return _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)


def hangs_at_3_tokens(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    if int((slot_mapping >= 0).sum()) >= 3:  # replicated: every real token's slot, once
        time.sleep(10**6)  # BUG: a step of 3 or more tokens hangs
    return _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)


def segfaults(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    os.kill(os.getpid(), signal.SIGSEGV)  # BUG: every call crashes its process


def _descend(depth):
    return list(map(_descend, [depth + 1]))  # through C (map): every level takes C stack


def recurses(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    sys.setrecursionlimit(10**8)
    _descend(0)  # BUG: the C stack overflows (SIGSEGV)


def exits_3(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    os._exit(3)  # BUG: every call ends its process


def hangs_once(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """Hangs on the first call of the run, never again (it marks the run's TMPDIR): flaky."""
    marker = os.path.join(os.environ["TMPDIR"], "hung-once")
    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(10**6)
    return _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)


def slow(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    time.sleep(0.3)  # correct, 0.3 s a call on every rank
    return _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)


SLOW_CALL = 1.5  # seconds a slow call takes, on every rank


def slow_and_crashing(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """Every call takes seconds; a step of more than 2 local rows kills its rank (as deep
    recursion with a raised recursion limit does on a slower machine)."""
    time.sleep(SLOW_CALL)
    if tensors[0].shape[0] > 2:
        os.kill(os.getpid(), signal.SIGSEGV)  # BUG
    return _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)


def slow_and_wrong(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """Every call takes seconds; the last slot is dropped (its row's KV never written), in every
    regime."""
    time.sleep(SLOW_CALL)
    rows, slots = _correct(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    return rows, slots[:max(0, slots.shape[0] - 1)]  # BUG

