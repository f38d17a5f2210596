"""From search results to what the API returns: a CheckResult with its regime summaries, its
counterexamples (their report text, whether the baseline knows them, which shown one each folds
into) and the baseline's outcome."""

from __future__ import annotations

from pcpcheck.judge import coverage, explain
from pcpcheck.judge.baseline import Baseline
from pcpcheck.shared.results import (
    BaselineOutcome,
    CheckResult,
    Counterexample,
    InvariantCount,
    Options,
    RegimeSummary,
    ReleaseRecord,
    ViolationRecord,
    version,
)
from pcpcheck_spec.names import HAZARD_REGIMES, REPLICA, SHARD
from pcpcheck_spec.registry import IDS


def summary(result, capabilities: dict | None = None) -> RegimeSummary:
    """A regime's summary; `capabilities`: a release's (None for a gather checked alone), which
    decide the coverage features its cases could reach (coverage.unreachable: left out, n/a)."""
    unreachable = coverage.unreachable(result.regime, capabilities, result.features)
    return RegimeSummary(
        regime=result.regime, cases=result.cases, seconds=round(result.seconds, 3),
        check_seconds=round(result.check_seconds, 3),
        invariants=tuple(InvariantCount(i, result.checked[i], result.violated[i])
                         for i in IDS if i in result.checked),
        budget_reached=result.budget_reached, not_applicable=result.not_applicable or None,
        slowest_call=round(result.slowest_call, 4),
        mean_call=round(result.call_seconds / result.cases, 4) if result.cases else 0.0,
        branches=tuple((b, result.branches[b]) for b in coverage.BRANCHES),
        features=tuple((f, result.features[f]) for f in coverage.FEATURES
                       if f not in unreachable or result.features[f]),
        scope_steps=result.scope_steps, real_stages=tuple(sorted(result.real_stages.items())))


def result(source: str, target, options: Options, results, baseline: Baseline,
            describe=None, release: ReleaseRecord | None = None) -> CheckResult:
    """`describe(regime, observation, replays) -> (replay command, report text)`: default the
    gather's (`pcpcheck check`)."""
    if describe is None:
        def describe(regime, observation, replays):
            return (explain.replay_command(target.source, observation, options.function),
                    explain.counterexample(observation, regime, target.source, options.function,
                                          target, replays))
    shrunk = [(r.regime, o, p) for r in results for o, p in zip(r.counterexamples, r.replays)]
    violated = {(r.regime, i) for r in results for i, n in r.violated.items() if n}
    known = {e for e in baseline.entries if e in violated}
    into = fold([(regime, o) for regime, o, _ in shrunk])
    counterexamples = []
    for (regime, observation, replays), host in zip(shrunk, into):
        command, text = describe(regime, observation, replays)
        counterexamples.append(Counterexample(
            regime=regime,
            violations=tuple(ViolationRecord(v.invariant, tuple(v.ranks))
                             for v in observation.violations),
            case=observation.prepared.case.to_json(),
            replay=command, report=text,
            known=all((regime, v.invariant) in known for v in observation.violations),
            hazard=regime in HAZARD_REGIMES,
            flaky=(replays.runs, replays.reproduced) if replays.flaky else None,
            note=getattr(observation, "note", "") or None,
            folded_into=host, observation=observation))
    outcome = None
    if options.baseline:  # an entry is found when its invariant was violated in its regime
        outcome = BaselineOutcome(
            options.baseline, tuple(e for e in baseline.entries if e in known),
            tuple(e for e in baseline.entries if e not in known and e[0] in options.regimes))
    return CheckResult(version=version(), target=source, target_name=target.name,
                       stand_ins=tuple(target.stand_ins), options=options,
                       regimes=tuple(summary(r, None if release is None else release.capabilities)
                                     for r in results),
                       counterexamples=tuple(counterexamples), baseline=outcome, release=release)


# One check under two names: REPLICA where D = 1, SHARD where D > 1 (regimes that exclude each
# other). Both compare every rank's cache with the one the spec gives it and blame the ranks whose
# cache differs (spec/registry.py), so a bug that loses or misplaces KV is REPLICA in one regime
# and SHARD in dcp: folding takes them as one ID.
SAME_CHECK = {SHARD: REPLICA}


def fold(counterexamples) -> list[int | None]:
    """Per counterexample (regime, observation), in report order: None when it is shown, else
    the index of the shown one it folds into: the shown case also violates the invariant this
    one is reported under (in any regime; REPLICA and SHARD taken as one: SAME_CHECK), so both
    are most likely the same bug (hypothesis shrinks each first violated invariant on its own,
    in each regime)."""
    shown: list[int] = []
    into: list[int | None] = []
    for index, (_, observation) in enumerate(counterexamples):
        first = SAME_CHECK.get(observation.violations[0].invariant,
                               observation.violations[0].invariant)
        host = next((k for k in shown if first in
                     {SAME_CHECK.get(v.invariant, v.invariant)
                      for v in counterexamples[k][1].violations}), None)
        into.append(host)
        if host is None:
            shown.append(index)
    return into
