"""`pcpcheck diff OLD NEW`: two versions of the gather on the same cases, the minimal case where
their per-rank caches (or errors) differ, both outcomes side by side, and each side's verdict."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, Verbosity, given, settings

from pcpcheck import report
from pcpcheck.cases import cases, describe
from pcpcheck.check import Observation, incomplete
from pcpcheck.backends import make_backend
from pcpcheck.check import run_case
from spec.invariants import INCOMPLETE

EXIT_SAME, EXIT_DIFFERENT = 0, 1


class OutcomesDiffer(Exception):
    def __init__(self, old: Observation, new: Observation):
        super().__init__("outcomes differ")
        self.old, self.new = old, new


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


def find_difference(old_target, new_target, regime: str, runner, *, max_examples: int,
                    max_ranks: int, derandomize: bool = True):
    """The minimal case (hypothesis-shrunk) where the two targets' outcomes differ, or None."""
    counted = {"cases": 0}

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=derandomize,
              verbosity=Verbosity.quiet, phases=(Phase.generate, Phase.shrink),
              suppress_health_check=list(HealthCheck))
    @given(case=cases(regimes=(regime,), max_ranks=max_ranks))
    def same_outcomes(case):
        counted["cases"] += 1
        old = run_case(case, old_target, runner)
        new = run_case(case, new_target, runner)
        if differing_ranks(old, new):
            raise OutcomesDiffer(old, new)

    try:
        same_outcomes()
    except OutcomesDiffer as found:
        return counted["cases"], found
    return counted["cases"], None


def side(observation: Observation, rank: int) -> str:
    view = observation.ranks[rank]
    if view.error:
        return f"error: {view.error}"
    reasons = [entry[1] for entry in view.trace if entry[0] == INCOMPLETE]
    if reasons:
        return f"collective failed: {reasons[0]}"
    diffs = report.cache_diff(observation, rank)
    return "cache as expected" if not diffs else "cache: " + "; ".join(diffs)


def verdict(observation: Observation) -> str:
    if not observation.violations:
        return "satisfies the spec"
    return "violates " + ", ".join(f"{v.invariant} (ranks {v.ranks})" for v in observation.violations)


def render(found: OutcomesDiffer, regime: str, old_name: str, new_name: str) -> str:
    case = found.old.prepared.case
    lines = [f"Outcomes differ (regime {regime}): {describe(case)}",
             f"  old = {old_name}: {verdict(found.old)}",
             f"  new = {new_name}: {verdict(found.new)}"]
    lines += report.token_table(found.old)
    for rank in differing_ranks(found.old, found.new):
        lines.append(f"  rank {rank}: old {side(found.old, rank)}")
        lines.append(f"  {' ' * len(str(rank))}       new {side(found.new, rank)}")
    lines.append(f"  case: {case.to_json()}")
    return "\n".join(lines)


def run_diff(args) -> int:
    with make_backend("threads", timeout=args.timeout) as runner:
        return _run_diff(args, runner)


def _run_diff(args, runner) -> int:
    old = runner.load(args.old, args.function)
    new = runner.load(args.new, args.function)
    print(f"pcpcheck diff: old {old.name}, new {new.name}")
    differences = 0
    for regime in args.regimes:
        count, found = find_difference(old, new, regime, runner, max_examples=args.max_examples,
                                       max_ranks=args.max_ranks, derandomize=args.seed is None)
        if found is None:
            print(f"  {regime:<12} {count:>6} cases: same outcomes")
        else:
            differences += 1
            print(f"  {regime:<12} {count:>6} cases: DIFFERENT")
            print(render(found, regime, old.source, new.source))
    print(f"\n{differences} regime(s) with a difference" if differences else "\nno difference found")
    return EXIT_DIFFERENT if differences else EXIT_SAME
