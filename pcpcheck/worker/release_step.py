"""One rank's step of a vLLM release, in the worker (release code runs only here): the step in
the release's own batch order (its sort_batch_req_ids, where it has one: `order`), its own
PCPManager lays it out (with its own block tables and slot kernel where they run: `kernels`)
and, where the release's partition_batch runs, builds the rank's local batch: its rows are the
gather's input rows, its boundaries feed the split (pcpcheck.worker.release_batch); then the
release's gather runs through its MLA or indexer wrapper with real collectives.

`rank_step(case_json, source_spec, rank)` runs in a worker process (pcpcheck.worker.main,
release mode): plain data in (the case as JSON, the source as `Source.spec()`); it loads the
release there (once per process) and returns the rank's layout view, its gather inputs and the
call's outputs. The worker sends back the STEP_FIELDS as plain data and the tensors as bytes; the
driver (pcpcheck.judge.release_case) never imports or runs release code.

View fields (every list plain ints/bools): rows (per rank: global token ids in row order),
num_decode_tokens (per rank: leading decode rows), width (W), gidx (padded gather index, P*W),
wmask (KV write mask), restore (hidden restore index, N), replicated (per request; only where
the release has `replicated_requests`), expanded (per KV-cache group: the expanded slot map the
manager builds from the global map with `_convert_to_gathered_slot_mappings`). A draft step
laid out by the release's own draft path (pcpcheck.worker.release_draft) has one field instead:
unexpanded (the first KV-cache group's map its speculators compute; None where it is not).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import pcpcheck_reference as reference
from pcpcheck.shared.case import Case, as_tensor, row_content
from pcpcheck.worker.rankctx import SOLO, bound_dcp, current_group
from pcpcheck.worker.release_code import (
    INDEXER_WRAPPER,
    MLA_WRAPPER,
    Release,
    kernel_step,
    manager_view,
    release_from_spec,
)
from pcpcheck.worker.release_config import regime_configs
from pcpcheck.worker.release_draft import draft_slot_map
from pcpcheck.worker.release_excerpts import step_order
from pcpcheck.worker.runner import CollectiveAborted, RankOutcome
from pcpcheck_spec.names import DCP, DRAFT_REGIMES, SHARDED, Batch

# Which entry a case drives, by its tensor count: the indexer wrapper carries k, the MLA wrapper
# (kv_c_normed, k_pe), and three tensors go to the gather itself.
ENTRY_BY_TENSORS = {1: INDEXER_WRAPPER, 2: MLA_WRAPPER}


def _entry_name(release: Release, num_tensors: int) -> str:
    name = ENTRY_BY_TENSORS.get(num_tensors)
    return name if name in release.calls else release.gather.function_name


def _call_entry(release: Release, name: str, tensors, slots, nd: int, shard: bool,
                batch: Batch):
    """Call the release's entry as its callers do; returns ((tensors...), slot_mapping). A
    wrapper gets the arguments its layers pass (release_calls), what they read from the
    configuration evaluated on the regime's (release_config)."""
    if name == release.gather.function_name:
        return release.gather.call(tuple(tensors), slots, nd, shard)
    assert release.space is not None  # a loaded release keeps its space
    configs = regime_configs(release.space, batch.regime, batch.pcp_size,
                             reference.dcp_size(batch), batch.interleave, batch.block_size)
    if name == INDEXER_WRAPPER:  # its caller's preparation (sparse_attn_indexer.py, restated):
        # k cut to the slot map's tokens, per rank where the map is expanded past k's rows
        tokens = slots.shape[0]
        if tokens > tensors[0].shape[0]:
            tokens //= batch.pcp_size
        tensors = (tensors[0][:tokens],)
    call = release.calls[name]
    configured = call.evaluate(configs.parallel)
    if call.shard in configured and bool(configured[call.shard]) != shard:
        # a regime no configuration of it makes (adapted): the model's answers
        configured = call.evaluate(configs.modelled_parallel)
    args, kwargs = call.arguments((*tensors, slots, nd), configured)
    *rows, out_slots = getattr(release.gather_module, name)(*args, **kwargs)
    return tuple(rows), out_slots


def rank_layout(case: Case, release: Release, rank: int) -> dict:
    """This rank's layout view (expanded regimes: from its own manager) and gather inputs."""
    batch = case.batch
    if batch.regime in DRAFT_REGIMES:  # later draft steps: replicated, unexpanded (sem section 2)
        lay = reference.layout(batch)  # its rows: the global batch, every rank the same
        draft: dict | None = None
        if release.caps.draft_path and kernel_step(release, batch):  # the speculators' own map
            draft = {"unexpanded": draft_slot_map(release, batch)}
        return {"layout": draft, "tokens": lay.tokens[rank].tolist(),
                "slot_map": lay.slot_maps[rank].tolist() if draft is None else draft["unexpanded"],
                "nd": int(lay.num_decode_tokens[rank]), "shard": False}
    view, local = manager_view(release, batch, rank)
    if local.num_tokens > view["width"]:
        raise ValueError(f"rank {rank} holds {local.num_tokens} rows, more than the width "
                         f"{view['width']}")
    # the gather's rows and nd: the rank's local batch (partition_batch's, where it runs)
    return {"layout": view, "tokens": local.labels, "slot_map": view["expanded"][0],
            "nd": local.num_decode_tokens(release.split),
            "shard": batch.regime == SHARDED, "split": release.split is not None}


def in_release_order(case: Case, release: Release) -> tuple[Case, list[int] | None]:
    """The step in the release's own batch order (its sort_batch_req_ids), and that order as
    indices into the drawn step's requests (None: the release has no sort to run)."""
    if release.sort is None:
        return case, None
    order = step_order(release.sort, case.batch)
    requests = tuple(case.batch.requests[i] for i in order)
    return dataclasses.replace(case, batch=dataclasses.replace(case.batch, requests=requests)), order


def rank_step(case_json: str, source_spec: dict, rank: int) -> dict:
    """One rank's whole step (the process seam; see the module docstring)."""
    case = Case.from_json(case_json)
    release = release_from_spec(source_spec)
    report: dict[str, Any] = {
        "layout_error": None, "error": None, "error_detail": None, "value": None, "inputs": None,
        "entry": _entry_name(release, len(case.tensors)), "order": None, "kernels": False,
        "split": False, "slot_map1": None, "group1": None}
    try:
        case, report["order"] = in_release_order(case, release)
        report["kernels"] = kernel_step(release, case.batch) and (
            case.batch.regime not in DRAFT_REGIMES or release.caps.draft_path)
        report.update(rank_layout(case, release, rank))
    except Exception as exc:  # noqa: BLE001 - the release's manager failed on a well-formed step
        report["layout_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return report
    completed = _call(release, case, report, report["slot_map"])
    if completed and release.caps.replicated_group_call(case.batch.regime):
        # the replicated KV group's layers call the gather again, with that group's map
        report["slot_map1"] = report["layout"]["expanded"][1]
        report["group1"] = {"error": None, "error_detail": None,
                            "value": None, "inputs": None, "entry": report["entry"],
                            "nd": report["nd"], "shard": report["shard"], "tokens": report["tokens"],
                            "trace_from": len(current_group().trace)}
        _call(release, case, report["group1"], report["slot_map1"])
    return report


def _call(release: Release, case: Case, report: dict, slot_map: list[int]) -> bool:
    """One call of the release's entry on fresh inputs (the report's tokens, `slot_map`): its
    inputs, value or error go into `report`. Whether it completed (returned or raised)."""
    tensors = tuple(as_tensor(row_content(np.array(report["tokens"], dtype=np.int64), k,
                                          spec.row_bytes), spec)
                    for k, spec in enumerate(case.tensors))
    slots = torch.tensor(slot_map, dtype=torch.int64)
    report["inputs"] = (tensors, slots, report["nd"])
    try:
        dcp = current_group() if case.batch.regime == DCP else SOLO  # D = P in dcp
        with bound_dcp(dcp):
            report["value"] = _call_entry(release, report["entry"], tensors, slots,
                                          report["nd"], report["shard"], case.batch)
    except CollectiveAborted:
        return False  # the trace already records the collective that never completed (COLLECTIVE)
    except Exception as exc:  # noqa: BLE001 - the release's verdict, judged as RETURNS
        outcome = RankOutcome()
        outcome.record_error(exc)
        report["error"], report["error_detail"] = outcome.error, outcome.error_detail
        return False
    return True
