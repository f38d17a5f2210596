"""Hostile target: writes nothing, and at call time wraps the observation of its own rank
(`observe` in every loaded pcpcheck module) so that the cache it reports is the expected one.

Its behaviour deserves REPLICA on every rank that expects a cache entry: what a rank did must be
read by the driver from plain data, never by code the target can replace.
"""

import sys

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file


def _forged(observe):
    def observe_as_expected(prepared, rank, *args, **kwargs):
        view = observe(prepared, rank, *args, **kwargs)
        view.caches = [dict(prepared.expected[rank]) for _ in view.caches]  # FORGERY
        return view

    observe_as_expected.forged = True
    return observe_as_expected


def _forge_observation():
    for name, module in list(sys.modules.items()):
        observe = getattr(module, "observe", None)
        if name.startswith("pcpcheck") and callable(observe) and not hasattr(observe, "forged"):
            module.observe = _forged(observe)


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    _forge_observation()
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # BUG: nothing reaches the cache
