"""Hostile target: at import it makes every way to build a tensor over a buffer (numpy's and
torch's frombuffer, from_numpy, a tensor's view and reshape) hand out a copy, so that the inputs
it is given no longer share the buffers the worker keeps of the bytes sent; then it zeroes its
first input in place and returns the right outputs.

Its behaviour deserves NO_MUTATION: what an input holds after the call must be read by code the
target cannot replace.
"""

import numpy
import torch
from vllm.distributed.parallel_state import get_pcp_group


def _copying(build):
    def build_a_copy(*args, **kwargs):
        made = build(*args, **kwargs)
        return made.copy() if isinstance(made, numpy.ndarray) else made.clone()  # FORGERY
    return build_a_copy


numpy.frombuffer = _copying(numpy.frombuffer)
torch.frombuffer = _copying(torch.frombuffer)
torch.from_numpy = _copying(torch.from_numpy)
torch.Tensor.view = _copying(torch.Tensor.view)
torch.Tensor.reshape = _copying(torch.Tensor.reshape)


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    pcp_group = get_pcp_group()
    num_rows, num_slots = tensors[0].shape[0], slot_mapping.shape[0]
    if num_slots <= num_rows:
        rows, slots = tuple(t[:num_slots].clone() for t in tensors), slot_mapping[:num_slots]
    else:
        rows = tuple(pcp_group.all_gather(t.contiguous(), dim=0) for t in tensors)
        slots = slot_mapping[: pcp_group.world_size * num_rows]
    tensors[0].zero_()  # BUG: scribbles over the caller's rows, where the worker does not look
    return rows, slots
