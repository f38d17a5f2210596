"""The judge of `pcpcheck diff OLD NEW` for two vLLM trees (releases, wheels, checkouts): one
drawn step through both whole paths, compared stage by stage in path order, here in the driver
on plain data (each side's rank_step reports and its observation, judged by
pcpcheck.judge.release_case; neither tree's code runs here).

What is compared is what each stage means, never what its code is called, so a refactor that
moves or renames code with its callers compares equal: the batch order as indices of the drawn
step's requests, each rank's layout as its manager's view (rows as global token ids, decode
counts, gather index, write mask, restore index), the local rows, the slot maps, the split's
`num_decode_tokens`, the gather's call (the shard flag, the collectives' shapes), its outputs
(rows as token ids, slots), and the caches (slot -> token) each rank ends with, every KV group's.
The first stage where the two differ is the step's finding (`differs_at`), which the search
shrinks like a violation; each side's own violations ride beside it (`side_finding`).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from typing import Any

from pcpcheck.judge.compare import DIFFERENT
from pcpcheck.judge.explain import label, rows_text, slots_text, token_table
from pcpcheck.judge.release_case import ReleaseObservation, judge_release_case
from pcpcheck.judge.verdict import Violation
from pcpcheck.shared.case import Case, describe
from pcpcheck.shared.protocol import BATCH_ORDER, ReleaseInfo
from pcpcheck.shared.results import SIDES

LAYOUT_STAGE, ROWS_STAGE, SLOTS_STAGE, SPLIT_STAGE = "layout", "local rows", "slot maps", "split"
CALL_STAGE, OUTPUT_STAGE, CACHES_STAGE = "gather call", "gather output", "caches"
# in path order: a step is counted under the first of them where the two sides differ
COMPARED_STAGES = (BATCH_ORDER, LAYOUT_STAGE, ROWS_STAGE, SLOTS_STAGE, SPLIT_STAGE, CALL_STAGE,
                   OUTPUT_STAGE, CACHES_STAGE)
# the manager view's fields that are slot maps (compared at SLOTS_STAGE, not LAYOUT_STAGE)
_MAP_FIELDS = ("expanded", "dummy_slots", "unexpanded")
_DIFFERENT = f"{DIFFERENT} at "


def differs_at(stage: str) -> str:
    """The search's finding for a step whose paths first differ at `stage`."""
    return _DIFFERENT + stage


def differing_stage(finding: str) -> str | None:
    """The stage of a `differs_at` finding, else None (a side's violation)."""
    return finding[len(_DIFFERENT):] if finding.startswith(_DIFFERENT) else None


def side_finding(side: str, invariant: str) -> str:
    """The search's finding for a side's own violation of `invariant`."""
    return f"{side} {invariant}"


def _plain(value: Any) -> Any:
    """JSON's form of a value (tuples as lists): what is compared and what --json writes."""
    return json.loads(json.dumps(value))


def _drawn_indices(drawn: Case, requests) -> list[int]:
    """Each request of a side's batch as the index of the drawn request it is (its blocks,
    context and kind: a release's era may cut a decode's tokens, never those); -1 for none."""
    free = list(enumerate(drawn.batch.requests))
    indices = []
    for request in requests:
        key = (request.blocks, request.context_len, request.prefilling)
        found = next((n for n, (_, r) in enumerate(free)
                      if (r.blocks, r.context_len, r.prefilling) == key), None)
        indices.append(-1 if found is None else free.pop(found)[0])
    return indices


def _order(drawn: Case, sent: Case, step: dict | None) -> list[int] | None:
    """The rank's batch order as drawn request indices: the step sent (the era's order), put
    in the order its own sort reported."""
    if step is None:
        return None
    requests = sent.batch.requests
    order = step.get("order")
    if isinstance(order, list) and sorted(order) == list(range(len(requests))):
        requests = tuple(requests[i] for i in order)
    return _drawn_indices(drawn, requests)


def _layout(step: dict | None, layout: dict | None) -> dict | None:
    """The manager's view less its slot maps, or its error (a draft step's view holds a map
    alone: no layout of rows there)."""
    if step and step.get("layout_error"):
        return {"error": step["layout_error"]}
    return {k: v for k, v in (layout or {}).items() if k not in _MAP_FIELDS} or None


def _maps(slot_map: list | None, layout: dict | None) -> dict | None:
    """The slot maps a rank's gather calls take (every KV group's expanded map where the
    manager built them, else the gather's one map), and the view's other maps."""
    if slot_map is None:
        return None
    if layout is None:
        return {"maps": [slot_map]}
    return {"maps": layout.get("expanded", [slot_map]),
            **{k: layout[k] for k in _MAP_FIELDS[1:] if k in layout}}


def _call_view(view) -> dict:
    if view.error:
        return {"error": view.error}
    if not view.returned:
        return {"error": "the call did not complete"}
    return {"rows": view.rows, "slots": view.slots}


def stage_values(drawn: Case, sent: Case, observation: ReleaseObservation, results) -> dict:
    """stage -> one value per rank (plain data; None where the rank reported no such thing)."""
    steps = [result.step if isinstance(result.step, dict) else None for result in results]
    groups = observation.kv_views or (observation.ranks,)
    layouts = [step.get("layout") if step and isinstance(step.get("layout"), dict) else None
               for step in steps]

    def field(name: str) -> list:
        return [None if step is None or step.get("layout_error") else step.get(name)
                for step in steps]

    values = {
        BATCH_ORDER: [_order(drawn, sent, step) for step in steps],
        LAYOUT_STAGE: [_layout(step, layout) for step, layout in zip(steps, layouts)],
        ROWS_STAGE: field("tokens"),
        SLOTS_STAGE: [_maps(slot_map, layout)
                      for slot_map, layout in zip(field("slot_map"), layouts)],
        SPLIT_STAGE: field("nd"),
        CALL_STAGE: [{"shard": shard, "collectives": [list(view.trace) for view in per_group]}
                     for shard, per_group in zip(field("shard"), zip(*groups))],
        OUTPUT_STAGE: [[_call_view(view) for view in per_group] for per_group in zip(*groups)],
        CACHES_STAGE: [[[sorted(cache.items()) for cache in view.caches] for view in per_group]
                       for per_group in zip(*groups)],
    }
    return _plain(values)


def _shared_fields(value: Any, other: Any) -> Any:
    """A dict-valued stage's fields that the other side reports too: a field one release's
    code has no answer for (0.26-0.29's managers have no `replicated_requests`) is no
    difference in what the path does."""
    if isinstance(value, dict) and isinstance(other, dict):
        return {k: v for k, v in value.items() if k in other}
    return value


def _differ(a: Any, b: Any) -> bool:
    return _shared_fields(a, b) != _shared_fields(b, a)


def first_difference(old: dict, new: dict) -> tuple[str, list[int]] | None:
    """The first stage (path order) where two sides' values differ, and the ranks where."""
    for stage in COMPARED_STAGES:
        ranks = [rank for rank, (a, b) in enumerate(zip(old[stage], new[stage])) if _differ(a, b)]
        if ranks or len(old[stage]) != len(new[stage]):
            return stage, ranks
    return None


@dataclass
class TreePair:
    """One step through both trees, as the engine reads an observation: `violations` holds the
    first differing stage's finding (on the ranks where it differs), then each side's own
    violations (`side_finding`)."""

    drawn: Case
    old: ReleaseObservation
    new: ReleaseObservation
    old_values: dict
    new_values: dict

    def __post_init__(self):
        found = first_difference(self.old_values, self.new_values)
        self.stage, self.stage_ranks = found if found else (None, [])
        self.violations = [Violation(differs_at(self.stage), self.stage_ranks)] if found else []
        self.violations += [Violation(side_finding(side, v.invariant), v.ranks)
                            for side, observed in zip(SIDES, (self.old, self.new))
                            for v in observed.violations]
        self.checked = (DIFFERENT,) + tuple(side_finding(side, invariant)
                                            for side, observed in zip(SIDES, (self.old, self.new))
                                            for invariant in observed.checked)
        # the drawn step: what the search shrinks and replays (each side gets its own era's)
        self.prepared = dataclasses.replace(self.old.prepared, case=self.drawn)
        self.ranks = self.old.ranks + self.new.ranks  # as the engine reads an observation's
        self.note = ""

    @property
    def costly(self) -> bool:
        return self.old.costly or self.new.costly

    def side(self, side: str) -> ReleaseObservation:
        return self.old if side == SIDES[0] else self.new


def judge_pair(drawn: Case, old: tuple[Case, list, ReleaseInfo],
               new: tuple[Case, list, ReleaseInfo]) -> TreePair:
    """Both sides of a step (each: the step it was sent, its ranks' reports, its release)
    judged and compared."""
    observed = []
    for sent, results, release in (old, new):
        observation = judge_release_case(sent, results, release)
        observed.append((observation, stage_values(drawn, sent, observation, results)))
    return TreePair(drawn, observed[0][0], observed[1][0], observed[0][1], observed[1][1])


# --- in words ------------------------------------------------------------------------------------

def side_verdict(observation: ReleaseObservation) -> str:
    """A side's verdict on a step: holds, or what it violates."""
    if not observation.violations:
        return "holds every invariant"
    return "violates " + ", ".join(f"{v.invariant} (ranks {v.ranks})"
                                   for v in observation.violations)


def _fields_text(value: dict, other: Any) -> str:
    """A dict-valued stage: the fields both sides report that differ (all if none do)."""
    other = other if isinstance(other, dict) else {}
    keys = [k for k in value if k in other and value[k] != other[k]] or list(value)
    return "; ".join(f"{k} {value[k]}" for k in keys)


def _groups_text(values: list, text) -> str:
    """A per-KV-group value: one text, or each group's."""
    if len(values) == 1:
        return text(values[0])
    return " | ".join(f"group {g}: {text(v)}" for g, v in enumerate(values))


def value_text(stage: str, value: Any, other: Any = None) -> str:
    """One rank's value of a stage as a reviewer reads it (`other`: the other side's, so a
    layout shows the fields that differ). A worker's report is data: a value not of its stage's
    form is shown as it came."""
    try:
        return _stage_text(stage, value, other)
    except (TypeError, KeyError, ValueError, AttributeError, IndexError):
        return json.dumps(value)


def _stage_text(stage: str, value: Any, other: Any) -> str:
    if value is None:
        return "- (not reported: the rank's step stopped before this stage)"
    if stage == BATCH_ORDER:
        return "requests " + " ".join(f"{i}" if i >= 0 else "?" for i in value)
    if stage == ROWS_STAGE:
        return "rows " + rows_text(value)
    if stage == SPLIT_STAGE:
        return f"nd={value}"
    if stage == SLOTS_STAGE:
        maps = " | ".join(slots_text(m) for m in value["maps"])
        extra = {k: v for k, v in value.items() if k != "maps"}
        return f"slots {maps}" + (f"; {_fields_text(extra, (other or {}))}" if extra else "")
    if stage == CALL_STAGE:
        calls = " | ".join("; ".join(" ".join(map(str, entry)) for entry in trace) or "none"
                           for trace in value["collectives"])
        return f"shard_decode_requests={value['shard']}, collectives: {calls}"
    if stage == OUTPUT_STAGE:
        return _groups_text(value, lambda call: call["error"] if "error" in call else
                            f"rows {rows_text(call['rows'][0]) if call['rows'] else '-'} "
                            f"slots {slots_text(call['slots'])}")
    if stage == CACHES_STAGE:
        return _groups_text(value, lambda caches: " ".join(
            f"{slot}:{label(token)}" for slot, token in (caches[0] if caches else [])) or "empty")
    return _fields_text(value, other)  # the layout


def side_by_side(pair: TreePair) -> list[tuple[int, str, str]]:
    """The first differing stage's values, (rank, old's text, new's text) per differing rank."""
    stage = pair.stage
    if stage is None:
        return []
    old, new = pair.old_values[stage], pair.new_values[stage]
    return [(rank, value_text(stage, old[rank], new[rank]), value_text(stage, new[rank], old[rank]))
            for rank in pair.stage_ranks]


def tree_replay_command(old: str, new: str, case: Case) -> str:
    """The command that reruns one drawn step on both trees."""
    return shlex.join(["pcpcheck", "diff", old, new, "--replay", case.to_json()])


def difference_report(pair: TreePair, regime: str, names: tuple[str, str], replay: str) -> str:
    """A differing step in words: the batch, each side's verdict on it, the first differing
    stage's values side by side, the replay line."""
    lines = [f"first difference at {pair.stage} (regime {regime}): {describe(pair.drawn)}",
             f"  old = {names[0]}: {side_verdict(pair.old)}",
             f"  new = {names[1]}: {side_verdict(pair.new)}"]
    if pair.stage != BATCH_ORDER:  # the sides agree on the order: old's numbering is both's
        lines += token_table(pair.old)
    for rank, old_text, new_text in side_by_side(pair):
        lines.append(f"  rank {rank}: old {old_text}")
        lines.append(f"  {' ' * len(str(rank))}       new {new_text}")
    lines.append(f"  replay: {replay}")
    return "\n".join(lines)
