"""A step's layout as plain lists: from a release's PCPManager (one per rank) and from the
reference model of the release's era, so LAYOUT (spec/invariants.py) compares like with like.

View fields (every list plain ints/bools): rows (per rank: global token ids in row order),
num_decode_tokens (per rank: leading decode rows), width (W), gidx (padded gather index, P*W),
wmask (KV write mask), restore (hidden restore index, N), replicated (per request; only where
the release has `replicated_requests`), expanded (per KV-cache group: the expanded slot map the
manager builds from the global map with `_convert_to_gathered_slot_mappings`).

Also the release's batch order (pcp-semantics section 9): `release_order`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

import pcpcheck_reference as reference
from pcpcheck_spec.names import DCP, PAD_SLOT_ID, SHARDED, Batch

# The second KV-cache group's map: the first group's slots moved by this many (a second block
# table), so the 2-D path of `_convert_to_gathered_slot_mappings` is exercised per row.
SECOND_GROUP_OFFSET = 1 << 20


def release_order(batch: Batch) -> Batch:
    """The step in the model runner's order (section 9, 0.33's key): decodes with draft tokens
    first, then requests whose scheduled length equals the decode query length (1), then by
    length; the prefilling flag is not in the key, so a 1-token continued prefill stands among
    the decodes. The sort is stable."""
    def key(request):
        drafts = not request.prefilling and request.num_tokens > 1
        return (not drafts, request.num_tokens != 1, request.num_tokens)
    return dataclasses.replace(batch, requests=tuple(sorted(batch.requests, key=key)))


def global_maps(batch: Batch, dcp_rank: int) -> np.ndarray:
    """(2, N) global slot maps of two KV-cache groups as DCP rank `dcp_rank` computes them."""
    first = reference.global_slots(batch, dcp_rank)
    second = np.where(first >= 0, first + SECOND_GROUP_OFFSET, PAD_SLOT_ID)
    return np.stack((first, second))


def step_arrays(batch: Batch):
    """The manager's inputs: (num_scheduled_tokens, num_computed_tokens, is_prefilling,
    query_start_loc_np) as the model runner passes them."""
    q = np.array([r.num_tokens for r in batch.requests], dtype=np.int32)
    computed = np.array([r.context_len for r in batch.requests], dtype=np.int32)
    prefilling = np.array([r.prefilling for r in batch.requests], dtype=np.bool_)
    starts = np.zeros(len(q) + 1, dtype=np.int32)
    np.cumsum(q, out=starts[1:])
    return q, computed, prefilling, starts


def _leading_decodes(rows_of_requests: list[tuple[int, int]], prefilling) -> int:
    """nd: tokens of the leading rows whose request is a decode (the kernel's split under PCP
    counts short extends as prefills; sem section 9)."""
    total = 0
    for request, length in rows_of_requests:
        if prefilling[request]:
            break
        total += length
    return total


def reference_view(batch: Batch, era: str, with_replicated: bool = True) -> dict:
    """The reference model's layout of `batch` in `era`, as every rank's manager must see it."""
    lay = reference.layout(batch, era=era)
    pp, width = batch.pcp_size, lay.width
    n = sum(r.num_tokens for r in batch.requests)
    gidx = lay.gidx.tolist()
    view = {
        "rows": [gidx[r * width: r * width + int(lay.counts[r])] for r in range(pp)],
        "num_decode_tokens": [int(v) for v in lay.num_decode_tokens],
        "width": width,
        "gidx": gidx,
        "wmask": lay.wmask.tolist(),
        "restore": reference.hidden_restore_index(lay, n).tolist(),
    }
    if with_replicated:
        view["replicated"] = reference.replicated_requests(batch, era)
    view["expanded"] = {}
    return view


def expected_expanded(batch: Batch, era: str, dcp_rank: int) -> list[list[int]]:
    lay = reference.layout(batch, era=era)
    return [reference.expand_slot_mapping(lay.gidx, lay.wmask, group).tolist()
            for group in global_maps(batch, dcp_rank)]


def make_manager(release, batch: Batch, rank: int):
    """Rank `rank`'s PCPManager for the step's regime, on CPU."""
    kwargs = dict(pcp_world_size=batch.pcp_size, pcp_rank=rank, device=torch.device("cpu"),
                  dcp_world_size=reference.dcp_size(batch), dcp_rank=rank if batch.regime == DCP else 0)
    if "cp_interleave" in release.manager_params:
        kwargs["cp_interleave"] = batch.interleave
    if release.caps.manager_shards:
        kwargs["shard_decode_requests"] = batch.regime == SHARDED
    return release.manager(**kwargs)


def manager_view(release, batch: Batch, rank: int) -> dict:
    """What rank `rank`'s own manager lays out (every rank's rows, as this rank sees them)."""
    manager = make_manager(release, batch, rank)
    q, computed, prefilling, starts = step_arrays(batch)
    kwargs = {}
    if batch.graph_size and release.caps.graph_padding:
        kwargs["padded_num_tokens"] = batch.graph_size
    segments_by_rank, _ = manager._build_batch_layout(q, computed, prefilling, starts, **kwargs)
    rows, nds = [], []
    for segments in segments_by_rank:
        ordered = sorted(segments, key=lambda s: s.rank_local_batch_slice.start)
        rows.append([t for s in ordered
                     for t in range(s.global_batch_slice.start, s.global_batch_slice.stop)])
        nds.append(_leading_decodes([(s.global_batch_req_idx, s.num_tokens) for s in ordered],
                                    prefilling))
    gidx = _plain(manager._padded_gather_idx)
    view = {
        "rows": rows,
        "num_decode_tokens": nds,
        "width": len(gidx) // batch.pcp_size,
        "gidx": gidx,
        "wmask": [bool(v) for v in _plain(manager._gathered_kv_write_mask)],
        "restore": _plain(manager._hidden_restore_idx),
    }
    if release.caps.replicated_method:
        view["replicated"] = [bool(v) for v in manager.replicated_requests(q, prefilling)]
    maps = torch.from_numpy(global_maps(batch, rank if batch.regime == DCP else 0))
    expanded = manager._convert_to_gathered_slot_mappings(maps)
    view["expanded"] = [[int(v) for v in row] for row in _plain(expanded)]
    return view


def _plain(value) -> list:
    if isinstance(value, torch.Tensor):
        return value.cpu().tolist()
    return np.asarray(value).tolist()


def expected_view(batch: Batch, era: str, rank: int, with_replicated: bool) -> dict:
    """reference_view plus the expanded maps rank `rank`'s manager must build."""
    view = reference_view(batch, era, with_replicated)
    view["expanded"] = expected_expanded(batch, era, rank if batch.regime == DCP else 0)
    return view


def differences(expected: dict, actual: dict) -> list[str]:
    """One line per differing field: reference | release (side by side)."""
    lines = []
    for key in actual:
        if actual[key] != expected.get(key):
            lines.append(f"{key:<18} reference {expected.get(key)}\n"
                         f"{'':<18} release   {actual[key]}")
    return lines
