"""Zoo: the triggers of the stream orderings a gather alone can break, without a protocol
(SPEC.md "Asynchronous replication": a file that names torch.cuda's stream API has its streams
judged on every step, `--async` or not). The default gather runs triggers.py's on a side stream,
joined both ways; each trigger drops one join.

tests/test_zoo.py::test_every_invariant_fires_in_every_regime_it_applies_to replays its pinned
case of each regime against `--function fires_<ID>` (the regimes where no protocol runs; the
sharded regime's triggers are tests/zoo/async_fork.py's mutants).
"""

import torch

from tests.zoo.triggers import _gather_prefill_cache_inputs as _gather


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """triggers.py's gather (correct.py's, with fresh outputs) on a side stream."""
    return _on_side_stream(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)


def fires_ASYNC_INPUT(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """The side stream reads the inputs without waiting for the stream that produced them."""
    return _on_side_stream(tensors, slot_mapping, num_decode_tokens, shard_decode_requests,
                           wait_for_inputs=False)


def fires_ASYNC_LIFETIME(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    """The caller's stream does not wait for the side stream: the caller frees its inputs while
    the side stream may still read them."""
    return _on_side_stream(tensors, slot_mapping, num_decode_tokens, shard_decode_requests,
                           join=False)


def _on_side_stream(tensors, slot_mapping, num_decode_tokens, shard_decode_requests,
                    wait_for_inputs=True, join=True):
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    if wait_for_inputs:
        side.wait_stream(main)
    with torch.cuda.stream(side):
        out = _gather(tensors, slot_mapping, num_decode_tokens, shard_decode_requests)
    if join:
        main.wait_stream(side)
    return out
