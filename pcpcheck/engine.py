"""The search: hypothesis draws cases per regime, every case is judged, violations are shrunk.

After the search each counterexample's case runs REPLAYS more times through the same backend: a
violation that its own replay does not always show is flaky (the target does not behave the same
on the same case), and the report says so rather than presenting it as an ordinary, shrunk case.

Each invariant gets its own exception class, so hypothesis treats violations of different
invariants as different bugs and shrinks each to its own minimal case (report_multiple_bugs).
A case is reported under the first invariant it violates (spec.registry order).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from pcpcheck.cases import Case, cases, smaller
from pcpcheck.check import Observation, run_case
from spec.registry import IDS


class InvariantViolated(Exception):
    """Raised inside the hypothesis test; carries the observation of the failing case."""

    def __init__(self, observation: Observation):
        self.observation = observation
        first = observation.violations[0]
        super().__init__(f"{first.invariant} violated on rank(s) {first.ranks}")


_VIOLATION_TYPES = {i: type(f"{i}Violated", (InvariantViolated,), {}) for i in IDS}


REPLAYS = 5  # runs of each counterexample's case after the search


@dataclass(frozen=True)
class Replays:
    """How often a counterexample's case showed its violation again when run `runs` more times."""

    runs: int
    reproduced: int  # runs whose first violation was the counterexample's

    @property
    def flaky(self) -> bool:
        return self.reproduced < self.runs


class CheckerError(Exception):
    """pcpcheck itself failed (not the target): a bug to report, never a verdict."""


class _BudgetReached(BaseException):
    """Raised at the start of a case once the deadline has passed: a BaseException, so
    hypothesis neither shrinks nor reports it but unwinds at once."""


@dataclass
class RegimeResult:
    regime: str
    cases: int = 0
    checked: Counter = field(default_factory=Counter)  # invariant -> cases evaluated
    violated: Counter = field(default_factory=Counter)  # invariant -> cases violating it
    counterexamples: list[Observation] = field(default_factory=list)  # shrunk, one per invariant
    replays: list[Replays] = field(default_factory=list)  # one per counterexample, in order
    not_applicable: str = ""  # why the target cannot reach this regime (then nothing is drawn)
    seconds: float = 0.0  # wall time of the whole search
    check_seconds: float = 0.0  # of which running and judging cases (drawing excluded)
    budget_reached: bool = False  # the deadline stopped the search early


def search(target, regime: str, runner, *, max_examples: int, max_ranks: int = 8,
           derandomize: bool = True, seed: int | None = None, pcp_sizes=None,
           deadline: float | None = None, on_case=None, strategy=None, run=run_case,
           reduce: bool = True) -> RegimeResult:
    """Check `target` on up to max_examples drawn cases of one regime, shrinking violations.

    `runner` is a pcpcheck.backends.Backend and `target` the TargetInfo it loaded.
    `pcp_sizes` restricts the world sizes drawn (a process backend's pools); default 2..max_ranks.
    `deadline` (time.monotonic()): stop there; each invariant is then reported with the smallest
    violating case seen so far (shrinking may be cut short). `on_case(result)` after every case.
    `strategy` replaces the default case strategy and `run(case, target, runner)` run_case
    (`pcpcheck vllm` draws steps in a release's order and runs them through rank_step); reduce=False
    skips the greedy reductions (their cases are not in a release's order).
    """
    result = RegimeResult(regime)
    smallest: dict[str, Observation] = {}  # per first invariant, for a search the deadline ends

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=derandomize,
              report_multiple_bugs=True, verbosity=Verbosity.quiet, print_blob=False,
              phases=(Phase.explicit, Phase.generate, Phase.shrink),
              suppress_health_check=list(HealthCheck))
    @given(case=strategy if strategy is not None
           else cases(regimes=(regime,), max_ranks=max_ranks, pcp_sizes=pcp_sizes))
    def check(case: Case) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            raise _BudgetReached
        started = time.perf_counter()
        observation = run(case, target, runner)
        result.check_seconds += time.perf_counter() - started
        result.cases += 1
        result.checked.update(observation.checked)
        result.violated.update(v.invariant for v in observation.violations)
        if on_case is not None:
            on_case(result)
        if observation.violations:
            first = observation.violations[0].invariant
            if first not in smallest or _size(observation) < _size(smallest[first]):
                smallest[first] = observation
            raise _VIOLATION_TYPES[first](observation)

    if seed is not None and not derandomize:
        check = hypothesis_seed(seed)(check)
    started = time.perf_counter()
    try:
        check()
    except _BudgetReached:
        result.budget_reached = True
        result.counterexamples = list(smallest.values())
    except InvariantViolated as exc:
        result.counterexamples.append(exc.observation)
    except BaseExceptionGroup as group:  # several invariants, each shrunk on its own
        violations, failures = group.split(InvariantViolated)
        if failures is not None:
            raise CheckerError(f"pcpcheck failed while checking: {failures.exceptions[0]!r}") \
                from failures.exceptions[0]
        result.counterexamples += [exc.observation for exc in violations.exceptions]
    except CheckerError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failure of pcpcheck itself, never a verdict
        raise CheckerError(f"pcpcheck failed while checking: {exc!r}") from exc
    if reduce and not result.budget_reached:  # past the budget, the search's smallest cases stand
        result.counterexamples = [_reduced(o, runner, target) for o in result.counterexamples]
    result.counterexamples.sort(key=lambda o: IDS.index(o.violations[0].invariant))
    result.seconds = time.perf_counter() - started  # the search's rate: replays excluded
    result.replays = [replay(runner, target, o, REPLAYS, run) for o in result.counterexamples]
    return result


def replay(runner, target, observation: Observation, runs: int, run=run_case) -> Replays:
    """Run a counterexample's case `runs` more times; count the runs that show its violation."""
    invariant = observation.violations[0].invariant
    reproduced = 0
    for _ in range(runs):
        violations = run(observation.prepared.case, target, runner).violations
        reproduced += bool(violations) and violations[0].invariant == invariant
    return Replays(runs, reproduced)


def _reduced(observation: Observation, runner, target, budget: int = 400,
             seconds: float = 60.0) -> Observation:
    """The counterexample after greedy reductions (cases.smaller) that keep its first violated
    invariant: hypothesis' shrink can stop in a local minimum. At most `budget` cases and
    `seconds` (a hanging target costs its timeout per case)."""
    invariant = observation.violations[0].invariant
    deadline = time.perf_counter() + seconds
    improved = True
    while improved:
        improved = False
        for case in smaller(observation.prepared.case):
            if budget <= 0 or time.perf_counter() > deadline:
                return observation
            budget -= 1
            candidate = run_case(case, target, runner)
            if candidate.violations and candidate.violations[0].invariant == invariant:
                observation, improved = candidate, True
                break
    return observation


def _size(observation: Observation) -> tuple:
    """Hypothesis's shrink order, roughly: fewer ranks, requests, tokens, then shorter JSON."""
    case = observation.prepared.case
    return (case.batch.pcp_size, len(case.batch.requests),
            sum(r.num_tokens for r in case.batch.requests), len(case.to_json()))
