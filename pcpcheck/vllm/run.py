"""One release case end to end: every rank lays the step out with its own PCPManager, runs the
release's gather through its MLA or indexer wrapper with real collectives; the driver compares
the layouts with the reference (LAYOUT) and judges the caches (pcpcheck.check.judge).

The seam for process backends is `rank_step(case_json, source_spec, rank)`: plain data in (the
case as JSON, the source as `Source.spec()`), and out a dict holding the rank's layout view, its
gather inputs and the call's outputs: all a driver needs for `check.observe`. It loads the release
itself (once per process), so it can run in a worker process unchanged; the driver never runs
release code for a case (`observe_release_case`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import numpy as np
import torch

import reference
import spec.invariants as inv
from pcpcheck.cases import Case, as_tensor, row_content
from pcpcheck.check import Observation, Prepared, RankView, Violation, judge, observe
from pcpcheck.runner import CollectiveAborted, RankOutcome
from pcpcheck.vllm.layout import differences, expected_view, manager_view
from pcpcheck.vllm.release import (INDEXER_WRAPPER, MLA_WRAPPER, Release, release_from_spec)
from spec.names import DRAFT, DRAFT_REGIMES, LAYOUT, RETURNS, pad_label

# Which entry a case drives, by its tensor count: the indexer wrapper carries k, the MLA wrapper
# (kv_c_normed, k_pe), and three tensors go to the gather itself.
ENTRY_BY_TENSORS = {1: INDEXER_WRAPPER, 2: MLA_WRAPPER}


@dataclass
class ReleaseObservation(Observation):
    layout_diffs: dict[int, list[str]] = field(default_factory=dict)  # manager rank -> lines
    entry: str = ""  # which release function the ranks called


def _entry_name(release: Release, num_tensors: int) -> str:
    name = ENTRY_BY_TENSORS.get(num_tensors)
    return name if name and hasattr(release.gather_module, name) else release.gather.function_name


def _call_entry(release: Release, name: str, tensors, slots, nd: int, shard: bool):
    """Call the release's entry as its callers do; returns ((tensors...), slot_mapping)."""
    if name == release.gather.function_name:
        return release.gather.call(tuple(tensors), slots, nd, shard)
    function = getattr(release.gather_module, name)
    kwargs = {"slot_mapping": slots, "num_decode_tokens": nd, "use_pcp": True}
    if release.caps.wrapper_shard_keyword:
        kwargs[release.caps.wrapper_shard_keyword] = shard
    if name == MLA_WRAPPER:
        kv_c, k_pe, out_slots = function(kv_c_normed=tensors[0], k_pe=tensors[1], **kwargs)
        return (kv_c, k_pe), out_slots
    k, out_slots = function(k=tensors[0], **kwargs)
    return (k,), out_slots


def rank_inputs(case: Case, release: Release, rank: int) -> dict:
    """This rank's layout view (expanded regimes: from its own manager) and gather inputs."""
    batch = case.batch
    if batch.regime in DRAFT_REGIMES:  # later draft steps: replicated, unexpanded (sem section 2)
        lay = reference.layout(batch)
        return {"layout": None, "tokens": lay.tokens[rank].tolist(),
                "slot_map": lay.slot_maps[rank].tolist(),
                "nd": int(lay.num_decode_tokens[rank]), "shard": False}
    view = manager_view(release, batch, rank)
    width, rows = view["width"], view["rows"][rank]
    if len(rows) > width:
        raise ValueError(f"rank {rank} holds {len(rows)} rows, more than the width {width}")
    tokens = rows + [pad_label(rank, j, width) for j in range(len(rows), width)]
    return {"layout": view, "tokens": tokens, "slot_map": view["expanded"][0],
            "nd": view["num_decode_tokens"][rank], "shard": batch.shard_decode_requests}


def rank_step(case_json: str, source_spec: dict, rank: int) -> dict:
    """One rank's whole step (the process seam; see the module docstring)."""
    case = Case.from_json(case_json)
    release = release_from_spec(source_spec)
    report = {"layout_error": None, "error": None, "error_detail": None, "value": None,
              "inputs": None, "entry": _entry_name(release, len(case.tensors))}
    try:
        report.update(rank_inputs(case, release, rank))
    except Exception as exc:  # noqa: BLE001 - the release's manager failed on a well-formed step
        report["layout_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return report
    tensors = tuple(as_tensor(row_content(np.array(report["tokens"], dtype=np.int64), k,
                                          spec.row_bytes), spec)
                    for k, spec in enumerate(case.tensors))
    slots = torch.tensor(report["slot_map"], dtype=torch.int64)
    report["inputs"] = (tensors, slots, report["nd"])
    try:
        report["value"] = _call_entry(release, report["entry"], tensors, slots, report["nd"],
                                      report["shard"])
    except CollectiveAborted:
        pass  # the trace already records the collective that never completed (COLLECTIVE)
    except Exception as exc:  # noqa: BLE001 - the release's verdict, judged as RETURNS
        outcome = RankOutcome()
        outcome.record_error(exc)
        report["error"], report["error_detail"] = outcome.error, outcome.error_detail
    return report


def _prepared(case: Case, reports: list[dict], fallback) -> Prepared:
    """The driver's view of the ranks' inputs (from their reports; the reference layout for a
    rank that has none) and the global write every rank's cache must equal (or shard)."""
    tokens, slot_maps, nds = [], [], []
    for rank, report in enumerate(reports):
        if report and report.get("tokens") is not None:
            tokens.append(np.array(report["tokens"], dtype=np.int64))
            slot_maps.append(np.array(report["slot_map"], dtype=np.int64))
            nds.append(int(report["nd"]))
        else:
            tokens.append(np.asarray(fallback.tokens[rank], dtype=np.int64))
            slot_maps.append(np.asarray(fallback.slot_maps[rank], dtype=np.int64))
            nds.append(int(fallback.num_decode_tokens[rank]))
    sources = [[row_content(tokens[r], k, spec.row_bytes) for k, spec in enumerate(case.tensors)]
               for r in range(len(tokens))]
    expected = [dict(zip(s.tolist(), t.tolist())) for s, t in reference.expected_caches(case.batch)]
    shard = case.batch.shard_decode_requests
    labels = np.unique(np.concatenate(tokens)) if tokens else np.zeros(0, dtype=np.int64)
    return Prepared(case, tokens, sources, slot_maps, nds, shard, expected, labels)


def observe_release_case(case: Case, release: Release, runner) -> ReleaseObservation:
    """Run the case on every rank (rank_step) and judge: LAYOUT, then every gather invariant."""
    batch = case.batch
    outcomes = runner.run(batch.pcp_size, functools.partial(
        rank_step, case.to_json(), release.source.spec()))
    reports = [o.value if isinstance(o.value, dict) else None for o in outcomes]
    expanded = batch.regime not in DRAFT_REGIMES
    era = release.caps.era
    fallback = reference.layout(batch, era=era)
    prepared = _prepared(case, reports, fallback)
    layout_bad, diffs = [], {}
    views = []
    for rank, (outcome, report) in enumerate(zip(outcomes, reports)):
        if report is None or report["layout_error"]:
            why = report["layout_error"] if report else (outcome.error or "no report")
            if expanded:
                layout_bad.append(rank)
                diffs[rank] = [f"the manager raised: {why}"]
            views.append(RankView(error=f"no call: {why}", trace=outcome.trace,
                                  caches=[{} for _ in case.tensors],
                                  rows=[[] for _ in case.tensors]))
            continue
        if expanded:
            want = expected_view(batch, era, rank, release.caps.replicated_method)
            if not inv.layout_conformance(want, report["layout"]):
                layout_bad.append(rank)
                diffs[rank] = differences(want, report["layout"])
        call = RankOutcome(value=report["value"], error=report["error"],
                           error_detail=report["error_detail"], trace=outcome.trace,
                           output=outcome.output)
        views.append(observe(prepared, rank, report["inputs"], call))
    if any(report is None or report["layout_error"] for report in reports):
        violations = [Violation(LAYOUT if expanded else RETURNS,
                                layout_bad or [r for r, rep in enumerate(reports) if not rep])]
        checked = (LAYOUT,) if expanded else (RETURNS,)
    else:
        violations, checked = judge(prepared, views)
        if expanded:
            checked = (LAYOUT, *checked)
            if layout_bad:
                violations.insert(0, Violation(LAYOUT, layout_bad))
    entry = next((r["entry"] for r in reports if r), "")
    return ReleaseObservation(prepared, views, violations, checked, diffs, entry)


class ReleaseRunner:
    """The backend interface engine.search uses, for one release: observe_case(case, target)."""

    def __init__(self, runner, release: Release):
        self.runner = runner
        self.release = release

    def observe_case(self, case: Case, target=None) -> ReleaseObservation:
        return observe_release_case(case, self.release, self.runner)


def era_case(case: Case, release: Release, empty_steps: bool = False) -> Case | None:
    """A drawn case as the release would see it: requests in its batch order, graph padding only
    where it has it (the same extra rows over the widest rank of its own era's layout), one query
    token per decode where it rejects drafts, and no empty step unless asked (None: not a step
    this release runs)."""
    from pcpcheck.vllm.layout import release_order
    batch = case.batch
    empty = not any(r.num_tokens for r in batch.requests)
    if empty and not empty_steps:
        return None
    if DRAFT in release.caps.not_applicable:  # no speculative tokens: a decode has 1 query token
        batch = dataclasses.replace(batch, requests=tuple(
            r if r.prefilling else dataclasses.replace(r, num_tokens=min(r.num_tokens, 1))
            for r in batch.requests))
    ordered = release_order(batch)
    if batch.regime not in DRAFT_REGIMES:
        graph = 0
        if batch.graph_size and release.caps.graph_padding and not empty:  # no graph runs empty
            extra = batch.graph_size - int(reference.layout(batch).counts.max(initial=0))
            widest = reference.layout(dataclasses.replace(ordered, graph_size=0),
                                      era=release.caps.era).counts.max(initial=0)
            graph = int(widest) + max(extra, 1)
        ordered = dataclasses.replace(ordered, graph_size=graph)
    return dataclasses.replace(case, batch=ordered)
