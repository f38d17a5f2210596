"""The judge of `pcpcheck diff`: two versions of the gather run on the same case, and whether
their per-rank outcomes (each rank's caches, or that it raised, or that its collective failed)
differ. `api.diff` searches for the smallest such case with the engine that `check` uses: a
difference is a finding (`DIFFERENT`) the engine shrinks, reduces and replays like a violation.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcpcheck.judge.observe import incomplete
from pcpcheck.judge.run import run_cases
from pcpcheck.judge.verdict import Observation, Violation

DIFFERENT = "DIFFERENT"  # the finding of a diff, where a check has invariant IDs


def outcome(observation: Observation, rank: int):
    """What a rank ended with, as far as the cache is concerned: an error, or its caches."""
    view = observation.ranks[rank]
    if view.error is not None:
        return ("raised",)
    if incomplete(view.trace):
        return ("collective failed",)
    return ("caches", view.caches)


def differing_ranks(old: Observation, new: Observation) -> list[int]:
    return [rank for rank in range(len(old.ranks)) if outcome(old, rank) != outcome(new, rank)]


@dataclass
class Pair:
    """Both targets' observations of one case, as the engine sees an observation: `violations`
    holds DIFFERENT (on the ranks whose outcomes differ) when they differ."""

    old: Observation
    new: Observation

    def __post_init__(self):
        ranks = differing_ranks(self.old, self.new)
        self.violations = [Violation(DIFFERENT, ranks)] if ranks else []
        self.checked = (DIFFERENT,)
        self.prepared = self.old.prepared
        self.ranks = self.old.ranks + self.new.ranks  # as the engine reads an observation's
        self.note = ""

    @property
    def costly(self) -> bool:
        return self.old.costly or self.new.costly


def run_pairs(cases, targets, backend):
    """The engine's run_many for a diff: every case on the old target, then on the new one.
    `targets` is the pair (old, new) of loaded targets."""
    old_target, new_target = targets
    for case in cases:
        old = next(run_cases([case], old_target, backend))
        new = next(run_cases([case], new_target, backend))
        yield Pair(old, new)
