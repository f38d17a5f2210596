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

A case on which a rank hung or died ("costly": running it again costs a timeout or a worker) is
evidence at once: generation stops there, and instead of hypothesis (every attempt that hangs
would cost a timeout) the smaller cases (reduce.ascending) are tried in order of size, each beside
its replay on a twin backend, so the first that hangs again is the smallest tried and its replay
ran in the same timeout. A hang met while shrinking another violation stops that shrinking; a
replay that hangs ends the replays. What ended a phase early is the counterexample's `note`.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import unittest
from collections import Counter, deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase, choices_to_bytes

from pcpcheck.cases import cases, draw_case
from pcpcheck.judge import Observation, run_cases
from pcpcheck.reduce import ascending, size, smaller
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


class _Costly(BaseException):
    """Raised where a case hung or killed its worker while shrinking another violation: every
    further attempt could cost as much, so shrinking stops (the case itself is recorded)."""


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
    slowest_call: float = 0.0  # seconds of the slowest rank's call of any case
    call_seconds: float = 0.0  # the slowest rank's call of each case, summed (mean: / cases)
    real_stages: Counter = field(default_factory=Counter)  # a release's stage -> steps it ran


MIN_CASES = 10  # hypothesis' least test calls before it stops looking for more bugs
SHRINK_SEED = 0  # the shrinker's randomness: fixed, so a run is reproducible
SCAN_ATTEMPTS = 500  # smaller cases tried for a costly counterexample, at most


def search(target, regime: str, runner, *, max_examples: int, max_ranks: int = 8,
           derandomize: bool = True, seed: int | None = None, pcp_sizes=None,
           deadline: float | None = None, on_case=None, transform=None, run_many=run_cases,
           reduce: bool = True, on_wait=None) -> RegimeResult:
    """Check `target` on up to max_examples drawn cases of one regime, shrinking violations.

    Generate, then shrink: cases are drawn by cases.draw_case (seeded: 0 when derandomize,
    else `seed` or a random one) and streamed through `run_many` (several in flight); the smallest
    case violating each invariant is then handed to hypothesis as a stored example (its choices),
    which replays and shrinks it. Like hypothesis, generation stops early once violations have
    been found and the latest half of the effort found no new one (at most 1000 cases after the
    first); at once on a case where a rank hung or died (see the module docstring).

    `runner` is a pcpcheck.backends.Backend and `target` the TargetInfo it loaded.
    `pcp_sizes` restricts the world sizes drawn and shrunk to (a process backend's pools,
    torchrun's world); default 2..max_ranks.
    `deadline` (time.monotonic()): stop there; each invariant is then reported with the smallest
    violating case seen so far (shrinking may be cut short). `on_case(result)` after every case;
    `on_wait(rank, seconds, phase)` while a rank has run a second or more on one case (what the
    search is doing: "generating", "shrinking, attempt 3", ...).
    `transform(case)` maps each drawn case (None: drop it) and `run_many(cases, target, runner)`
    yields their observations (`pcpcheck vllm` reorders steps as a release would and runs them
    through rank_step); reduce=False skips the greedy reductions (their cases are not in a
    release's order).
    """
    run = _Search(target, regime, runner, max_examples, max_ranks, pcp_sizes, deadline, on_case,
                  transform, run_many, on_wait)
    result = run.result
    started = time.perf_counter()
    with run.watching(runner):
        found = run.generate(random.Random(0 if derandomize else seed))
        if found is None:
            result.budget_reached = True
        elif found:
            cheap = {i: choices for i, choices in found.items() if not run.smallest[i].costly}
            shrunk = run.shrink(cheap) if cheap else {}
            result.budget_reached = shrunk is None
            run.smallest.update(shrunk or {})  # hypothesis' shrunk case stands where it has one
        if not result.budget_reached:
            for invariant, observation in list(run.smallest.items()):
                if observation.costly:  # from generation, or an attempt that hung while shrinking
                    run.smallest[invariant] = run.scan(observation)
        result.counterexamples = list(run.smallest.values())
        if reduce and not result.budget_reached:  # past the budget, the search's smallest stand
            result.counterexamples = [o if id(o) in run.replayed else run.reduced(o)
                                      for o in result.counterexamples]
        # An invariant violated only beside an earlier one, where the shrunk cases lost it: the
        # smallest case that showed it stands too, so every violated invariant cites a case.
        shown = {v.invariant for o in result.counterexamples for v in o.violations}
        for invariant, observation in run.witness.items():
            if invariant not in shown:
                result.counterexamples.append(observation)
                shown.update(v.invariant for v in observation.violations)
                if observation.costly:  # a hang's consequence (nothing written): not run again
                    run.replayed[id(observation)] = Replays(0, 0)
        result.counterexamples.sort(key=_priority)
        result.seconds = time.perf_counter() - started  # the search's rate: replays excluded
        result.replays = [run.replays(o) for o in result.counterexamples]
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
    on_wait: object
    result: RegimeResult = field(init=False)
    phase: str = "generating"  # what the search does now, for on_wait
    # id(counterexample) -> the replays its costly scan ran beside it
    replayed: dict[int, Replays] = field(default_factory=dict)
    # per first invariant, the smallest violating case seen (_size): what the deadline leaves
    smallest: dict[str, Observation] = field(default_factory=dict)
    # per invariant violated at all (first or not), the smallest case that violates it
    witness: dict[str, Observation] = field(default_factory=dict)

    def __post_init__(self):
        self.result = RegimeResult(self.regime)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The world sizes a case may shrink to."""
        return tuple(self.pcp_sizes) if self.pcp_sizes else tuple(range(2, self.max_ranks + 1))

    @contextlib.contextmanager
    def watching(self, *backends):
        """While the search runs, each backend tells on_wait about a rank running long."""
        def slow(rank: int, seconds: float) -> None:
            if self.on_wait is not None:
                self.on_wait(rank, seconds, self.phase)
        backends = [backend for backend in backends if backend is not None]
        for backend in backends:
            backend.on_slow = slow
        try:
            yield
        finally:
            for backend in backends:
                backend.on_slow = None

    def record(self, observation: Observation) -> str | None:
        """Count a case; its first violated invariant, if any."""
        result = self.result
        result.cases += 1
        call = max((view.seconds for view in observation.ranks), default=0.0)
        result.slowest_call = max(result.slowest_call, call)
        result.call_seconds += call
        result.checked.update(observation.checked)
        result.violated.update(v.invariant for v in observation.violations)
        result.real_stages.update(getattr(observation, "real_stages", ()))
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
        self.phase = "generating, case 1"
        for observation in self.run_many(stream(), self.target, self.runner):
            choices = pending.popleft()
            count += 1
            self.phase = f"generating, case {count + 1}"
            first = self.record(observation)
            if first is not None:
                if first not in found:
                    first_at, last_at = first_at or count, count
                if self.smallest[first] is observation:  # the smallest of its invariant so far
                    found[first] = choices
            if observation.costly:  # evidence at once; the cases in flight could cost as much
                break
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

        attempts, began = [0], time.perf_counter()

        @settings(max_examples=self.max_examples, deadline=None,
                  database=_Stored([choices_to_bytes(c) for c in found.values()]),
                  report_multiple_bugs=True, verbosity=Verbosity.quiet, print_blob=False,
                  phases=(Phase.reuse, Phase.shrink), suppress_health_check=list(HealthCheck))
        @hypothesis_seed(SHRINK_SEED)  # below @settings: a seed's own settings drop the database
        @given(case=strategy)
        def check(case: Case) -> None:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise _BudgetReached
            attempts[0] += 1
            self.phase = f"shrinking, attempt {attempts[0]}"
            started = time.perf_counter()
            observation = next(iter(self.run_many([case], self.target, self.runner)))
            self.result.check_seconds += time.perf_counter() - started
            first = self.record(observation)
            if observation.costly:
                raise _Costly
            if first is not None:
                raise _violation_type(first)(observation)

        violations: list[InvariantViolated] = []
        try:
            check()
        except _BudgetReached:
            return None
        except _Costly:  # the smallest cases seen so far stand, with why they are not smaller
            note = (f"shrinking stopped after {attempts[0]} attempts / "
                    f"{time.perf_counter() - began:.1f} s: attempt {attempts[0]} hung or killed "
                    "its worker, and each further one could")
            for invariant in found:
                self.smallest[invariant].note = note
            return {}
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


    def scan(self, observation: Observation) -> Observation:
        """A costly counterexample's smallest form: the smaller cases tried in order of size
        (reduce.ascending), each on the runner and, at the same time, on a twin backend; the
        first that shows the same violation again is the smallest tried, and its twin's run is
        its replay. At most SCAN_ATTEMPTS cases and 3 timeouts + 30 s."""
        invariant = observation.violations[0].invariant
        candidates = ascending(observation.prepared.case, self.sizes)
        if self.transform is not None:
            candidates = (c for c in map(self.transform, candidates) if c is not None)
        twin = self.runner.twin()
        began = time.perf_counter()
        budget = 3 * self.runner.timeout + 30.0
        found, again, tried = observation, None, 0
        phase = "looking for the smallest case that shows it again, attempt {}"
        self.phase = phase.format(1)
        try:
            for tried, (mine, theirs) in enumerate(
                    _beside(candidates, self.target, self.runner, twin, self.run_many), 1):
                self.phase = phase.format(tried + 1)
                self.record(mine)
                if mine.violations and mine.violations[0].invariant == invariant:
                    found, again = mine, theirs
                    break
                if tried >= SCAN_ATTEMPTS or time.perf_counter() - began > budget or (
                        self.deadline is not None and time.monotonic() >= self.deadline):
                    break
        finally:
            if twin is not None:
                twin.close()
        seconds = time.perf_counter() - began
        how = "hung" if any(v.lost == "hung" for v in observation.ranks) else "killed its worker"
        if found is observation:
            found.note = (f"shrinking stopped after {tried} attempts / {seconds:.1f} s: no smaller "
                          f"case tried showed it again (the case {how})")
        else:
            found.note = (f"shrunk in {seconds:.1f} s: the first of {tried} smaller cases, tried "
                          f"in order of size, that showed it again ("
                          + ("its replay ran beside it, " if again is not None else "")
                          + f"each case that {how} cost one wait)")
        if again is not None:
            reproduced = bool(again.violations) and again.violations[0].invariant == invariant
            self.replayed[id(found)] = Replays(1, int(reproduced))
        return found

    def reduced(self, observation: Observation) -> Observation:
        def attempt(n: int) -> None:
            self.phase = f"reducing, attempt {n}"
        return _reduced(observation, self.runner, self.target, self.run_many, self.sizes, attempt)

    def replays(self, observation: Observation) -> Replays:
        """How often the counterexample's case shows its violation again: the replay its scan
        ran beside it, one replay of a costly case, REPLAYS of any other (ended by a replay that
        hangs or kills its worker)."""
        if id(observation) in self.replayed:
            return self.replayed[id(observation)]
        self.phase = "replaying the counterexample"
        runs = 1 if observation.costly else REPLAYS
        invariant = observation.violations[0].invariant
        done = reproduced = 0
        for again in self.run_many([observation.prepared.case] * runs, self.target, self.runner):
            done += 1
            reproduced += bool(again.violations) and again.violations[0].invariant == invariant
            if again.costly and not observation.costly:
                break
        return Replays(done, reproduced)


def _beside(cases, target, runner, twin, run_many):
    """(observation on runner, observation on twin or None) per case, one case at a time on
    both backends at once (the twin's in a thread: both mostly wait on their workers), so a
    case that hangs on both costs one wait, and nothing is left in flight when the caller stops."""
    for case in cases:
        if twin is None:
            yield next(iter(run_many([case], target, runner))), None
            continue
        theirs: list = []

        def run_beside(case=case):
            try:
                theirs.append(next(iter(run_many([case], target, twin))))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                theirs.append(exc)

        thread = threading.Thread(target=run_beside, name="pcpcheck-twin", daemon=True)
        thread.start()
        try:
            mine = next(iter(run_many([case], target, runner)))
        finally:
            thread.join()
        if isinstance(theirs[0], BaseException):
            raise theirs[0]
        yield mine, theirs[0]


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


def _reduced(observation: Observation, runner, target, run_many=run_cases, sizes=None,
             on_attempt=None, budget: int = 400, seconds: float = 60.0) -> Observation:
    """The counterexample after greedy reductions (reduce.smaller, to world sizes among `sizes`)
    that keep its first violated invariant: hypothesis' shrink can stop in a local minimum. At
    most `budget` cases and `seconds`; a case that hangs or kills its worker ends them."""
    invariant = observation.violations[0].invariant
    deadline = time.perf_counter() + seconds
    attempts, improved = 0, True
    while improved:
        improved = False
        for case in smaller(observation.prepared.case, sizes):
            if attempts >= budget or time.perf_counter() > deadline:
                return observation
            attempts += 1
            if on_attempt is not None:
                on_attempt(attempts)
            candidate = next(iter(run_many([case], target, runner)))
            if candidate.costly:
                observation.note = (f"reductions stopped after {attempts} attempts: attempt "
                                    f"{attempts} hung or killed its worker")
                return observation
            if candidate.violations and candidate.violations[0].invariant == invariant:
                observation, improved = candidate, True
                break
    return observation


def _size(observation: Observation) -> tuple:
    return size(observation.prepared.case)
