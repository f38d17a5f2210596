"""Hostile target: writes a forged result message (no ranks at all) to every pipe it may write,
its worker's reply pipe among them, then returns outputs that write nothing.

A reply no worker of pcpcheck's would send is the target's doing: the worker that carried it is
stopped and the case gets its verdict (its ranks lost: COLLECTIVE), never pcpcheck's internal
error, and never a pass on a result of no ranks.
"""

import fcntl
import json
import os
import stat
import struct

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file


def _pipes_written():
    for fd in range(3, 256):
        try:
            if (stat.S_ISFIFO(os.fstat(fd).st_mode)
                    and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY):
                yield fd
        except OSError:
            continue


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    text = json.dumps({"op": "result", "ranks": [], "refused": None, "blobs": []}).encode()
    for fd in _pipes_written():
        os.write(fd, struct.pack("<II", len(text), 0) + text)  # FORGERY: pcpcheck's framing
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # and nothing reaches the cache
