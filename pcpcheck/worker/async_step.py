"""One rank's step through an asynchronous protocol (`pcpcheck check --async`), driven as vLLM's
model runner drives it, on the CPU model of CUDA streams (pcpcheck.worker.cuda_model).

The caller's steps, in `order` (spec.names.ASYNC_ORDER by default):

- before them, the step's inputs are produced on the main stream (a write of each);
- `start`: `protocol.start(tensors, slot_mapping, num_decode_tokens, tokens_per_rank,
  decode_tokens_per_rank, update_cache)`; where it answers False the caller takes the
  synchronous gather (the target's gather function, decodes sharded) and writes its output
  through update_cache. A target without a protocol (a gather whose file uses the stream API,
  judged without `--async`) takes the gather there, and its trace carries no start's answer;
- `attention`: the layer's attention reads the cache on the current stream (reader 0: the
  judge knows which slots);
- `release`: the caller drops its inputs: each one the protocol does not still hold is
  released on the current stream (one it holds is released at the end of the step);
- `finish` / `finish-nowait`: `protocol.finish()` / `protocol.finish(wait=False)`, if it started;
- `reader`: the next reader of the cache (reader 1: the complete replica).

update_cache(rows, slots) writes the rank's cache on the current stream: a tensor or a tuple of
them (one per input tensor) and a slot map. What the rank returns to the judge is every call's
rows and slots in order, concatenated, as a gather's output: the existing invariants judge the
cache they write, the asynchronous ones the trace.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from pcpcheck.worker import rankctx
from pcpcheck.worker.cuda_model import StreamModel
from pcpcheck_spec.names import (
    ASYNC_ORDER,
    FLAG,
    HOST,
    INPUT,
    MAIN_STREAM,
    ORDER_ATTENTION,
    ORDER_FINISH,
    ORDER_FINISH_NO_WAIT,
    ORDER_READER,
    ORDER_RELEASE,
    ORDER_START,
    READ,
    READER,
    READER_ATTENTION,
    READER_NEXT,
    RELEASE,
    STARTED,
    WRITE,
)


class StreamGroup:
    """The rank's group as the protocol sees it: each collective reads its input on the current
    stream, and vLLM's `all_gatherv` (per-rank sizes) is an all_gather of rows padded to the
    largest size (every rank issues the same collective)."""

    def __init__(self, group, model: StreamModel):
        self._group = group
        self._model = model
        self.world_size = group.world_size
        self.rank_in_group = group.rank_in_group

    def __getattr__(self, name):
        return getattr(self._group, name)

    def all_gather(self, input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
        if isinstance(input_, torch.Tensor):
            self._model.touch(input_)
        return self._group.all_gather(input_, dim)

    def all_gatherv(self, input_, dim: int = 0, sizes=None):
        if isinstance(input_, (list, tuple)):
            return [self.all_gatherv(each, dim, sizes) for each in input_]
        if sizes is None:
            return self.all_gather(input_, dim)
        sizes = [int(size) for size in sizes]
        if len(sizes) != self.world_size or input_.shape[dim] != sizes[self.rank_in_group]:
            raise ValueError(f"all_gatherv: sizes {sizes} do not match rank {self.rank_in_group}'s "
                             f"{input_.shape[dim]} rows in a group of {self.world_size}")
        most = max(sizes)
        self._model.touch(input_)
        with self._model.quiet():
            shape = list(input_.shape)
            shape[dim] = most - input_.shape[dim]
            padded = torch.cat([input_, input_.new_zeros(shape)], dim)
        gathered = self._group.all_gather(padded, dim)
        with self._model.quiet():
            return torch.cat([gathered.narrow(dim, rank * most, size)
                              for rank, size in enumerate(sizes)], dim)


def _holders(tensor: torch.Tensor) -> tuple[int, int]:
    """Who holds the input: the tensors sharing its memory (a view the protocol keeps adds one)
    and the references to the tensor itself (a tuple of inputs it keeps adds one)."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata), sys.getrefcount(tensor)


def _construct(protocol_class: type, group):
    """The protocol for one step: given the rank's group where its constructor takes `group`
    (else it finds it through get_pcp_group(), as vLLM code does)."""
    try:
        takes_group = "group" in inspect.signature(protocol_class).parameters
    except (TypeError, ValueError):  # a signature Python cannot read: called without arguments
        takes_group = False
    return protocol_class(group=group) if takes_group else protocol_class()


def run_step(target, tensors, slot_mapping, num_decode_tokens: int, shard: bool,
             counts: list[list[int]], capturing: bool, group) -> tuple[Any, list[tuple]]:
    """The step on this rank: (the concatenated writes, as a gather's return value; the stream
    trace). `shard`: the gather's shard_decode_requests where no protocol runs (a protocol's
    regime shards). `counts`: per rank, [real rows, decode rows]. Raises what the protocol
    raises."""
    inputs = [*tensors, slot_mapping]
    model = StreamModel(inputs, capturing)
    written: list[tuple[list[torch.Tensor], torch.Tensor]] = []

    def update_cache(rows, slots) -> None:
        parts = tuple(rows) if isinstance(rows, (tuple, list)) else (rows,)
        if not parts or not all(isinstance(part, torch.Tensor) for part in parts) \
                or not isinstance(slots, torch.Tensor):
            raise TypeError("update_cache takes rows (a tensor, or one per input tensor) and a "
                            "slot map tensor")
        if len(parts) != len(tensors) or slots.dim() != 1:
            raise ValueError(f"update_cache takes {len(tensors)} row tensor(s) and a 1-D slot "
                             f"map, got {len(parts)} and {slots.dim()}-D")
        for part in (*parts, slots):
            model.touch(part)
        with model.quiet():
            values = slots.tolist()
            written.append(([part.clone() for part in parts], slots.clone()))
        model.write_slots(values)

    for index in range(len(inputs)):
        model.log(WRITE, MAIN_STREAM, INPUT, index)
    tokens_per_rank = [real for real, _ in counts]
    decode_tokens_per_rank = [decodes for _, decodes in counts]
    stream_group = StreamGroup(group, model)
    with model.bound(), rankctx.bound_group(stream_group):
        baseline = [_holders(tensor) for index, tensor in enumerate(inputs)]
        protocol: Any = None if target.protocol is None else _construct(target.protocol,
                                                                       stream_group)
        started = False
        held: list[int] = []
        for step in target.async_order or ASYNC_ORDER:
            model.phase = step
            if step == ORDER_START and protocol is None:
                model.phase = "gather"
                update_cache(*target.call(tensors, slot_mapping, num_decode_tokens, shard,
                                          group=stream_group))
            elif step == ORDER_START:
                answer = protocol.start(tuple(tensors), slot_mapping, num_decode_tokens,
                                        tokens_per_rank, decode_tokens_per_rank, update_cache)
                if not isinstance(answer, bool):
                    raise TypeError(f"start returned {type(answer).__name__}, not a bool")
                started = answer
                model.log(STARTED, HOST, FLAG, int(started))
                if not started:
                    model.phase = "fallback"
                    rows, slots = target.call(tensors, slot_mapping, num_decode_tokens, True,
                                              group=stream_group)
                    update_cache(rows, slots)
            elif step == ORDER_ATTENTION:
                model.log(READ, model.current.id, READER, READER_ATTENTION)
            elif step == ORDER_RELEASE:
                for index, tensor in enumerate(inputs):
                    if any(now > then for now, then in zip(_holders(tensor), baseline[index])):
                        held.append(index)
                    else:
                        model.log(RELEASE, model.current.id, INPUT, index)
            elif step in (ORDER_FINISH, ORDER_FINISH_NO_WAIT) and started:
                if step == ORDER_FINISH:
                    protocol.finish()
                else:
                    protocol.finish(wait=False)
            elif step == ORDER_READER:
                model.log(READ, model.current.id, READER, READER_NEXT)
        model.phase = "end"
        for index in held:
            model.log(RELEASE, model.current.id, INPUT, index)
    with model.quiet():
        if written:
            rows_out = tuple(torch.cat([rows[k] for rows, _ in written]) for k in range(len(tensors)))
            slots_out = torch.cat([slots for _, slots in written])
        else:
            rows_out = tuple(tensor[:0].clone() for tensor in tensors)
            slots_out = slot_mapping[:0].clone()
    return (rows_out, slots_out), model.trace
