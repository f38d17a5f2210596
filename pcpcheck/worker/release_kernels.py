"""A release's block tables and slot-mapping kernels (`BlockTables` in
vllm/v1/worker/gpu/block_table.py, its helpers in buffer_utils.py), run on CPU under triton's
interpreter, in the worker (release code runs only there).

`load_block_tables(source, space, triton_loaded) -> BlockTablesPath`: the release's
`BlockTables` class, from the release's space where `provide_kernels` ran, or why the stage
stays modeled (triton not installed: `pip install 'pcpcheck[kernels]'`; no block_table.py
in the source). `BlockTablesPath.for_step(batch, dcp_size, dcp_rank)` gives the release's own
`BlockTables` filled with the step's two KV-cache groups (`append_block_ids`,
`apply_staged_writes`), which the release's PCPManager then drives through its own
`prepare_slot_mappings` -> `compute_slot_mappings` -> `_compute_slot_mappings_kernel`.

Adaptations (listed in the report): TRITON_INTERPRET=1 is set before triton is imported; masks
that reach the interpreter as int8 (`~sharded | is_local` over a bool tensor) are cast to bool in
its masked load and store, which refuse them otherwise ("mask has unsupported dtype"); UVA
buffers are unpinned CPU tensors that are their own device view; one filled BlockTables
serves every rank of a step, its `cp_rank` set per rank; and a slot kernel's result is reused for the same exact
inputs (the interpreter is slow; ranks of a D = 1 step compute the same map).
"""

from __future__ import annotations

import collections
import inspect
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pcpcheck.shared.errors import InterfaceDrift, LoadError
from pcpcheck.shared.step_inputs import group_blocks
from pcpcheck.worker.loader import exec_release_file
from pcpcheck.worker.release_interpreter import MASK_CAST, adapt
from pcpcheck.worker.standins import INSTALL_KERNELS, StandInSpace
from pcpcheck_spec.names import Batch

if TYPE_CHECKING:  # annotations only
    from pcpcheck.shared.source import Source

BLOCK_TABLE = "vllm/v1/worker/gpu/block_table.py"
BUFFER_UTILS = "vllm/v1/worker/gpu/buffer_utils.py"
NO_TRITON = f"triton is not installed ({INSTALL_KERNELS})"
ROW_SLACK = 8  # block-table entries past the longest request's blocks (zeros)
# Filled BlockTables kept per worker process, by their exact step inputs (with their slot
# kernels' results): a whole regime's at 1,000 steps, so the next regime's same steps
# (sharded then replicated draw the same ones, D = 1 in both) reuse them; about 40 KB each.
CACHE_SIZE = 2048


def masks_dummy_requests(text: str) -> bool:
    """Whether block_table.py's slot kernel (its `text`) tests the request index it loads from
    `idx_mapping` against 0 (0.31 on: `idx_mapping == -1` marks a dummy request, whose tokens
    get no slot). Read from the code, not from running it: a kernel that fails to mask its
    dummies is then judged, not taken for one that has none."""
    kernel = text.partition("def _compute_slot_mappings_kernel(")[2].split("\n@", 1)[0]
    loaded = re.search(r"(\w+)\s*=\s*tl\.load\(\s*idx_mapping\b", kernel)
    return bool(loaded and re.search(rf"\b{loaded.group(1)}\s*(>=\s*0|<\s*0|[!=]=\s*-1)",
                                     kernel))


def import_triton():
    """(triton, triton.language) in interpreter mode, or None when triton is not installed."""
    os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel is decorated: before the exec
    try:
        import triton
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return None
    adapt(interpreter, tl)  # once per process: pcpcheck.worker.release_interpreter
    return triton, tl


def provide_kernels(space: StandInSpace, triton, tl) -> None:
    """What the release's kernels and buffers need on CPU, provided in the release's space
    before any of its modules runs (each one listed in the report)."""
    space.provide("vllm.triton_utils", "triton", triton)  # in interpreter mode
    space.provide("vllm.triton_utils", "tl", tl)
    # On CPU the host buffer is the device view: UVA is available and the view is the tensor.
    space.provide("vllm.utils.platform_utils", "is_uva_available", lambda: True)
    space.provide("vllm.utils.torch_utils", "get_accelerator_view_from_cpu_tensor",
                  lambda tensor: tensor)


class UnpinnedTorch:
    """torch for buffer_utils: host buffers allocated unpinned (pinning needs an accelerator)."""

    def __getattr__(self, name):
        function = getattr(torch, name)
        if name not in ("zeros", "empty", "ones", "full", "tensor"):
            return function
        return lambda *args, pin_memory=False, **kwargs: function(*args, **kwargs)


@dataclass(kw_only=True)
class BlockTablesPath:
    """The release's BlockTables (None: modeled, `reason` says why)."""

    block_tables: Any = None  # the release's class
    reason: str = ""
    adapted: list[str] = field(default_factory=list)
    launches: int = 0  # slot-kernel launches run (not served from the cache)
    dummies: bool = False  # its slot kernel masks dummy requests (masks_dummy_requests)
    last_global: torch.Tensor | None = None  # the last slot-kernel call's global maps
    _filled: collections.OrderedDict = field(default_factory=collections.OrderedDict)

    @property
    def real(self) -> bool:
        return self.block_tables is not None

    def for_step(self, batch: Batch, dcp_size: int, dcp_rank: int, max_tokens: int,
                 second_replicated: bool = False):
        """The release's BlockTables holding this step's block ids, for DCP rank `dcp_rank`.
        One filled instance serves every rank of a step (filling does not read the rank; each
        rank's manager sets it before its slot kernel runs: ranks lay out one after another)."""
        tables = group_blocks(batch, second_replicated)
        key = (tuple(tables), batch.block_size, dcp_size, batch.interleave, max_tokens,
               second_replicated)
        filled = self._filled.get(key)
        if filled is None:
            filled = self._fill(tables, batch, dcp_size, max_tokens, second_replicated)
            self._filled[key] = filled
            if len(self._filled) > CACHE_SIZE:
                self._filled.popitem(last=False)
        else:
            self._filled.move_to_end(key)
        filled.cp_rank = dcp_rank
        return filled

    def _fill(self, tables, batch: Batch, dcp_size: int, max_tokens: int,
              second_replicated: bool):
        num_reqs = max(len(tables), 1)
        # rows wider than any request's blocks, as the release sizes them (by the longest
        # sequence): a kernel reading past a request's blocks reads 0, never other memory
        width = max([len(t[1]) for t in tables] + [1]) + ROW_SLACK
        sizes = [batch.block_size] * 2
        offered = dict(block_sizes=sizes, kernel_block_sizes=sizes, max_num_reqs=num_reqs,
                       max_num_batched_tokens=max_tokens, max_num_blocks_per_group=[width] * 2,
                       device=torch.device("cpu"), cp_size=dcp_size, cp_rank=0,
                       cp_interleave=batch.interleave, dcp_sharded=[True, not second_replicated])
        params = inspect.signature(self.block_tables.__init__).parameters
        required = [name for name, p in params.items() if name != "self"
                    and p.default is inspect.Parameter.empty and name not in offered]
        if required:
            raise InterfaceDrift(f"BlockTables.__init__ takes {required[0]!r}, which pcpcheck "
                                 "does not know how to give")
        tables_obj = self.block_tables(**{k: v for k, v in offered.items() if k in params})
        for index, blocks in enumerate(tables):
            tables_obj.append_block_ids(index, blocks, True)
        tables_obj.apply_staged_writes()
        tables_obj._pcpcheck_results = {}
        return tables_obj


def _cached_compute(block_tables: type[Any], path: BlockTablesPath) -> type[Any]:
    """BlockTables whose compute_slot_mappings reuses its kernel's result for the same exact
    inputs (the same filled tables and rank, idx_mapping, query_start_loc, positions and out shape)."""
    compute = block_tables.compute_slot_mappings

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded,
                              out=None, **kwargs):
        buffer = self.slot_mappings if out is None else out
        key = (self.cp_rank, idx_mapping.numpy().tobytes(), query_start_loc.numpy().tobytes(),
               positions.numpy().tobytes(), int(num_tokens_padded), tuple(buffer.shape),
               tuple(sorted(kwargs.items())))
        done = self._pcpcheck_results.get(key)
        if done is not None:
            buffer.copy_(done)
            result = buffer[:, :num_tokens_padded]
        else:
            result = compute(self, idx_mapping, query_start_loc, positions, num_tokens_padded,
                             out=out, **kwargs)
            path.launches += 1
            self._pcpcheck_results[key] = buffer.clone()
        path.last_global = result  # the global maps, a dummy request's tokens included
        return result

    return type("BlockTables", (block_tables,), {"compute_slot_mappings": compute_slot_mappings,
                                                 "__module__": block_tables.__module__})


def load_block_tables(source: Source, space: StandInSpace, triton_loaded: bool) -> BlockTablesPath:
    """The release's BlockTables (from its space, where provide_kernels ran) under triton's
    interpreter, or the reason it stays modeled."""
    if not source.has(BLOCK_TABLE):
        return BlockTablesPath(reason=f"{BLOCK_TABLE} is not in this source")
    if not triton_loaded:
        return BlockTablesPath(reason=NO_TRITON)
    try:
        module = exec_release_file(source, BLOCK_TABLE, space)
    except LoadError as exc:
        raise InterfaceDrift(f"{BLOCK_TABLE}: {exc}") from None
    block_tables: Any = getattr(module, "BlockTables", None)  # a release's class: checked below
    for name in ("compute_slot_mappings", "append_block_ids", "apply_staged_writes"):
        if not hasattr(block_tables, name):
            raise InterfaceDrift(f"{BLOCK_TABLE}: BlockTables has no {name} (renamed or removed "
                                 "in this release)")
    path = BlockTablesPath(adapted=[
        "TRITON_INTERPRET=1: the release's triton kernels run on CPU in triton's interpreter",
        MASK_CAST, "buffer_utils: UVA buffers are unpinned CPU tensors, their own device view",
        "BlockTables: one filled per step, its cp_rank set per rank; a slot-kernel result "
        "reused for the same exact inputs"])
    path.block_tables = _cached_compute(block_tables, path)
    path.dummies = masks_dummy_requests(source.read(BLOCK_TABLE))
    return path


__all__ = ["BLOCK_TABLE", "BUFFER_UTILS", "BlockTablesPath", "NO_TRITON", "import_triton",
           "load_block_tables", "masks_dummy_requests", "provide_kernels", "UnpinnedTorch"]
