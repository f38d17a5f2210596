"""The search: cases are drawn per regime, every case is judged, violations are shrunk.

Generate, then shrink. A seeded random source draws cases (pcpcheck.cases.draw_case: the same
builder as the hypothesis strategy, 10-20x cheaper per case than a hypothesis example) and
streams them through the backend, several in flight. The smallest case violating each invariant
goes to hypothesis as a stored example (its choices); hypothesis replays it and shrinks it.

After the search each counterexample's case runs REPLAYS more times through the same backend: a
violation that its own replay does not always show is flaky (the target does not behave the same
on the same case), and the report says so rather than presenting it as an ordinary, shrunk case.

Each invariant gets its own exception class, so hypothesis treats violations of different
invariants as different bugs and shrinks each to its own minimal case (report_multiple_bugs).
A case is reported under the first invariant it violates (spec.registry order).
"""

from __future__ import annotations

import random
import time
import unittest
from collections import Counter, deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase, choices_to_bytes

from pcpcheck.cases import cases, draw_case
from pcpcheck.judge import Observation, run_cases
from pcpcheck.reduce import smaller
from pcpcheck.shared.case import Case
from pcpcheck.shared.errors import CheckerError
from pcpcheck_spec.registry import IDS


class InvariantViolated(Exception):
    """Raised inside the hypothesis test; carries the observation of the failing case."""

    def __init__(self, observation: Observation):
        self.observation = observation
        first = observation.violations[0]
        super().__init__(f"{first.invariant} violated on rank(s) {first.ranks}")


_VIOLATION_TYPES: dict[str, type] = {}


def _violation_type(finding: str) -> type:
    """The exception class of one finding (an invariant ID, or diff's DIFFERENT)."""
    if finding not in _VIOLATION_TYPES:
        _VIOLATION_TYPES[finding] = type(f"{finding}Violated", (InvariantViolated,), {})
    return _VIOLATION_TYPES[finding]


def _priority(observation) -> int:
    """Report order: spec.registry's, for the first finding of a counterexample."""
    first = observation.violations[0].invariant
    return IDS.index(first) if first in IDS else len(IDS)


REPLAYS = 5  # runs of each counterexample's case after the search


@dataclass(frozen=True)
class Replays:
    """How often a counterexample's case showed its violation again when run `runs` more times."""

    runs: int
    reproduced: int  # runs whose first violation was the counterexample's

    @property
    def flaky(self) -> bool:
        return self.reproduced < self.runs


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


MIN_CASES = 10  # hypothesis' least test calls before it stops looking for more bugs
SHRINK_SEED = 0  # the shrinker's randomness: fixed, so a run is reproducible


def search(target, regime: str, runner, *, max_examples: int, max_ranks: int = 8,
           derandomize: bool = True, seed: int | None = None, pcp_sizes=None,
           deadline: float | None = None, on_case=None, transform=None, run_many=run_cases,
           reduce: bool = True) -> RegimeResult:
    """Check `target` on up to max_examples drawn cases of one regime, shrinking violations.

    Generate, then shrink: cases are drawn by cases.draw_case (seeded: 0 when derandomize,
    else `seed` or a random one) and streamed through `run_many` (several in flight); the smallest
    case violating each invariant is then handed to hypothesis as a stored example (its choices),
    which replays and shrinks it. Like hypothesis, generation stops early once violations have
    been found and the latest half of the effort found no new one (at most 1000 cases after the
    first).

    `runner` is a pcpcheck.backends.Backend and `target` the TargetInfo it loaded.
    `pcp_sizes` restricts the world sizes drawn (a process backend's pools); default 2..max_ranks.
    `deadline` (time.monotonic()): stop there; each invariant is then reported with the smallest
    violating case seen so far (shrinking may be cut short). `on_case(result)` after every case.
    `transform(case)` maps each drawn case (None: drop it) and `run_many(cases, target, runner)`
    yields their observations (`pcpcheck vllm` reorders steps as a release would and runs them
    through rank_step); reduce=False skips the greedy reductions (their cases are not in a
    release's order).
    """
    run = _Search(target, regime, runner, max_examples, max_ranks, pcp_sizes, deadline, on_case,
                  transform, run_many)
    result = run.result
    started = time.perf_counter()
    found = run.generate(random.Random(0 if derandomize else seed))
    if found is None:
        result.budget_reached = True
    elif found:
        shrunk = run.shrink(found)
        result.budget_reached = shrunk is None
        run.smallest.update(shrunk or {})  # hypothesis' shrunk case stands where it has one
    result.counterexamples = list(run.smallest.values())
    if reduce and not result.budget_reached:  # past the budget, the search's smallest cases stand
        result.counterexamples = [_reduced(o, runner, target, run_many) for o in result.counterexamples]
    # An invariant violated only beside an earlier one, where the shrunk cases lost it: the
    # smallest case that showed it stands too, so every violated invariant cites a case.
    shown = {v.invariant for o in result.counterexamples for v in o.violations}
    for invariant, observation in run.witness.items():
        if invariant not in shown:
            result.counterexamples.append(observation)
            shown.update(v.invariant for v in observation.violations)
    result.counterexamples.sort(key=_priority)
    result.seconds = time.perf_counter() - started  # the search's rate: replays excluded
    result.replays = [replay(runner, target, o, REPLAYS, run_many) for o in result.counterexamples]
    return result


@dataclass
class _Search:
    """One regime's search in progress: what its two phases share."""

    target: object
    regime: str
    runner: object
    max_examples: int
    max_ranks: int
    pcp_sizes: object
    deadline: float | None
    on_case: object
    transform: object
    run_many: object
    result: RegimeResult = field(init=False)
    # per first invariant, the smallest violating case seen (_size): what the deadline leaves
    smallest: dict[str, Observation] = field(default_factory=dict)
    # per invariant violated at all (first or not), the smallest case that violates it
    witness: dict[str, Observation] = field(default_factory=dict)

    def __post_init__(self):
        self.result = RegimeResult(self.regime)

    def record(self, observation: Observation) -> str | None:
        """Count a case; its first violated invariant, if any."""
        result = self.result
        result.cases += 1
        result.checked.update(observation.checked)
        result.violated.update(v.invariant for v in observation.violations)
        if self.on_case is not None:
            self.on_case(result)
        if not observation.violations:
            return None
        first = observation.violations[0].invariant
        if first not in self.smallest or _size(observation) < _size(self.smallest[first]):
            self.smallest[first] = observation
        for violation in observation.violations:
            held = self.witness.get(violation.invariant)
            if held is None or _size(observation) < _size(held):
                self.witness[violation.invariant] = observation
        return first

    def generate(self, rng) -> dict[str, list] | None:
        """The generation phase: per invariant, the choices of the smallest case whose first
        violation it is: the least for hypothesis to shrink (None if the deadline stopped the
        phase). Adds its time less the drawing's to result.check_seconds."""
        pending: deque = deque()  # the choices of the cases in flight, in order
        stop = False
        drawn = 0
        drawing = 0.0
        started = time.perf_counter()

        def stream():
            nonlocal drawn, drawing
            attempts = 0
            while not stop and drawn < self.max_examples and attempts < 10 * self.max_examples:
                attempts += 1  # a transform that drops every case must not loop forever
                began = time.perf_counter()
                case, choices = draw_case(rng, (self.regime,), self.max_ranks, self.pcp_sizes)
                if self.transform is not None:
                    case = self.transform(case)
                drawing += time.perf_counter() - began
                if case is None:
                    continue
                drawn += 1
                pending.append(choices)
                yield case

        found: dict[str, list] = {}
        first_at = last_at = 0
        count = 0
        out_of_time = False
        for observation in self.run_many(stream(), self.target, self.runner):
            choices = pending.popleft()
            count += 1
            first = self.record(observation)
            if first is not None:
                if first not in found:
                    first_at, last_at = first_at or count, count
                if self.smallest[first] is observation:  # the smallest of its invariant so far
                    found[first] = choices
            # stop drawing (the cases in flight still finish: a backend keeps its results in order)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                stop = out_of_time = True
            elif found and count >= MIN_CASES and count >= min(first_at + 1000, 2 * last_at):
                stop = True
        self.result.check_seconds += time.perf_counter() - started - drawing
        return None if out_of_time else found

    def shrink(self, found: dict[str, list]) -> dict[str, Observation] | None:
        """Hypothesis shrinks the generation's violating cases: the shrunk observation per first
        invariant (none where a stored case did not fail again), or None if the deadline cut it
        short."""
        strategy = cases(regimes=(self.regime,), max_ranks=self.max_ranks, pcp_sizes=self.pcp_sizes)
        if self.transform is not None:
            strategy = strategy.map(self.transform).filter(lambda case: case is not None)

        @settings(max_examples=self.max_examples, deadline=None,
                  database=_Stored([choices_to_bytes(c) for c in found.values()]),
                  report_multiple_bugs=True, verbosity=Verbosity.quiet, print_blob=False,
                  phases=(Phase.reuse, Phase.shrink), suppress_health_check=list(HealthCheck))
        @hypothesis_seed(SHRINK_SEED)  # below @settings: a seed's own settings drop the database
        @given(case=strategy)
        def check(case: Case) -> None:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise _BudgetReached
            started = time.perf_counter()
            observation = next(iter(self.run_many([case], self.target, self.runner)))
            self.result.check_seconds += time.perf_counter() - started
            first = self.record(observation)
            if first is not None:
                raise _violation_type(first)(observation)

        violations: list[InvariantViolated] = []
        try:
            check()
        except _BudgetReached:
            return None
        except InvariantViolated as exc:
            violations = [exc]
        except BaseExceptionGroup as group:  # several invariants, each shrunk on its own
            caught, failures = group.split(InvariantViolated)
            if failures is not None:
                raise CheckerError(f"pcpcheck failed while checking: {failures.exceptions[0]!r}") \
                    from failures.exceptions[0]
            violations = list(caught.exceptions)
        except unittest.SkipTest:  # no stored case failed again (a flaky target): nothing shrunk
            pass
        except CheckerError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failure of pcpcheck itself, never a verdict
            raise CheckerError(f"pcpcheck failed while checking: {exc!r}") from exc
        return {exc.observation.violations[0].invariant: exc.observation for exc in violations}


class _Stored(ExampleDatabase):
    """Hypothesis' example database holding the generation phase's violating cases (as
    choices) under the key of examples it has not shrunk yet: its reuse phase replays them, and
    its shrink phase shrinks every one that still fails. Nothing is written anywhere."""

    def __init__(self, examples: list[bytes]):
        super().__init__()
        self.examples = examples

    def fetch(self, key: bytes):
        return iter(self.examples if key.endswith(b".secondary") else ())

    def save(self, key: bytes, value: bytes) -> None:
        pass

    def delete(self, key: bytes, value: bytes) -> None:
        pass

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        pass


def replay(runner, target, observation: Observation, runs: int, run_many=run_cases) -> Replays:
    """Run a counterexample's case `runs` more times; count the runs that show its violation."""
    invariant = observation.violations[0].invariant
    reproduced = 0
    for again in run_many([observation.prepared.case] * runs, target, runner):
        reproduced += bool(again.violations) and again.violations[0].invariant == invariant
    return Replays(runs, reproduced)


def _reduced(observation: Observation, runner, target, run_many=run_cases, budget: int = 400,
             seconds: float = 60.0) -> Observation:
    """The counterexample after greedy reductions (reduce.smaller) that keep its first violated
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
            candidate = next(iter(run_many([case], target, runner)))
            if candidate.violations and candidate.violations[0].invariant == invariant:
                observation, improved = candidate, True
                break
    return observation


def _size(observation: Observation) -> tuple:
    """Hypothesis's shrink order, roughly: fewer ranks, requests, tokens, then shorter JSON."""
    case = observation.prepared.case
    return (case.batch.pcp_size, len(case.batch.requests),
            sum(r.num_tokens for r in case.batch.requests), len(case.to_json()))
