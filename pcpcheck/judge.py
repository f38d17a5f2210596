"""One case end to end: build every rank's inputs, run the target, observe, judge.

The layout and the expected caches come from the numpy reference; the verdicts come from the
predicates of spec/invariants.py, evaluated on the index-level observation (rows as labels).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

import pcpcheck_reference as reference
from pcpcheck.shared.case import LABEL_KEY, Case, as_bytes, as_tensor, row_content
from pcpcheck.shared.wire import Received
from pcpcheck_spec import model
from pcpcheck_spec.names import INCOMPLETE, NO_ROW, Batch
from pcpcheck_spec.registry import Step, evaluate


# Rows of a contiguous range of labels per (tensor index, row bytes), grown on demand: a case's
# input rows are slices of it, not hashed again for every case (row_content is the costliest
# part of preparing a case). A table over _TABLE_BYTES is not kept: those rows are computed.
_TABLE_BYTES = 1 << 20
_tables: dict[tuple[int, int], tuple[int, np.ndarray]] = {}


def contents(labels: np.ndarray, tensor_index: int, row_bytes: int) -> np.ndarray:
    """row_content(labels, tensor_index, row_bytes), for labels of any shape (rows stack on a
    last axis of row_bytes)."""
    if labels.size == 0:
        return np.empty((*labels.shape, row_bytes), dtype=np.uint8)
    low, high = int(labels.min()), int(labels.max()) + 1
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


@dataclass
class Prepared:
    """Everything derived from a case before the target runs."""

    case: Case
    tokens: np.ndarray  # (P, L) input row labels
    sources: list[list[np.ndarray]]  # [rank][tensor] pristine input bytes (L, row_bytes)
    slot_maps: list[np.ndarray]
    nds: list[int]
    shard: bool
    expected: list[dict[int, int]]  # per rank: slot -> token
    labels: np.ndarray  # sorted distinct input row labels, to decode outputs

    _content: dict = field(default_factory=dict, repr=False)
    # What observe already worked out for an earlier rank of this case (ranks often return the
    # same bytes): (tensor index, output bytes) -> labels, and (rows, slots) -> cache.
    _decoded: dict = field(default_factory=dict, repr=False)
    _written: dict = field(default_factory=dict, repr=False)
    # rank -> input_bytes; not carried by dataclasses.replace (another slot map: other bytes)
    _input_bytes: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def size(self) -> int:
        return self.case.batch.pcp_size

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
            self._content[tensor_index] = contents(self.labels, tensor_index, spec.row_bytes)
        return self._content[tensor_index]

    def decoded(self, tensor_index: int, tensor: Received) -> list[int]:
        """decode_rows of one returned tensor, of its input's dtype and trailing shape
        (_malformed), worked out once per distinct content."""
        rows = tensor.rows()
        key = (tensor_index, rows.shape, tensor.content)
        labels = self._decoded.get(key)
        if labels is None:
            labels = self._decoded[key] = _labels_of(rows, self.labels, self.content(tensor_index))
        return list(labels)

    def written(self, rows: list[list[int]], slots: list[int]) -> list[dict[int, int]]:
        """Per tensor, the cache model.write leaves (the kernel rule), worked out once per
        distinct (rows, slots)."""
        caches = []
        slots_key = tuple(slots)
        for tensor_rows in rows:
            key = (tuple(tensor_rows), slots_key)
            cache = self._written.get(key)
            if cache is None:
                cache = self._written[key] = model.write(tensor_rows, slots)
            caches.append(dict(cache))
        return caches

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
    per_tensor = [contents(tokens, k, spec.row_bytes) for k, spec in enumerate(case.tensors)]
    sources = [[rows[rank] for rows in per_tensor] for rank in range(len(tokens))]
    expected = [dict(owned[rank % len(owned)]) for rank in range(len(tokens))]
    return Prepared(case, tokens, sources, list(slot_maps), list(nds), shard, expected, labels)


def plan(batch: Batch) -> tuple:
    """What a case's preparation takes from its batch alone, the reference's layout and caches:
    (tokens, slot maps, nds, shard, the caches each DCP rank must hold, sorted labels). Batches
    recur (hypothesis draws a batch again with other tensors, and shrinks by small steps), so
    this is kept per batch; its arrays are shared by every case of the batch: read only."""
    try:
        hash(batch)
    except TypeError:  # a Batch built by hand with a list somewhere: not kept
        return _reference_plan(batch)
    return _kept_plan(batch)


def _reference_plan(batch: Batch) -> tuple:
    slots = reference.global_slot_maps(batch)  # once, for both the layout and the caches
    layout = reference.layout(batch, slots)
    tokens = np.asarray(layout.tokens, dtype=np.int64).reshape(batch.pcp_size, -1)
    owned = reference.expected_caches(batch, slots)[:reference.dcp_size(batch)]  # D = 1: a replica
    return (tokens, tuple(np.asarray(m, dtype=np.int64) for m in layout.slot_maps),
            tuple(int(n) for n in layout.num_decode_tokens), bool(layout.shard),
            tuple(dict(zip(s.tolist(), t.tolist())) for s, t in owned), np.unique(tokens))


_kept_plan = functools.lru_cache(maxsize=1024)(_reference_plan)


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

    @property
    def mutated(self) -> list[str]:
        """Names of the inputs the call changed in place."""
        names = [f"tensors[{k}]" for k in range(len(self.inputs_before) - 1)] + ["slot_mapping"]
        return [name for name, before, after in zip(names, self.inputs_before, self.inputs_after)
                if before != after]


@dataclass
class Violation:
    invariant: str
    ranks: list[int]  # the ranks on which it fails


@dataclass
class Observation:
    prepared: Prepared
    ranks: list[RankView]
    violations: list[Violation]
    checked: tuple[str, ...]  # invariant IDs evaluated on this case
    note: str = ""  # how its search ended early, if it did (engine: shrinking stopped)

    @property
    def costly(self) -> bool:
        """A rank hung or died: running the case again costs a timeout or a worker."""
        return any(view.lost for view in self.ranks)


def decode_rows(tensor: torch.Tensor, tensor_index: int, valid: np.ndarray,
                content: np.ndarray | None = None) -> list[int]:
    """Labels of a tensor's rows: the input row each one is, bit for bit, else NO_ROW.
    valid: the sorted input labels (Prepared.labels); content: their rows in this tensor
    (row_content of valid; computed here when not given)."""
    rows = as_bytes(tensor)
    if content is None and rows.shape[0] and valid.size:
        content = row_content(valid, tensor_index, rows.shape[1])
    return _labels_of(rows, valid, content)


def _labels_of(rows: np.ndarray, valid: np.ndarray, content: np.ndarray) -> list[int]:
    """decode_rows of rows already read as bytes (rows, row_bytes)."""
    if rows.shape[0] == 0 or valid.size == 0:
        return [NO_ROW] * rows.shape[0]
    claimed = (rows[:, :4].copy().view("<i4").reshape(-1) ^ np.int32(LABEL_KEY)).astype(np.int64)
    position = np.searchsorted(valid, claimed).clip(max=valid.size - 1)
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
                view.rows = [prepared.decoded(k, t) for k, t in enumerate(result.value[0])]
                view.slots = result.value[1].ints()  # an int64 tensor (_malformed)
                view.returned = True
            except Exception as exc:  # noqa: BLE001 - a hostile return (odd layout, ...)
                view.rows, view.slots = [], []
                view.error = f"returned tensors pcpcheck cannot read: {type(exc).__name__}: {exc}"[:300]
    if not view.rows:
        view.rows = [[] for _ in specs]
    view.caches = prepared.written(view.rows, view.slots)
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


def judge(prepared: Prepared, views: list[RankView], regime: str | None = None
          ) -> tuple[list[Violation], tuple[str, ...]]:
    """Evaluate every predicate of spec.registry that applies in `regime` (default: the case's);
    violations in priority order, and the IDs whose predicate actually ran on this case."""
    step = Step(views, prepared.expected, prepared.labels[prepared.labels >= 0].tolist(),
                len(prepared.case.tensors))
    failed, ran = evaluate(step, regime or prepared.case.batch.regime)
    return [Violation(i, ranks) for i, ranks in failed.items()], ran


def run_case(case: Case, target, backend) -> Observation:
    """Run one case on the backend's workers and judge it."""
    return next(run_cases([case], target, backend))


def run_cases(cases, target, backend):
    """The one place a case goes through: prepared here, run on the backend's workers
    (pcpcheck.backends; several may be in flight), observed and judged here, in the driver.
    Yields an Observation per case, in order."""
    prepared = [None]

    def prepare_each():
        for case in cases:
            prepared.append(prepare(case))
            yield prepared[-1]

    for results in backend.run_many(prepare_each(), target):
        done = prepared.pop(1)
        views = [observe(done, rank, result) for rank, result in enumerate(results)]
        violations, checked = judge(done, views)
        yield Observation(done, views, violations, checked)
