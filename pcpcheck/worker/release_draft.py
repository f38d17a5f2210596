"""A later draft step through the release's own draft path, in the worker (semantics section 2).

After the first draft pass (which reuses the PCP-local batch, laid out as the target step), the
speculators' multi-step decode runs on the global batch, replicated on every PCP rank, with an
unexpanded slot map from the block tables' own kernel:
`self.block_tables.compute_slot_mappings(idx_mapping, query_start_loc, positions, num_tokens)`,
whose map is `num_tokens` long: the step's rows where its map is padded to its DP padding, its
real tokens where not (semantics section 2: both reach the gather). No PCPManager lays these
steps out. Where the release's speculators make that call (read from
vllm/v1/worker/gpu/spec_decode/ by AST, never run) and its kernels run, a draft step's map is the
one that call computes; its first KV-cache group's map goes to the gather, as for expanded steps.
"""

from __future__ import annotations

import ast

import torch

from pcpcheck.shared.step_inputs import positions, step_arrays
from pcpcheck_spec.names import Batch

SPEC_DECODE = "vllm/v1/worker/gpu/spec_decode/"
COMPUTE = "compute_slot_mappings"
# idx_mapping, query_start_loc, positions, the padded token count: the call's positional form
CALL_ARGS = 4


def draft_call_sites(source) -> list[str]:
    """`file:line` of each speculator's `block_tables.compute_slot_mappings(...)` call with the
    four arguments the draft path passes (the release's draft path; [] where it has none)."""
    sites = []
    for relpath in source.files_under(SPEC_DECODE):
        if not relpath.endswith(".py"):
            continue
        try:
            tree = ast.parse(source.read(relpath))
        except SyntaxError:
            continue  # the loader reports a file that does not parse where it runs
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == COMPUTE and len(node.args) == CALL_ARGS
                    and ast.unparse(node.func.value).endswith("block_tables")):
                sites.append(f"{relpath}:{node.lineno}")
    return sites


def draft_slot_map(release, batch: Batch) -> list[int]:
    """The first KV-cache group's unexpanded map of a draft step, as the speculators compute it:
    the release's BlockTables filled with the step's blocks, its kernel on the global batch
    (request i at idx_mapping i, the step's positions), as long as the step's map."""
    q, _, _, starts = step_arrays(batch)
    rows = int(starts[-1]) + (batch.dp_pad if batch.pad_slot_map else 0)
    tables = release.kernels.for_step(batch, 1, 0, max(rows, 1))
    maps = tables.compute_slot_mappings(
        torch.arange(len(q), dtype=torch.int32), torch.from_numpy(starts),
        torch.from_numpy(positions(batch)), rows)
    return [int(v) for v in maps[0].tolist()]


__all__ = ["SPEC_DECODE", "draft_call_sites", "draft_slot_map"]
