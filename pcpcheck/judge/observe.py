"""One rank's call at the index level, observed in the driver from its worker's plain-data
report: each returned row decoded, bit for bit, to the input row it is (else NO_ROW), the cache
the kernel rule leaves (spec.model.write, never impl's), what it printed and did to its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from pcpcheck.judge.prepare import Prepared
from pcpcheck.shared.case import LABEL_KEY, as_bytes, as_tensor, row_content
from pcpcheck.shared.wire import Received
from pcpcheck_spec import model
from pcpcheck_spec.names import INCOMPLETE, NO_ROW


@dataclass
class RankView:
    """What one rank did, at the index level."""

    error: str | None = None  # the target's exception or a malformed return, one line
    error_detail: str | None = None
    returned: bool = False  # the call returned well-formed outputs
    rows: list[list[int]] = field(default_factory=list)  # per tensor: output row labels
    slots: list[int] = field(default_factory=list)
    caches: list[dict[int, int]] = field(default_factory=list)  # per tensor, after the kernel
    trace: list[tuple] = field(default_factory=list)
    output: str = ""  # what the rank printed
    inputs_before: list[bytes] = field(default_factory=list)  # each input's content
    inputs_after: list[bytes] = field(default_factory=list)
    seconds: float = 0.0  # how long the call ran
    lost: str | None = None  # "hung" or "died": it never reported (its worker was retired)
    streams: list[tuple] | None = None  # an asynchronous step's stream trace, if it returned

    @property
    def mutated(self) -> list[str]:
        """Names of the inputs the call changed in place."""
        names = [f"tensors[{k}]" for k in range(len(self.inputs_before) - 1)] + ["slot_mapping"]
        return [name for name, before, after in zip(names, self.inputs_before, self.inputs_after)
                if before != after]

def decode_rows(tensor: torch.Tensor, tensor_index: int, valid: np.ndarray,
                content: np.ndarray | None = None) -> list[int]:
    """Labels of a tensor's rows: the input row each one is, bit for bit, else NO_ROW.
    valid: the sorted input labels (Prepared.labels); content: their rows in this tensor
    (row_content of valid; computed here when not given)."""
    rows = as_bytes(tensor)
    if content is None and rows.shape[0] and valid.size:
        content = row_content(valid, tensor_index, rows.shape[1])
    # still None only with no rows or no labels, where _labels_of reads no content
    return _labels_of(rows, valid, cast(np.ndarray, content))


def _labels_of(rows: np.ndarray, valid: np.ndarray, content: np.ndarray) -> list[int]:
    """decode_rows of rows already read as bytes (rows, row_bytes)."""
    if rows.shape[0] == 0 or valid.size == 0:
        return [NO_ROW] * rows.shape[0]
    claimed = (rows[:, :4].copy().view("<i4").reshape(-1) ^ np.int32(LABEL_KEY)).astype(np.int64)
    position = np.minimum(np.searchsorted(valid, claimed), valid.size - 1)
    genuine = (valid[position] == claimed) & (content[position] == rows).all(axis=1)
    return np.where(genuine, claimed, NO_ROW).tolist()


def blank_cache(spec, tensor_index: int, num_blocks: int, block_size: int) -> torch.Tensor:
    """(For tests reading a real torch cache.) A cache (num_blocks, B, *trailing) whose every
    slot holds the never-written marker: the content of label NO_ROW, which is no input row, so
    a written slot always differs from it."""
    marker = row_content(np.array([NO_ROW]), tensor_index, spec.row_bytes)
    content = np.broadcast_to(marker, (num_blocks * block_size, spec.row_bytes))
    return as_tensor(content.copy(), spec).reshape(num_blocks, block_size, *spec.trailing)


def cache_labels(cache: torch.Tensor, tensor_index: int, valid: np.ndarray) -> dict[int, int]:
    """A cache tensor at the index level: slot -> label of every slot that was written."""
    rows = as_bytes(cache.reshape(-1, *cache.shape[2:]))
    marker = row_content(np.array([NO_ROW]), tensor_index, rows.shape[1])
    written = np.flatnonzero(~(rows == marker).all(axis=1))
    labels = decode_rows(cache.reshape(-1, *cache.shape[2:])[written], tensor_index, valid)
    return dict(zip(written.tolist(), labels))

def _decoded(prepared: Prepared, tensor_index: int, tensor: Received) -> list[int]:
    """decode_rows of one returned tensor, of its input's dtype and trailing shape
    (_malformed), worked out once per distinct content of the case."""
    key = (tensor_index, tensor.shape, tensor.content)
    labels = prepared.decoded_rows.get(key)
    if labels is None:
        labels = prepared.decoded_rows[key] = _labels_of(tensor.rows(), prepared.labels,
                                                         prepared.content(tensor_index))
    return list(labels)


def written(prepared: Prepared, rows: list[list[int]], slots: list[int]) -> list[dict[int, int]]:
    """Per tensor, the cache model.write leaves (the kernel rule), worked out once per
    distinct (rows, slots) of the case."""
    caches = []
    slots_key = tuple(slots)
    for tensor_rows in rows:
        key = (tuple(tensor_rows), slots_key)
        cache = prepared.written_caches.get(key)
        if cache is None:
            cache = prepared.written_caches[key] = model.write(tensor_rows, slots)
        caches.append(dict(cache))
    return caches


def observe(prepared: Prepared, rank: int, result) -> RankView:
    """One rank's call at the index level, from what its worker reported (a
    pcpcheck.backends.RankResult: plain data, returned tensors as wire.Received)."""
    view = RankView(error=result.error, error_detail=result.error_detail, trace=result.trace,
                    output=result.output, seconds=result.seconds, lost=result.lost)
    specs = prepared.case.tensors
    if view.error is None and not incomplete(result.trace):
        problem = _malformed(result.value, specs, torch.int64, result.input_device)
        if problem:
            view.error = f"returned {problem}"
        else:
            try:
                view.rows = [_decoded(prepared, k, t) for k, t in enumerate(result.value[0])]
                view.slots = result.value[1].ints()  # an int64 tensor (_malformed)
                view.returned = True
            except Exception as exc:  # noqa: BLE001 - a hostile return (odd layout, ...)
                view.rows, view.slots = [], []
                view.error = f"returned tensors pcpcheck cannot read: {type(exc).__name__}: {exc}"[:300]
    if view.returned:
        view.streams = getattr(result, "streams", None)
    if not view.rows:
        view.rows = [[] for _ in specs]
    view.caches = written(prepared, view.rows, view.slots)
    view.inputs_before = list(prepared.input_bytes(rank))
    # None for the whole: a rank that never reported, its inputs unknown, not mutated. None for
    # an input: unchanged, the driver's bytes. A report of another length keeps its length
    # (NO_MUTATION compares the lists whole).
    before = view.inputs_before
    after = result.inputs_after if result.inputs_after is not None else [None] * len(before)
    view.inputs_after = [before[k] if now is None and k < len(before) else now
                         for k, now in enumerate(after)]
    return view


def incomplete(trace) -> bool:
    """Whether a rank's trace records a collective or call that never completed."""
    return any(entry[0] == INCOMPLETE for entry in trace)


def _malformed(value, specs, slot_dtype: torch.dtype, device: str) -> str | None:
    """Why a return value is not (tuple of tensors like the inputs, 1-D slot tensor of the input
    map's dtype on its device): an int32 map for an int64 one is bug class 8 in its direct form."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return f"{type(value).__name__}, not a pair (tensors, slot_mapping)"
    tensors, slots = value
    if not isinstance(tensors, (tuple, list)) or not all(isinstance(t, Received) for t in tensors):
        return f"{type(tensors).__name__} as tensors, not a tuple of tensors"
    if len(tensors) != len(specs):
        return f"{len(tensors)} tensor(s) for {len(specs)} input(s)"
    for k, (tensor, spec) in enumerate(zip(tensors, specs)):
        if tensor.dtype != spec.torch_dtype or tuple(tensor.shape[1:]) != spec.trailing:
            return (f"tensor {k} as {tensor.dtype} {tuple(tensor.shape)}; it went in as "
                    f"{spec.torch_dtype} (L, {', '.join(map(str, spec.trailing))})")
        if tensor.device != device:
            return f"tensor {k} on {tensor.device}; it went in on {device}"
    if not isinstance(slots, Received) or slots.dim() != 1:
        return (f"slot_mapping as {type(slots).__name__} {getattr(slots, 'dtype', '')} "
                f"{tuple(getattr(slots, 'shape', ()))}, not a 1-D tensor")
    if slots.dtype != slot_dtype or slots.device != device:
        return (f"slot_mapping as {slots.dtype} on {slots.device}; it went in as {slot_dtype} "
                f"on {device}")
    return None
