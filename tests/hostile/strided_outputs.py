"""Hostile target: a correct gather whose outputs are views of odd memory: every tensor strided
(stride 2, storage offset 1), the slot mapping a row of an expanded tensor (stride 0 across it)
and, every other call, each output a view into a larger buffer with size-one dimensions. The
spec makes memory layout unobservable: it holds (a one-row strided tensor counts as contiguous
while keeping its stride, which once made pcpcheck misread it)."""

import torch
from vllm.distributed.parallel_state import get_pcp_group

from pcpcheck_impl import gather_prefill_cache_inputs

calls = [0]


def _strided(tensor):
    buffer = torch.zeros((2 * tensor.shape[0] + 1, *tensor.shape[1:]), dtype=tensor.dtype)
    buffer[1::2] = tensor
    return buffer[1::2]  # stride 2 along rows, storage offset 1, even for a single row


def _in_size_one_dims(tensor):
    buffer = torch.zeros((3, tensor.shape[0], 1, *tensor.shape[1:]), dtype=tensor.dtype)
    buffer[2, :, 0] = tensor
    return buffer[2, :, 0]


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    rows, slots = gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,
                                              shard_decode_requests, group=get_pcp_group())
    calls[0] += 1
    if calls[0] % 2:
        return tuple(_strided(t) for t in rows), slots.reshape(1, -1).expand(3, -1)[1]
    return tuple(_in_size_one_dims(t) for t in rows), _strided(slots)
