"""One release case end to end: every rank lays the step out with its own PCPManager, runs the
release's gather through its MLA or indexer wrapper with real collectives; the driver compares
the layouts with the reference (LAYOUT) and judges the caches (pcpcheck.check.judge).

`rank_step(case_json, source_spec, rank)` runs in a worker process (pcpcheck.backends.worker,
release mode): plain data in (the case as JSON, the source as `Source.spec()`); it loads the
release there (once per process) and returns the rank's layout view, its gather inputs and the
call's outputs. The worker sends back the STEP_FIELDS as plain data and the tensors as bytes; the
driver (`observe_release_case`) never imports or runs release code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

import pcpcheck_reference as reference
from pcpcheck.cases import Case, as_tensor, row_content
from pcpcheck.backends.base import ReleaseInfo, ReleaseStep
from pcpcheck.check import Observation, Prepared, RankView, Violation, judge, observe
from pcpcheck.runner import CollectiveAborted, RankOutcome
from pcpcheck.vllm.layout import differences, expected_view, manager_view
from pcpcheck.vllm.release import (INDEXER_WRAPPER, MLA_WRAPPER, Capabilities, Release,
                                   release_from_spec)
from pcpcheck_spec.model import pad_label
from pcpcheck_spec.names import DRAFT, DRAFT_REGIMES, LAYOUT, RETURNS, SHARDED
from pcpcheck_spec.registry import BY_ID

# Which entry a case drives, by its tensor count: the indexer wrapper carries k, the MLA wrapper
# (kv_c_normed, k_pe), and three tensors go to the gather itself.
ENTRY_BY_TENSORS = {1: INDEXER_WRAPPER, 2: MLA_WRAPPER}
# What a worker sends back of a rank's step, as plain data (tensors travel as bytes).
STEP_FIELDS = ("layout", "tokens", "slot_map", "nd", "shard", "entry", "layout_error")


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
            "nd": view["num_decode_tokens"][rank], "shard": batch.regime == SHARDED}


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


def _prepared(case: Case, steps: list, fallback) -> Prepared:
    """The driver's view of the ranks' inputs (from their reports; the reference layout for a
    rank that has none) and the global write every rank's cache must equal (or shard)."""
    tokens, slot_maps, nds = [], [], []
    for rank, step in enumerate(steps):
        if step is not None and step.get("tokens") is not None:
            tokens.append(np.array(step["tokens"], dtype=np.int64))
            slot_maps.append(np.array(step["slot_map"], dtype=np.int64))
            nds.append(int(step["nd"]))
        else:
            tokens.append(np.asarray(fallback.tokens[rank], dtype=np.int64))
            slot_maps.append(np.asarray(fallback.slot_maps[rank], dtype=np.int64))
            nds.append(int(fallback.num_decode_tokens[rank]))
    sources = [[row_content(tokens[r], k, spec.row_bytes) for k, spec in enumerate(case.tensors)]
               for r in range(len(tokens))]
    expected = [dict(zip(s.tolist(), t.tolist())) for s, t in reference.expected_caches(case.batch)]
    shard = case.batch.regime == SHARDED
    labels = np.unique(np.concatenate(tokens)) if tokens else np.zeros(0, dtype=np.int64)
    return Prepared(case, tokens, sources, slot_maps, nds, shard, expected, labels)


def _step(result) -> dict | None:
    """A rank's rank_step report as the driver trusts it: the fields it reads, well typed, or
    None (the worker's process hosts release code: what it sends is checked, never assumed)."""
    step = result.step
    try:
        if step is None or not isinstance(step.get("entry", ""), str):
            return None
        if step.get("layout_error") is not None:
            return {"layout_error": str(step["layout_error"])[:300], "entry": str(step["entry"])}
        if not all(isinstance(v, int) for v in step["tokens"] + step["slot_map"]) \
                or not isinstance(step["nd"], int):
            return None
        if step["layout"] is not None and not isinstance(step["layout"], dict):
            return None
        return step
    except (AttributeError, KeyError, TypeError):
        return None


def observe_release_case(case: Case, release: ReleaseInfo, backend) -> ReleaseObservation:
    """Run the case on every rank in the backend's worker (rank_step there) and judge it here:
    LAYOUT against the reference of the release's era, then every gather invariant."""
    batch = case.batch
    results = backend.run(ReleaseStep(case), release)
    steps = [_step(result) for result in results]
    expanded = batch.regime not in DRAFT_REGIMES
    caps = capabilities(release)
    prepared = _prepared(case, [s if s and not s.get("layout_error") else None for s in steps],
                         reference.layout(batch, era=caps.era))
    conforms = BY_ID[LAYOUT].predicate
    layout_bad, diffs, views = [], {}, []
    for rank, (result, step) in enumerate(zip(results, steps)):
        if step is not None and step.get("layout_error"):
            why = step["layout_error"]
            if expanded:
                layout_bad.append(rank)
                diffs[rank] = [f"the manager raised: {why}"]
            views.append(RankView(error=f"no call: {why}", trace=result.trace,
                                  caches=[{} for _ in case.tensors],
                                  rows=[[] for _ in case.tensors]))
            continue
        if expanded and step is not None:
            want = expected_view(batch, caps.era, rank, caps.replicated_method)
            if not conforms(want, step["layout"]):
                layout_bad.append(rank)
                diffs[rank] = differences(want, step["layout"])
        views.append(observe(prepared, rank, result))  # a rank that never reported: its trace says
    if any(step is not None and step.get("layout_error") for step in steps):
        violations = [Violation(LAYOUT if expanded else RETURNS, layout_bad or [
            r for r, s in enumerate(steps) if s is not None and s.get("layout_error")])]
        checked = (LAYOUT,) if expanded else (RETURNS,)
    else:
        violations, checked = judge(prepared, views)
        if expanded:
            checked = (LAYOUT, *checked)
            if layout_bad:
                violations.insert(0, Violation(LAYOUT, layout_bad))
    entry = next((s["entry"] for s in steps if s), "")
    return ReleaseObservation(prepared, views, violations, checked, diffs, entry)


def capabilities(release: ReleaseInfo) -> Capabilities:
    """The release's capabilities, as its worker read them from its code (plain data)."""
    return Capabilities(**release.release["caps"])


def era_case(case: Case, caps: Capabilities, empty_steps: bool = False) -> Case | None:
    """A drawn case as the release would see it: requests in its batch order, graph padding only
    where it has it (the same extra rows over the widest rank of its own era's layout), one query
    token per decode where it rejects drafts, and no empty step unless asked (None: not a step
    this release runs)."""
    from pcpcheck.vllm.layout import release_order
    batch = case.batch
    empty = not any(r.num_tokens for r in batch.requests)
    if empty and not empty_steps:
        return None
    if DRAFT in caps.not_applicable:  # no speculative tokens: a decode has 1 query token
        batch = dataclasses.replace(batch, requests=tuple(
            r if r.prefilling else dataclasses.replace(r, num_tokens=min(r.num_tokens, 1))
            for r in batch.requests))
    ordered = release_order(batch)
    if batch.regime not in DRAFT_REGIMES:
        graph = 0
        if batch.graph_size and caps.graph_padding and not empty:  # no graph runs empty
            extra = batch.graph_size - int(reference.layout(batch).counts.max(initial=0))
            widest = reference.layout(dataclasses.replace(ordered, graph_size=0),
                                      era=caps.era).counts.max(initial=0)
            graph = int(widest) + max(extra, 1)
        ordered = dataclasses.replace(ordered, graph_size=graph)
    return dataclasses.replace(case, batch=ordered)
