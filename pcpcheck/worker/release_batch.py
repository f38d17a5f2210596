"""A rank's local batch, built by the release's own `PCPManager.partition_batch`, in the worker
(release code runs only here), and read back as plain data.

partition_batch lays the step out (its own `_build_batch_layout` call) and builds the rank's
local batch (semantics section 11): rank r's rows gathered from the global batch with
`_padded_gather_idx[r*L:(r+1)*L]` (`input_ids`, `positions`; padding rows zeroed), its request
boundaries (`query_start_loc`) and prefilling flags. Row i of every K/V tensor the rank computes
carries the token at local row i, and the attention builder's decode/prefill split reads the
boundaries and flags: so the gather's input rows (`LocalBatch.labels`) and its
`num_decode_tokens` (`LocalBatch.num_decode_tokens`) come from that local batch, and a bug in
partition_batch reaches the cache as it would in a deployment.

`partition_path(manager_module, manager) -> PartitionPath`: how the release's partition_batch is
fed, or why it does not run (the gather's rows are then its layout's segments: `from_segments`).
Its parameters after the batch, by name: `batch_desc` (0.31 on), `padded_num_tokens` and
`padded_num_reqs` (0.30). The global batch is the release's own `InputBatch` (a dataclass,
`dataclasses.replace`d into the local one) filled from the step as the model runner fills it;
where the release's input_batch.py cannot run here, `StandInInputBatch` and
`StandInInputBuffers` (FALLBACKS of pcpcheck.worker.release_code) carry the fields it reads.
`batch_desc` is a stand-in with the three fields partition_batch reads (`cg_mode`,
`num_tokens`, `num_reqs`): its class, `BatchExecutionDescriptor`, is imported only for
annotations, from a module that imports most of vLLM.

Global input ids are token + 1: a local row whose id is 0 is one partition_batch zeroed
(padding); a row whose id and position are not one token's carries no token's K/V and is
labelled as padding too (its K/V is junk: where it is written, the cache is wrong).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from pcpcheck.shared.case import pad_label
from pcpcheck.shared.errors import InterfaceDrift
from pcpcheck.shared.step_inputs import positions, step_arrays
from pcpcheck.worker.release_excerpts import rank_num_decode_tokens
from pcpcheck_spec.names import Batch

PARTITION = "partition_batch"
# partition_batch's parameters after the batch that pcpcheck knows how to give (graph padding)
PARTITION_PARAMS = ("batch_desc", "padded_num_tokens", "padded_num_reqs")
# the manager's constructor parameters that size the input buffers partition_batch writes into
BUFFER_SIZES = ("max_num_reqs", "max_num_tokens")
# 0.26-0.29: partition_batch reads the model runner's request states (last sampled tokens,
# prefill lengths, draft tokens) and rebuilds positions and input ids with triton kernels
REQUEST_STATES = "req_states"


@dataclass(init=False)
class StandInInputBatch:
    """The global batch where the release's input_batch.py cannot run here: the fields
    partition_batch reads; `dataclasses.replace` carries every field it writes (any name)."""

    req_ids: list[str]
    num_reqs: int
    idx_mapping_np: np.ndarray
    expanded_local_pos: torch.Tensor
    num_scheduled_tokens: np.ndarray
    num_tokens: int
    query_start_loc_np: np.ndarray
    seq_lens_cpu_upper_bound: torch.Tensor
    num_computed_tokens_np: np.ndarray
    prefill_len_np: np.ndarray
    is_prefilling_np: np.ndarray
    has_prefill: bool
    input_ids: torch.Tensor
    positions: torch.Tensor

    def __init__(self, **fields):
        vars(self).update(fields)


class StandInInputBuffers:
    """The input buffers partition_batch writes a local batch into, where the release's
    input_batch.py cannot run here (dtypes as the model runner's: ids int32, positions int64)."""

    def __init__(self, max_num_reqs: int, max_num_tokens: int, device: torch.device):
        self.max_num_reqs, self.max_num_tokens, self.device = max_num_reqs, max_num_tokens, device
        self.input_ids = torch.zeros(max_num_tokens, dtype=torch.int32)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.int64)
        self.is_padding = torch.zeros(max_num_tokens, dtype=torch.bool)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int32)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32)
        self.dcp_local_seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32)


@dataclass(kw_only=True)
class PartitionPath:
    """How the release's partition_batch is fed (`input_batch` None: not run, `reason` why)."""

    input_batch: Any = None  # the global batch's class: the release's InputBatch, or the stand-in
    params: tuple[str, ...] = ()  # its PARTITION_PARAMS, in its order
    # the manager's CUDAGraphMode (NONE, PIECEWISE), where it takes batch_desc
    graph_modes: tuple[Any, Any] | None = None
    reason: str = ""

    @property
    def real(self) -> bool:
        return self.input_batch is not None

    @property
    def note(self) -> str:
        """How pcpcheck feeds it (the report's adaptations)."""
        given = ("batch_desc: a stand-in (cg_mode, num_tokens, num_reqs), PIECEWISE with the "
                 "graph size where the step has graph padding, else NONE"
                 if "batch_desc" in self.params else
                 "padded_num_tokens: the graph size where the step has graph padding")
        batch = ("pcpcheck's StandInInputBatch (input_batch.py cannot run here)"
                 if self.input_batch is StandInInputBatch else "the release's own InputBatch")
        return (f"PCPManager.partition_batch runs on every expanded step, on {batch} filled "
                f"from the step (input ids token + 1, positions, boundaries, prefill lengths); "
                f"{given}: each rank's gather gets the rows of the local batch it builds, and "
                "the split reads its query_start_loc and prefilling flags")


def partition_path(manager_module, manager) -> PartitionPath:
    """How `manager`'s partition_batch is fed, or why it is not run. InterfaceDrift (one line)
    where it takes a parameter pcpcheck cannot give."""
    function = getattr(manager, PARTITION, None)
    if function is None:
        return PartitionPath(reason=f"its PCPManager has no {PARTITION}")
    init = inspect.signature(manager.__init__).parameters
    if REQUEST_STATES in init:
        return PartitionPath(reason=(
            f"it reads the model runner's request states ({REQUEST_STATES}: last "
            "sampled tokens, prefill lengths, draft tokens) and rebuilds positions and input ids "
            "with triton kernels (prepare_pos_seq_lens, combine_sampled_and_draft_tokens)"))
    missing = [name for name in BUFFER_SIZES if name not in init]
    if missing:
        return PartitionPath(reason=f"its PCPManager.__init__ has no {missing[0]!r}: no input "
                                    f"buffers for {PARTITION} to write into")
    params = list(inspect.signature(function).parameters.values())[2:]  # self, the batch
    for param in params:
        if param.name not in PARTITION_PARAMS and param.default is inspect.Parameter.empty:
            raise InterfaceDrift(f"PCPManager.{PARTITION} takes {param.name!r}, which pcpcheck "
                                 "does not know how to give")
    input_batch = getattr(manager_module, "InputBatch", None)
    if not (isinstance(input_batch, type) and dataclasses.is_dataclass(input_batch)):
        raise InterfaceDrift(f"PCPManager.{PARTITION}: its InputBatch is not a dataclass "
                             "(pcpcheck fills one by its fields)")
    given = tuple(p.name for p in params if p.name in PARTITION_PARAMS)
    modes: Any = getattr(manager_module, "CUDAGraphMode", None)
    if "batch_desc" in given and not isinstance(modes, enum.EnumMeta):  # (an inert is no enum)
        raise InterfaceDrift(f"PCPManager.{PARTITION} takes batch_desc, and its module has no "
                             "CUDAGraphMode enum")
    return PartitionPath(input_batch=input_batch, params=given,
                         graph_modes=(modes.NONE, modes.PIECEWISE) if "batch_desc" in given
                         else None)


def _global_fields(batch: Batch) -> dict[str, Any]:
    """The global batch's fields as the model runner fills them for the step: a decode's tokens
    past its first are its draft tokens; a prefill's prompt ends at its last scheduled token."""
    q, computed, prefilling, starts = step_arrays(batch)
    n, total = len(q), int(starts[-1])
    drafts = np.where(prefilling, 0, np.maximum(q - 1, 0)).astype(np.int32)
    prefill_len = np.where(prefilling, computed + np.maximum(q, 1), computed).astype(np.int32)
    idx_mapping = torch.arange(n, dtype=torch.int32)
    seq_lens = torch.from_numpy(computed + q)
    return dict(
        req_ids=[f"r{k}" for k in range(n)], num_reqs=n, num_reqs_after_padding=n,
        idx_mapping=idx_mapping, idx_mapping_np=idx_mapping.numpy(),
        expanded_idx_mapping=idx_mapping, expanded_local_pos=torch.zeros(n, dtype=torch.int32),
        num_scheduled_tokens=q, num_tokens=total, num_tokens_after_padding=total,
        num_draft_tokens=int(drafts.sum()),
        num_draft_tokens_per_req=drafts if drafts.any() else None,
        query_start_loc=torch.from_numpy(starts), query_start_loc_np=starts,
        seq_lens=seq_lens, seq_lens_cpu_upper_bound=seq_lens.clone(), dcp_local_seq_lens=None,
        dcp_local_seq_lens_cpu_upper_bound=None, num_computed_tokens_np=computed,
        prefill_len_np=prefill_len, num_computed_prefill_tokens_np=np.minimum(computed,
                                                                               prefill_len),
        is_prefilling_np=prefilling, has_prefill=bool(prefilling.any()),
        decode_graph_eligible=not prefilling.any(), max_seq_len_np=None, max_query_len=None,
        input_ids=torch.arange(1, total + 1, dtype=torch.int32),
        positions=torch.from_numpy(positions(batch)), is_padding=torch.zeros(total, dtype=torch.bool),
        logits_indices=torch.from_numpy(starts[1:] - 1).long(),
        cu_num_logits=torch.arange(n + 1, dtype=torch.int32),
        cu_num_logits_np=np.arange(n + 1, dtype=np.int32), has_structured_output_reqs=False,
        prompt_lens=None, fast_prefill=None, pcp=None, prefill_runs_as_decode_np=None,
        num_admitted_draft_tokens=None)


def global_batch(input_batch: Any, batch: Batch):
    """The step's global batch as an instance of the release's InputBatch (its fields only)."""
    given = _global_fields(batch)
    fields = dataclasses.fields(input_batch)
    unknown = [f.name for f in fields if f.name not in given and f.init
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if unknown:
        raise InterfaceDrift(f"InputBatch has a field {unknown[0]!r}, which pcpcheck does not "
                             "know how to give")
    return input_batch(**{f.name: given[f.name] for f in fields if f.init and f.name in given})


@dataclass(kw_only=True)
class LocalBatch:
    """A rank's local batch as plain data: what its gather and its split are given."""

    labels: list[int]  # per local row: the global token it carries, or its padding label
    query_start_loc: list[int]  # its request boundaries (num_reqs + 1)
    is_prefilling: list[bool]  # per local request
    num_tokens: int  # real rows
    max_query_len: int

    @property
    def rows(self) -> list[int]:
        return self.labels[:self.num_tokens]

    def leading_decodes(self) -> int:
        """Tokens of the leading requests that are not prefilling (a split without the
        release's own: the kernel's split under PCP counts short extends as prefills)."""
        first_prefill = next((k for k, p in enumerate(self.is_prefilling) if p),
                             len(self.is_prefilling))
        return self.query_start_loc[first_prefill]

    def num_decode_tokens(self, split) -> int:
        """The nd its gather is given: the release's split (None: leading_decodes)."""
        if split is None:
            return self.leading_decodes()
        return rank_num_decode_tokens(split, self.query_start_loc, self.is_prefilling,
                                      self.num_tokens, self.max_query_len)


def from_segments(segments, prefilling, rank: int, width: int) -> LocalBatch:
    """Rank `rank`'s local batch as its layout's segments say (where partition_batch does not
    run): its rows in local order, then padding to `width`."""
    ordered = sorted(segments, key=lambda s: s.rank_local_batch_slice.start)
    rows = [t for s in ordered for t in range(s.global_batch_slice.start, s.global_batch_slice.stop)]
    counts = [s.num_tokens for s in ordered]
    return LocalBatch(labels=rows + [pad_label(rank, j, width) for j in range(len(rows), width)],
                      query_start_loc=[0, *np.cumsum(counts, dtype=np.int64).tolist()],
                      is_prefilling=[bool(prefilling[s.global_batch_req_idx]) for s in ordered],
                      num_tokens=len(rows), max_query_len=max(counts, default=0))


def _labels(local, batch: Batch, rank: int) -> list[int]:
    """Each local row's global token (its input id less one, where its position is that
    token's), else its padding label (zeroed, or no one token's input)."""
    ids, at = local.input_ids.tolist(), local.positions.tolist()
    token_positions = positions(batch).tolist()
    width = len(ids)
    labels = []
    for row, (input_id, position) in enumerate(zip(ids, at)):
        token = input_id - 1
        real = 0 <= token < len(token_positions) and token_positions[token] == position
        labels.append(token if real else pad_label(rank, row, width))
    return labels


def partition(path: PartitionPath, manager, batch: Batch, rank: int, padded_num_tokens):
    """Run the release's partition_batch on the step's global batch with rank `rank`'s manager:
    (every rank's segments, as the layout it made laid them out; the rank's LocalBatch)."""
    laid_out = []
    build = manager._build_batch_layout

    def recorded(*args, **kwargs):
        result = build(*args, **kwargs)
        laid_out.append(result)
        return result

    manager._build_batch_layout = recorded  # this instance only: the layout partition_batch made
    given = {"padded_num_tokens": padded_num_tokens, "padded_num_reqs": None}
    if path.graph_modes is not None:  # it takes batch_desc
        none, piecewise = path.graph_modes
        given["batch_desc"] = SimpleNamespace(
            cg_mode=none if padded_num_tokens is None else piecewise,
            num_tokens=padded_num_tokens or sum(r.num_tokens for r in batch.requests),
            num_reqs=None)
    local = manager.partition_batch(global_batch(path.input_batch, batch),
                                    **{name: given[name] for name in path.params})
    if not laid_out:
        raise InterfaceDrift(f"PCPManager.{PARTITION} did not call _build_batch_layout")
    num_reqs = int(local.num_reqs)
    max_query_len = getattr(local, "max_query_len", None)  # default.py's prepare_attn reads it
    if max_query_len is None:
        max_query_len = int(np.max(local.num_scheduled_tokens, initial=0))
    return laid_out[-1][0], LocalBatch(
        labels=_labels(local, batch, rank),
        query_start_loc=[int(v) for v in np.asarray(local.query_start_loc_np)[:num_reqs + 1]],
        is_prefilling=[bool(v) for v in np.asarray(local.is_prefilling_np)[:num_reqs]],
        num_tokens=int(local.num_tokens), max_query_len=int(max_query_len))


__all__ = ["LocalBatch", "PARTITION", "PartitionPath", "StandInInputBatch",
           "StandInInputBuffers", "from_segments", "global_batch", "partition", "partition_path"]
