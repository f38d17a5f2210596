"""The search of `pcpcheck diff OLD NEW` for two vLLM trees: the release search's steps
(pcpcheck.search.release_search: drawn per regime, each as its release would see it) drawn once
and run on both trees, each tree in a backend of its own (two releases cannot share a process:
torch's registrations of their custom types clash), judged and compared in the driver
(pcpcheck.judge.tree_compare). The engine shrinks a difference like a violation: one finding per
first differing stage, and each side's own violations."""

from __future__ import annotations

import functools
import itertools

from pcpcheck.judge.release_case import capabilities, release_results
from pcpcheck.judge.tree_compare import SIDES, judge_pair
from pcpcheck.search.engine import RegimeResult, search
from pcpcheck.search.release_search import era_case
from pcpcheck.shared.case import Case
from pcpcheck.shared.protocol import ReleaseInfo


class BackendPair:
    """The two trees' backends, driven by the engine as one (a rank's slow call and an
    abandoned stream are told to both); no twin: a hang is scanned without one."""

    def __init__(self, old, new):
        self.sides = (old, new)
        self.timeout = max(old.timeout, new.timeout)

    @property
    def on_slow(self):
        return self.sides[0].on_slow

    @on_slow.setter
    def on_slow(self, callback) -> None:
        for backend in self.sides:
            backend.on_slow = callback

    def abandon(self) -> None:
        for backend in self.sides:
            backend.abandon()

    def twin(self) -> None:
        return None


def both_run(case: Case, releases, empty_steps: bool = False) -> Case | None:
    """The drawn step, where both trees run it (each its own era's form of it), else None."""
    if any(era_case(case, capabilities(release), empty_steps) is None for release in releases):
        return None
    return case


def run_tree_pairs(cases, releases: tuple[ReleaseInfo, ReleaseInfo], backends: BackendPair, *,
                   empty_steps: bool = False):
    """The engine's run_many for a tree diff: each drawn step sent to both trees (each its own
    era's form), both streamed at once (each backend keeps several steps in flight), every pair
    judged and compared (a judge.tree_compare.TreePair per step, in order)."""
    drawn, *inputs = itertools.tee(cases, 3)
    streams = [release_results((era_case(case, capabilities(release), empty_steps)
                                for case in steps), release, backend)
               for steps, release, backend in zip(inputs, releases, backends.sides)]
    for case, (old_sent, old_results), (new_sent, new_results) in zip(drawn, *streams):
        yield judge_pair(case, (old_sent, old_results, releases[0]),
                         (new_sent, new_results, releases[1]))


def not_applicable(releases, regime: str) -> str | None:
    """Why a regime is compared on no step: a side that cannot reach it (its reason, read
    from its code), else None."""
    reasons = [f"{side} (vLLM {release.release['release']}): {reason}"
               for side, release in zip(SIDES, releases)
               if (reason := capabilities(release).not_applicable.get(regime))]
    return "; ".join(reasons) or None


def search_trees(releases: tuple[ReleaseInfo, ReleaseInfo], regime: str, backends: BackendPair,
                 *, max_examples: int, max_ranks: int, seed: int | None,
                 empty_steps: bool = False, on_case=None) -> RegimeResult:
    """One regime of a tree diff: not applicable (a side cannot reach it), or the same steps
    searched on both; its counterexamples are TreePairs, the smallest per finding."""
    reason = not_applicable(releases, regime)
    if reason:
        return RegimeResult(regime=regime, not_applicable=reason)
    return search(releases, regime, backends, max_examples=max_examples, max_ranks=max_ranks,
                  derandomize=seed is None, seed=seed, on_case=on_case,
                  transform=functools.partial(both_run, releases=releases,
                                              empty_steps=empty_steps),
                  run_many=functools.partial(run_tree_pairs, empty_steps=empty_steps),
                  reduce=False)
