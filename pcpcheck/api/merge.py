"""`pcpcheck merge`: the results of a run split N ways (`--shard K/N`, pcpcheck.search.shard),
joined into one CheckResult: one verdict, one verdict table, one coverage table, one count. A
part missing makes the merge incomplete (exit 2, "incomplete: shard 2/3 missing"), never a pass
over part of a scope; a violation in the parts present still fails it (exit 1)."""

from __future__ import annotations

import os
from dataclasses import replace

from pcpcheck.api import assemble
from pcpcheck.search.reduce import size
from pcpcheck.search.shard import Shard
from pcpcheck.shared.case import Case
from pcpcheck.shared.errors import UsageError
from pcpcheck.shared.results import (
    BaselineOutcome,
    CheckResult,
    Counterexample,
    InvariantCount,
    RegimeSummary,
    ReleaseRecord,
)

# What must be equal across the parts of one run (their options but the shard, and what ran).
_SAME_RUN = ("target", "target_name", "release")


def merge(parts) -> CheckResult:
    """Join the parts' results (CheckResults, or paths of their --json files), given in any
    order. Raises UsageError naming a file that is no part, parts of different runs, or a part
    given twice."""
    named = [_read(part) for part in parts]
    if not named:
        raise UsageError("merge: no result to merge")
    first_name, first, (_, count) = named[0]
    by_index: dict[int, str] = {}
    for name, result, (index, ways) in named:
        if ways != count:
            raise UsageError(f"merge: {name} is part of a run split {ways} ways, {first_name} of "
                             f"one split {count} ways")
        differs = [field for field in _SAME_RUN if _run_of(getattr(result, field))
                   != _run_of(getattr(first, field))]
        if replace(result.options, shard=None) != replace(first.options, shard=None):
            differs.append("options")
        if differs:
            raise UsageError(f"merge: {name} and {first_name} are parts of different runs "
                             f"(their {', '.join(differs)} differ)")
        if index in by_index:
            raise UsageError(f"merge: shard {index}/{count} given twice ({by_index[index]}, {name})")
        by_index[index] = name
    results = [result for _, result, _ in sorted(named, key=lambda p: p[2])]
    counterexamples = _counterexamples(results)
    return CheckResult(
        version=first.version, target=first.target, target_name=first.target_name,
        stand_ins=tuple(dict.fromkeys(n for r in results for n in r.stand_ins)),
        options=replace(first.options, shard=None),
        regimes=tuple(_regime([r.summary(regime) for r in results])
                      for regime in (s.regime for s in first.regimes)),
        counterexamples=counterexamples, baseline=_baseline(results),
        release=_release([r.release for r in results]),
        seconds=max(r.seconds for r in results), shards=count,
        missing_shards=tuple(k for k in range(1, count + 1) if k not in by_index))


def _run_of(value):
    """What of a result's field its run fixes: a release's record without the lines its part's
    steps ran."""
    return (replace(value, lines=(), lines_steps=0, lines_traced=0)
            if isinstance(value, ReleaseRecord) else value)


def _release(records: list[ReleaseRecord | None]) -> ReleaseRecord | None:
    """The release's record over the parts (all None, or all a record of the same release): the
    lines any part's steps ran, on the steps of them all."""
    parts = [record for record in records if record is not None]
    if not parts:
        return None
    run: dict[str, set[int]] = {}
    for record in parts:
        for entry in record.lines:
            run.setdefault(entry.file, set()).update(entry.run)
    return replace(parts[0], lines=tuple(replace(entry, run=tuple(sorted(run[entry.file])))
                                         for entry in parts[0].lines),
                   lines_steps=sum(record.lines_steps for record in parts),
                   lines_traced=sum(record.lines_traced for record in parts))


def _read(part) -> tuple[str, CheckResult, Shard]:
    """(a name for messages, the result, its shard): UsageError unless it is a part's result."""
    if isinstance(part, CheckResult):
        name, result = f"shard {part.options.shard}", part
    else:
        name = os.fspath(part)
        try:
            with open(name, encoding="utf-8") as handle:
                result = CheckResult.from_json(handle.read())
        except FileNotFoundError:
            raise UsageError(f"merge: {name}: no such file") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
            raise UsageError(f"merge: {name}: not a pcpcheck check result ({why})") from None
    if result.options.shard is None:
        raise UsageError(f"merge: {name} is the result of a whole run, not of a part "
                         "(--shard K/N)")
    return name, result, result.options.shard


def _regime(parts: list[RegimeSummary]) -> RegimeSummary:
    """One regime over the parts: counts summed, the wall clock the longest part's (parts run at
    once), a feature absent where no part could reach it."""
    first, cases = parts[0], sum(p.cases for p in parts)
    invariants = [InvariantCount(c.invariant, sum(p.count(c.invariant).checked for p in parts),
                                 sum(p.count(c.invariant).violated for p in parts))
                  for c in first.invariants]

    def summed(pairs_of) -> tuple[tuple[str, int], ...]:
        keys = dict.fromkeys(k for p in parts for k, _ in pairs_of(p))
        return tuple((k, sum(dict(pairs_of(p)).get(k, 0) for p in parts)) for k in keys)

    return RegimeSummary(
        regime=first.regime, cases=cases, seconds=max(p.seconds for p in parts),
        check_seconds=round(sum(p.check_seconds for p in parts), 3),
        invariants=tuple(invariants), budget_reached=any(p.budget_reached for p in parts),
        not_applicable=first.not_applicable,
        slowest_call=max(p.slowest_call for p in parts),
        mean_call=round(sum(p.mean_call * p.cases for p in parts) / cases, 4) if cases else 0.0,
        branches=summed(lambda p: p.branches), features=summed(lambda p: p.features),
        scope_steps=None if any(p.scope_steps is None for p in parts)
        else sum(p.scope_steps or 0 for p in parts),
        real_stages=summed(lambda p: p.real_stages))


def _counterexamples(results: list[CheckResult]) -> tuple[Counterexample, ...]:
    """Every part's counterexamples, per regime in the run's order, smallest step first when
    exhaustive (the smallest over the parts is the unsplit run's), folded again over all."""
    regimes = [s.regime for s in results[0].regimes]
    found = [c for r in results for c in r.counterexamples]
    order = {regime: k for k, regime in enumerate(regimes)}
    exhaustive = results[0].options.scope is not None
    # an exhaustive run's order of size: P, requests, tokens (reduce.size's first three)
    found.sort(key=lambda c: (order[c.regime],
                              size(Case.from_json(c.case))[:3] if exhaustive else ()))
    into = assemble.fold([(c.regime, c) for c in found])
    return tuple(replace(c, folded_into=host) for c, host in zip(found, into))


def _baseline(results: list[CheckResult]) -> BaselineOutcome | None:
    outcomes = [r.baseline for r in results if r.baseline is not None]
    if not outcomes:
        return None
    known = tuple(dict.fromkeys(e for o in outcomes for e in o.known))
    fixed = tuple(e for e in outcomes[0].fixed if all(e in o.fixed for o in outcomes))
    return BaselineOutcome(outcomes[0].path, known, fixed)
