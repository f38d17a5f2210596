"""One release case judged in the driver: each rank's layout (from its worker's report, plain
data) against the reference of the release's era (LAYOUT), then the caches by every gather
invariant (pcpcheck.judge.verdict.judge). Release code never runs here
(pcpcheck.worker.release_step runs it in the worker)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import cast

import numpy as np

import pcpcheck_reference as reference
from pcpcheck.judge.observe import RankView, observe
from pcpcheck.judge.prepare import Prepared
from pcpcheck.judge.verdict import Observation, Violation, judge
from pcpcheck.shared.case import Case, row_content
from pcpcheck.shared.protocol import (
    BATCH_ORDER,
    GATHER_STAGE,
    MANAGER_STAGE,
    SLOT_MAPPING,
    SPLIT,
    WRAPPER,
    Capabilities,
    ReleaseInfo,
    ReleaseStep,
)
from pcpcheck.shared.step_inputs import dummy_tokens, global_maps
from pcpcheck_spec.names import DCP, DRAFT_REGIMES, LAYOUT, REPLICATED, RETURNS, SHARDED, Batch
from pcpcheck_spec.registry import BY_ID


@dataclass(kw_only=True)
class ReleaseObservation(Observation):
    layout_diffs: dict[int, list[str]] = field(default_factory=dict)  # manager rank -> lines
    entry: str = ""  # which release function the ranks called
    real_stages: tuple[str, ...] = ()  # the path's stages that ran the release's code on this step
    kv_group: int = 0  # the KV-cache group whose gather call `ranks` shows (1: the replicated one)
    kv_groups: int = 1  # the KV-cache groups whose gather calls were judged
    # every KV-cache group's views, first group first, where the step made a second call
    # (a tree diff compares them all; `ranks` shows only one)
    kv_views: tuple[list[RankView], ...] = ()


def _prepared(case: Case, steps: list, fallback, era: str) -> Prepared:
    """The driver's view of the ranks' inputs (from their reports; the reference layout of the
    release's `era` for a rank that has none) and the global write every rank's cache must equal
    (or shard)."""
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
    return Prepared(case=case, tokens=tokens, sources=sources, slot_maps=slot_maps, nds=nds,
                    shard=shard, expected=expected, labels=labels, era=era)


def _step(result) -> dict | None:
    """A rank's rank_step report as the driver trusts it: the fields it reads, well typed, or
    None (the worker's process hosts release code: what it sends is checked, never assumed)."""
    step = result.step
    try:
        if step is None or not isinstance(step.get("entry", ""), str):
            return None
        if step.get("layout_error") is not None:
            return {"layout_error": str(step["layout_error"])[:300], "entry": str(step["entry"]),
                    "kernels": step.get("kernels") is True}
        if not all(isinstance(v, int) for v in step["tokens"] + step["slot_map"]) \
                or not isinstance(step["nd"], int):
            return None
        if step["layout"] is not None and not isinstance(step["layout"], dict):
            return None
        return step
    except (AttributeError, KeyError, TypeError):
        return None


def observe_release_case(case: Case, release: ReleaseInfo, backend) -> ReleaseObservation:
    """Run the case on every rank in the backend's worker (rank_step there) and judge it here."""
    return next(run_release_cases([case], release, backend))


def run_release_cases(cases, release: ReleaseInfo, backend):
    """The engine's run_many for a release: the steps streamed through the backend's worker
    (several in flight, as run.run_cases streams a gather's cases), each judged here."""
    for case, results in release_results(cases, release, backend):
        yield judge_release_case(case, results, release)


def release_results(cases, release: ReleaseInfo, backend):
    """(case, its ranks' reports) per step, streamed through the backend's worker, unjudged."""
    pending = []

    def steps():
        for case in cases:
            pending.append(case)
            yield ReleaseStep(case)

    for results in backend.run_many(steps(), release):
        yield pending.pop(0), results


def judge_release_case(case: Case, results, release: ReleaseInfo) -> ReleaseObservation:
    """One step's ranks' reports judged: LAYOUT against the reference of the release's era,
    then every gather invariant."""
    steps = [_step(result) for result in results]
    case, ordered = _in_release_order(case, steps)
    batch = case.batch
    expanded = batch.regime not in DRAFT_REGIMES
    caps = capabilities(release)
    lay = reference.layout(batch, era=caps.era)
    prepared = _prepared(case, [s if s and not s.get("layout_error") else None for s in steps],
                         lay, caps.era)
    # a draft step is laid out by the release where its own draft path ran (release_draft)
    laid_out = expanded or (caps.draft_path and any(s and s.get("kernels") for s in steps))
    expected = (expected_views(batch, caps, lay) if expanded else
                (lambda rank: {"unexpanded": lay.slot_maps[rank].tolist()}) if laid_out else None)
    conforms = BY_ID[LAYOUT].predicate
    layout_bad, diffs, views = [], {}, []
    for rank, (result, step) in enumerate(zip(results, steps)):
        if step is not None and step.get("layout_error"):
            why = step["layout_error"]
            if laid_out:
                layout_bad.append(rank)
                diffs[rank] = [f"the {'manager' if expanded else 'draft path'} raised: {why}"]
            views.append(RankView(error=f"no call: {why}", trace=result.trace,
                                  caches=[{} for _ in case.tensors],
                                  rows=[[] for _ in case.tensors]))
            continue
        if expected is not None and step is not None and (expanded or step.get("kernels")):
            want, got = expected(rank), step["layout"]
            if not isinstance(got, dict) or not conforms(want, got):  # none sent: none built
                layout_bad.append(rank)
                diffs[rank] = differences(want, got) if isinstance(got, dict) else [
                    "no layout reported"]
        views.append(observe(prepared, rank, result))  # a rank that never reported: its trace says
    checked: tuple[str, ...]
    if any(step is not None and step.get("layout_error") for step in steps):
        violations = [Violation(LAYOUT if laid_out else RETURNS, layout_bad or [
            r for r, s in enumerate(steps) if s is not None and s.get("layout_error")])]
        checked = (LAYOUT,) if laid_out else (RETURNS,)
    else:
        violations, checked = judge(prepared, views)
        if laid_out:
            checked = (LAYOUT, *checked)
            if layout_bad:
                violations.insert(0, Violation(LAYOUT, layout_bad))
    entry = next((s["entry"] for s in steps if s), "")
    observation = ReleaseObservation(prepared=prepared, ranks=views, violations=violations,
                                     checked=checked, layout_diffs=diffs,
                                     entry=entry, real_stages=_real_stages(steps, expanded, entry,
                                                                           release, ordered))
    if caps.replicated_group_call(batch.regime) and not layout_bad:
        return _with_replicated_group(observation, results, steps)
    return observation


def _with_replicated_group(observation: ReleaseObservation, results, steps
                           ) -> ReleaseObservation:
    """The step's call for its second KV group, replicated under DCP (every rank writes every
    token at its global position), judged by the invariants of a replica (REPLICA, not SHARD)
    where every rank made it. Its violations follow the first group's; the observation shown is
    the first group's unless only the second violates."""
    calls = [result.group1 for result in results]
    slot_maps = [_ints(step.get("slot_map1")) if step else None for step in steps]
    if any(call is None for call in calls) or any(m is None for m in slot_maps):
        return observation  # a rank made no second call: its first already failed (judged)
    prepared = observation.prepared
    batch = prepared.case.batch
    slots = global_maps(batch, 0, second_replicated=True)[1]
    written = {int(slot): token for token, slot in enumerate(slots.tolist()) if slot >= 0}
    second = dataclasses.replace(prepared, slot_maps=[np.array(m, dtype=np.int64) for m in slot_maps],
                                 expected=[dict(written) for _ in range(batch.pcp_size)])
    views = [observe(second, rank, call) for rank, call in enumerate(calls)]
    violations, checked = judge(second, views, REPLICATED)
    checked = tuple(dict.fromkeys(observation.checked + checked))
    both = (observation.ranks, views)
    if violations and not observation.violations:
        return dataclasses.replace(observation, prepared=second, ranks=views,
                                   violations=violations, checked=checked, kv_group=1, kv_groups=2,
                                   kv_views=both)
    return dataclasses.replace(observation, checked=checked, kv_groups=2, kv_views=both,
                               violations=observation.violations + violations)


def _ints(value) -> list[int] | None:
    """A list of ints from a worker's report, else None (what it sends is checked)."""
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value
    return None


def _in_release_order(case: Case, steps: list) -> tuple[Case, bool]:
    """The step as the release's own sort ordered it (the order its ranks report; every rank
    runs the same sort on the same step), and whether one was reported. An order that is not a
    permutation of the requests is not trusted: the step stays as drawn."""
    order = next((s.get("order") for s in steps if s is not None and s.get("order") is not None),
                 None)
    requests = case.batch.requests
    if not isinstance(order, list) or sorted(order) != list(range(len(requests))):
        return case, False
    batch = dataclasses.replace(case.batch, requests=tuple(requests[i] for i in order))
    return dataclasses.replace(case, batch=batch), True


def _real_stages(steps: list, expanded: bool, entry: str, release: ReleaseInfo,
                 ordered: bool) -> tuple:
    """The stages whose release code ran on this step (as its ranks report)."""
    reported = [s for s in steps if s is not None]
    if not reported:
        return ()
    stages = [BATCH_ORDER] if ordered else []
    if expanded:
        stages.append(MANAGER_STAGE)
    if all(s.get("kernels") is True for s in reported):  # a draft step's: its draft path's
        stages.append(SLOT_MAPPING)
    if expanded and all(s.get("split") is True for s in reported):
        stages.append(SPLIT)
    if entry and entry != release.function_name:
        stages.append(WRAPPER)
    if entry:
        stages.append(GATHER_STAGE)
    return tuple(stages)


def capabilities(release: ReleaseInfo) -> Capabilities:
    """The release's capabilities, as its worker read them from its code (plain data)."""
    return Capabilities(**release.release["caps"])


def reference_view(batch: Batch, era: str, with_replicated: bool = True,
                   lay: reference.Layout | None = None) -> dict:
    """The reference model's layout of `batch` in `era`, as every rank's manager must see it
    (`lay`: that layout, where the caller has it)."""
    if lay is None:
        lay = reference.layout(batch, era=era)
    pp, width = batch.pcp_size, lay.width
    n = sum(r.num_tokens for r in batch.requests)
    # gidx and wmask: an expanded regime's layout has them (a draft regime's has None)
    gidx = cast(np.ndarray, lay.gidx).tolist()
    view = {
        "rows": [gidx[r * width: r * width + int(lay.counts[r])] for r in range(pp)],
        "num_decode_tokens": [int(v) for v in lay.num_decode_tokens],
        "width": width,
        "gidx": gidx,
        "wmask": cast(np.ndarray, lay.wmask).tolist(),
        "restore": reference.hidden_restore_index(lay, n).tolist(),
    }
    if with_replicated:
        view["replicated"] = reference.replicated_requests(batch, era)
    view["expanded"] = {}
    return view


def expected_views(batch: Batch, caps: Capabilities, lay: reference.Layout | None = None):
    """rank -> the layout view rank `rank`'s manager must build: reference_view, the expanded
    maps of its DCP rank (the second KV group replicated under DCP where the release shards per
    group: Capabilities), and the dummy request's tokens in each KV group's global map: no slot
    (compared only where the rank ran the kernel on one). The step's reference work is done
    once: its layout (`lay`, where the caller has it), what every rank sees, and the expanded
    maps once per DCP rank (the ranks of a D = 1 step share one)."""
    if lay is None:
        lay = reference.layout(batch, era=caps.era)
    shared = reference_view(batch, caps.era, caps.replicated_method, lay)
    shared["dummy_slots"] = [[-1] * dummy_tokens(batch, caps)] * 2
    expanded: dict[int, list[list[int]]] = {}

    def view(rank: int) -> dict:
        dcp_rank = rank if batch.regime == DCP else 0
        if dcp_rank not in expanded:
            expanded[dcp_rank] = [
                reference.expand_slot_mapping(lay.gidx, lay.wmask, group).tolist()
                for group in global_maps(batch, dcp_rank, caps.replicated_kv_group)]
        return {**shared, "expanded": expanded[dcp_rank]}

    return view


def differences(expected: dict, actual: dict) -> list[str]:
    """One line per differing field: reference | release (side by side)."""
    lines = []
    for key in actual:
        if actual[key] != expected.get(key):
            lines.append(f"{key:<18} reference {expected.get(key)}\n"
                         f"{'':<18} release   {actual[key]}")
    return lines
