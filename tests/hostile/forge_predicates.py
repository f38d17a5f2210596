"""Hostile target: writes nothing, and at import replaces every predicate of spec/invariants.py
with one that always holds (so an in-process judge would say "every invariant holds").

Its behaviour deserves REPLICA on every rank that expects a cache entry: the judge must not run
where the target can reach it.
"""

from vllm.distributed.parallel_state import get_pcp_group  # noqa: F401 - a vLLM-style file

try:  # where the judge's predicates would be, if this process held them
    import pcpcheck_spec.invariants as _invariants
except ImportError:
    _invariants = None
if _invariants is not None:
    for _attr, _value in list(vars(_invariants).items()):
        if callable(_value) and not isinstance(_value, type) and not _attr.startswith("__"):
            setattr(_invariants, _attr, lambda *args, **kwargs: True)  # FORGERY


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    return tuple(t[:0] for t in tensors), slot_mapping[:0]  # BUG: nothing reaches the cache
