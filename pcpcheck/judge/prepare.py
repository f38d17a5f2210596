"""A case prepared in the driver before its target runs: every rank's inputs (the reference's
layout, each row's content carrying its label), slot maps and num_decode_tokens, and the cache
every rank must end with. Nothing here runs a target or judges."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

import pcpcheck_reference as reference
from pcpcheck.shared.case import Case, as_tensor, row_content
from pcpcheck_spec.names import Batch

# Rows of a contiguous range of labels per (tensor index, row bytes), grown on demand: a case's
# input rows are slices of it, not hashed again for every case (row_content is the costliest
# part of preparing a case). A table over _TABLE_BYTES is not kept: those rows are computed.
_TABLE_BYTES = 1 << 20
_tables: dict[tuple[int, int], tuple[int, np.ndarray]] = {}


def contents(labels: np.ndarray, tensor_index: int, row_bytes: int,
             bounds: tuple[int, int] | None = None) -> np.ndarray:
    """row_content(labels, tensor_index, row_bytes), for labels of any shape (rows stack on a
    last axis of row_bytes). `bounds`: the labels' (least, greatest), where the caller knows."""
    if labels.size == 0:
        return np.empty((*labels.shape, row_bytes), dtype=np.uint8)
    low, high = bounds or (int(labels.min()), int(labels.max()))
    high += 1
    key = (tensor_index, row_bytes)
    base, rows = _tables.get(key, (low, None))
    if rows is None or low < base or high > base + len(rows):
        if rows is not None:  # grow by at least the current span, so growth stays rare
            span = len(rows)
            low, high = min(low, base - span), max(high, base + 2 * span)
        if (high - low) * row_bytes > _TABLE_BYTES:
            return row_content(labels.reshape(-1), tensor_index, row_bytes).reshape(
                *labels.shape, row_bytes)
        base, rows = low, row_content(np.arange(low, high, dtype=np.int64), tensor_index, row_bytes)
        _tables[key] = base, rows
    return rows[labels - base]


@dataclass(kw_only=True)
class Prepared:
    """Everything derived from a case before the target runs."""

    case: Case
    # input row labels: (P, L), or one array per rank (a release's ranks report their own)
    tokens: np.ndarray | list[np.ndarray]
    sources: list[list[np.ndarray]]  # [rank][tensor] pristine input bytes (L, row_bytes)
    slot_maps: list[np.ndarray]
    nds: list[int]
    shard: bool
    expected: list[dict[int, int]]  # per rank: slot -> token
    labels: np.ndarray  # sorted distinct input row labels, to decode outputs
    era: str = reference.ERA_CURRENT  # the reference layout's era (a release's: its own)

    _content: dict = field(default_factory=dict, repr=False)
    # What observe already worked out for an earlier rank of this case (ranks often return the
    # same bytes): (tensor index, output bytes) -> labels, and (rows, slots) -> cache.
    decoded_rows: dict = field(default_factory=dict, repr=False)
    written_caches: dict = field(default_factory=dict, repr=False)
    # rank -> input_bytes; not carried by dataclasses.replace (another slot map: other bytes)
    _input_bytes: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def size(self) -> int:
        return self.case.batch.pcp_size

    @property
    def real_rows(self) -> list[int]:
        """Per rank, its real rows (a prefix of its rows: sem section 2)."""
        return [int((np.asarray(tokens) >= 0).sum()) for tokens in self.tokens]

    def input_bytes(self, rank: int) -> list[bytes]:
        """A rank's pristine inputs as bytes, each tensor's then the slot map's: what is sent to
        its worker and what NO_MUTATION compares with (an input reported unchanged is these)."""
        if rank not in self._input_bytes:
            self._input_bytes[rank] = ([source.tobytes() for source in self.sources[rank]]
                                       + [self.slot_maps[rank].tobytes()])
        return self._input_bytes[rank]

    def content(self, tensor_index: int) -> np.ndarray:
        """Rows of every input label (self.labels order) in one tensor, to decode outputs."""
        if tensor_index not in self._content:
            spec = self.case.tensors[tensor_index]
            bounds = (int(self.labels[0]), int(self.labels[-1])) if self.labels.size else None
            self._content[tensor_index] = contents(self.labels, tensor_index, spec.row_bytes,
                                                   bounds)
        return self._content[tensor_index]

    def inputs(self, rank: int):
        """Fresh tensors for one rank's call (the sources stay pristine for NO_MUTATION)."""
        tensors = tuple(as_tensor(source.copy(), spec)
                        for source, spec in zip(self.sources[rank], self.case.tensors))
        slots = self.slot_maps[rank]
        # A 0-element tensor made from numpy has stride 0; real slot maps have stride 1.
        slot_tensor = torch.empty(slots.shape, dtype=torch.int64).copy_(torch.from_numpy(slots))
        return tensors, slot_tensor, self.nds[rank]


def prepare(case: Case) -> Prepared:
    tokens, slot_maps, nds, shard, owned, labels = plan(case.batch)
    bounds = (int(labels[0]), int(labels[-1])) if labels.size else None  # labels: sorted
    per_tensor = [contents(tokens, k, spec.row_bytes, bounds) for k, spec in enumerate(case.tensors)]
    sources = [[rows[rank] for rows in per_tensor] for rank in range(len(tokens))]
    expected = [dict(owned[rank % len(owned)]) for rank in range(len(tokens))]
    return Prepared(case=case, tokens=tokens, sources=sources, slot_maps=list(slot_maps),
                    nds=list(nds), shard=shard, expected=expected, labels=labels)


def plan(batch: Batch, era: str = reference.ERA_CURRENT) -> tuple:
    """What a case's preparation takes from its batch alone, the reference's layout (of `era`)
    and caches: (tokens, slot maps, nds, shard, the caches each DCP rank must hold, sorted
    labels). Batches recur (hypothesis draws a batch again with other tensors, and shrinks by
    small steps), so this is kept per batch; its arrays are shared by every case of the batch:
    read only."""
    try:
        hash(batch)
    except TypeError:  # a Batch built by hand with a list somewhere: not kept
        return _reference_plan(batch, era)
    return _kept_plan(batch, era)


def _reference_plan(batch: Batch, era: str) -> tuple:
    slots = reference.global_slot_maps(batch)  # once, for both the layout and the caches
    layout = reference.layout(batch, slots, era=era)
    tokens = np.asarray(layout.tokens, dtype=np.int64).reshape(batch.pcp_size, -1)
    owned = reference.expected_caches(batch, slots)[:reference.dcp_size(batch)]  # D = 1: a replica
    return (tokens, tuple(np.asarray(m, dtype=np.int64) for m in layout.slot_maps),
            tuple(int(n) for n in layout.num_decode_tokens), bool(layout.shard),
            tuple(dict(zip(s.tolist(), t.tolist())) for s, t in owned), np.unique(tokens))


_kept_plan = functools.lru_cache(maxsize=1024)(_reference_plan)
