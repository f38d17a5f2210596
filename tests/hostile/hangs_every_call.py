"""Hostile target: every call of every rank hangs (a mismatched collective in NCCL looks so).
The search must stop at the first case (each further one costs a timeout) and report
COLLECTIVE on the smallest step, its replay run beside it, with nothing left behind."""

import os
import time


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    time.sleep(int(os.environ.get("PCPCHECK_HANG_SECONDS", "600")))  # BUG: never returns
