"""The search: cases are drawn per regime, every case is judged, violations are shrunk.

Generate, then shrink. A seeded random source draws cases (pcpcheck.search.draw.draw_case: the same
builder as the hypothesis strategy, 10-20x cheaper per case than a hypothesis example) and
streams them through the backend, several in flight. The smallest case violating each invariant
goes to hypothesis as a stored example (its choices); hypothesis replays it and shrinks it.

After the search each counterexample's case runs again
(pcpcheck.search.minimize.replay_counterexample): a violation that its own replays do not always
show is flaky (the target does not behave the same on the same case), and the report says so
rather than presenting it as an ordinary, shrunk case.

Each invariant gets its own exception class, so hypothesis treats violations of different
invariants as different bugs and shrinks each to its own minimal case (report_multiple_bugs).
A case is reported under the first invariant it violates (spec.registry order).

A case on which a rank hung or died ("costly": running it again costs a timeout or a worker) is
evidence at once: generation stops there, and it is not handed to hypothesis (every attempt that
hangs would cost a timeout) but scanned (pcpcheck.search.minimize.scan). A hang met while shrinking
another violation stops that shrinking. What ended a phase early is the counterexample's `note`.

A slow target (its cases that complete take SLOW_CALL seconds or more each, on average) has its
verdict within 2 x the per-rank timeout of the regime's start once it has a violation: past that,
generation stops without waiting for the cases in flight, shrinking, scanning, reductions and
replays stop, and the counterexample's note says why.
"""

from __future__ import annotations

import contextlib
import random
import time
import unittest
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase, choices_to_bytes

from pcpcheck.judge import coverage
from pcpcheck.judge.run import run_cases
from pcpcheck.judge.verdict import Observation
from pcpcheck.search import shard as shards
from pcpcheck.search.draw import cases, draw_case
from pcpcheck.search.minimize import Replays, reduced, replay_counterexample, scan
from pcpcheck.search.reduce import size
from pcpcheck.shared.case import Case
from pcpcheck.shared.defaults import DEFAULT_MAX_RANKS, MIN_RANKS
from pcpcheck.shared.errors import CheckerError
from pcpcheck.shared.protocol import TargetInfo
from pcpcheck_spec.registry import IDS

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from pcpcheck.backends.base import Backend


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


def priority(observation) -> int:
    """Report order: spec.registry's, for the first finding of a counterexample."""
    first = observation.violations[0].invariant
    return IDS.index(first) if first in IDS else len(IDS)


class _BudgetReached(BaseException):
    """Raised at the start of a case once the deadline has passed: a BaseException, so
    hypothesis neither shrinks nor reports it but unwinds at once."""


class _Costly(BaseException):
    """Raised where a case hung or killed its worker while shrinking another violation: every
    further attempt could cost as much, so shrinking stops (the case itself is recorded)."""


class _Slow(BaseException):
    """Raised at the start of an attempt once a slow target's regime has had its time
    (Search.slow_stop): shrinking stops, the smallest cases so far stand."""


@dataclass(kw_only=True)
class RegimeResult:
    regime: str
    cases: int = 0
    checked: Counter = field(default_factory=Counter)  # invariant -> cases evaluated
    violated: Counter = field(default_factory=Counter)  # invariant -> cases violating it
    branches: Counter = field(default_factory=Counter)  # gather branch -> cases taking it
    features: Counter = field(default_factory=Counter)  # layout feature -> cases exercising it
    counterexamples: list[Observation] = field(default_factory=list)  # shrunk, one per invariant
    replays: list[Replays] = field(default_factory=list)  # one per counterexample, in order
    not_applicable: str = ""  # why the target cannot reach this regime (then nothing is drawn)
    seconds: float = 0.0  # wall time of the whole search
    check_seconds: float = 0.0  # of which running and judging cases (drawing excluded)
    budget_reached: bool = False  # the deadline stopped the search early
    slowest_call: float = 0.0  # seconds of the slowest rank's call of any case
    call_seconds: float = 0.0  # the slowest rank's call of each case, summed (mean: / cases)
    scope_steps: int | None = None  # exhaustive search: the steps its scope holds (else None)
    real_stages: Counter = field(default_factory=Counter)  # a release's stage -> steps it ran


def count_coverage(result: RegimeResult, observation: Observation) -> None:
    """Add what a case exercised (pcpcheck.judge.coverage, from the case in the layout of the
    era it was prepared by, not the target) to a regime's counts."""
    prepared = observation.prepared
    branches, features = coverage.exercised(prepared.case, prepared.era)
    result.branches.update(branches)
    result.features.update(features)
    started = coverage.asynchronous([getattr(view, "streams", None) for view in observation.ranks])
    if started is not None:
        result.features[started] += 1
    # a release step judged per KV-cache group (other observations, a diff's pair, carry one)
    if getattr(observation, "kv_groups", 1) > 1:
        result.features[coverage.KV_GROUPS] += 1


MIN_CASES = 10  # hypothesis' least test calls before it stops looking for more bugs
SLOW_CALL = 1.0  # seconds of wall time per completed case, on average, that make a target slow
SHRINK_SEED = 0  # the shrinker's randomness: fixed, so a run is reproducible


def search(target, regime: str, runner, *, max_examples: int, max_ranks: int = DEFAULT_MAX_RANKS,
           derandomize: bool = True, seed: int | None = None, pcp_sizes=None,
           deadline: float | None = None, on_case=None, transform=None, run_many=run_cases,
           reduce: bool = True, on_wait=None, shard: shards.Shard | None = None) -> RegimeResult:
    """Check `target` on up to max_examples drawn cases of one regime, shrinking violations.

    Generate, then shrink: cases are drawn by draw.draw_case (seeded: 0 when derandomize,
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
    release's order). `shard` (K, N): part K of max_examples split N ways, drawn from a seed of
    its own (pcpcheck.search.shard).
    """
    max_examples = shards.share(max_examples, shard)
    run = Search(target=target, regime=regime, runner=runner, max_examples=max_examples,
                 max_ranks=max_ranks, pcp_sizes=tuple(pcp_sizes) if pcp_sizes else None,
                 deadline=deadline, on_case=on_case, transform=transform, run_many=run_many,
                 on_wait=on_wait)
    result = run.result
    started = time.perf_counter()
    with run.watching(runner):
        found = run.generate(random.Random(shards.part_seed(0 if derandomize else seed, shard)))
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
        for observation in uncited(result.counterexamples, run.witness):
            result.counterexamples.append(observation)
            if observation.costly:  # a hang's consequence (nothing written): not run again
                run.replayed[id(observation)] = Replays(0, 0)
        result.counterexamples.sort(key=priority)
        result.seconds = time.perf_counter() - started  # the search's rate: replays excluded
        result.replays = [run.replays(o) for o in result.counterexamples]
    return result


def uncited(counterexamples, witness: dict) -> list:
    """An invariant violated only beside an earlier one, where the counterexamples shown lost it:
    the case `witness` holds for it (invariant -> a case violating it), so that every violated
    invariant cites a case; each added case's violations count as cited."""
    shown = {v.invariant for o in counterexamples for v in o.violations}
    added = []
    for invariant, observation in witness.items():
        if invariant not in shown:
            added.append(observation)
            shown.update(v.invariant for v in observation.violations)
    return added


@dataclass(kw_only=True)
class Search:
    """One regime's search in progress: what its phases share (the random search's generation
    and shrinking, the exhaustive search's enumeration)."""

    target: TargetInfo | tuple[TargetInfo, TargetInfo]  # a diff runs a pair
    regime: str
    runner: Backend
    max_examples: int
    max_ranks: int
    pcp_sizes: tuple[int, ...] | None
    deadline: float | None
    on_case: Callable[[RegimeResult], None] | None
    transform: Callable[[Case], Case | None] | None
    run_many: Callable[..., Iterable[Observation]]
    on_wait: Callable[[int, float, str], None] | None
    result: RegimeResult = field(init=False)
    phase: str = "generating"  # what the search does now, for on_wait
    # id(counterexample) -> the replays its costly scan ran beside it
    replayed: dict[int, Replays] = field(default_factory=dict)
    # per first invariant, the smallest violating case seen (_size): what the deadline leaves
    smallest: dict[str, Observation] = field(default_factory=dict)
    # per invariant violated at all (first or not), the smallest case that violates it
    witness: dict[str, Observation] = field(default_factory=dict)
    began: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)  # when the last case was recorded
    completed: int = 0  # cases on which every rank's call completed
    completed_seconds: float = 0.0  # the wall time each of them took, summed

    def __post_init__(self):
        self.result = RegimeResult(regime=self.regime)

    @property
    def slow(self) -> bool:
        """Cases that complete take SLOW_CALL seconds or more on average (the wall time from
        one case's result to the next's): every attempt to shrink costs seconds."""
        return self.completed > 0 and self.completed_seconds >= SLOW_CALL * self.completed

    def slow_stop(self) -> str | None:
        """Why the search of a slow target stops now (2 x the per-rank timeout since the regime
        began: its verdict must not wait on attempts that cost seconds each), else None."""
        if not self.slow:
            return None
        timeout = self.runner.timeout
        if time.monotonic() < self.began + 2 * timeout:
            return None
        return (f"each attempt costs about {self.completed_seconds / self.completed:.1f} s (the "
                f"target's calls are slow), and a slow target's regime ends 2 x --timeout "
                f"({2 * timeout:g} s) after it began")

    @property
    def sizes(self) -> tuple[int, ...]:
        """The world sizes a case may shrink to."""
        return self.pcp_sizes or tuple(range(MIN_RANKS, self.max_ranks + 1))

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
        now = time.monotonic()
        wall, self.last_seen = now - self.last_seen, now
        if not observation.costly:
            self.completed += 1
            self.completed_seconds += wall
        result.slowest_call = max(result.slowest_call, call)
        result.call_seconds += call
        result.checked.update(observation.checked)
        result.violated.update(v.invariant for v in observation.violations)
        count_coverage(result, observation)
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
            elif found and self.slow_stop():  # nor wait for the cases in flight: seconds each
                self.runner.abandon()
                break
        self.result.check_seconds += time.perf_counter() - started - drawing
        return None if out_of_time else found

    def shrink(self, found: dict[str, list]) -> dict[str, Observation] | None:
        """Hypothesis shrinks the generation's violating cases: the shrunk observation per first
        invariant (none where a stored case did not fail again), or None if the deadline cut it
        short."""
        strategy = cases(regimes=(self.regime,), max_ranks=self.max_ranks, pcp_sizes=self.pcp_sizes)
        if self.transform is not None:
            strategy = cast("SearchStrategy[Case]",  # the filter drops what the transform drops
                            strategy.map(self.transform).filter(lambda case: case is not None))

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
            if self.slow_stop():
                raise _Slow
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
        except (_Costly, _Slow) as stopped:  # the smallest cases so far stand, with why
            why = (self.slow_stop() if isinstance(stopped, _Slow) else
                   f"attempt {attempts[0]} hung or killed its worker, and each further one could")
            note = (f"shrinking stopped after {attempts[0]} attempts / "
                    f"{time.perf_counter() - began:.1f} s: {why}")
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
            # no failures: caught is the whole group, which hypothesis raises flat
            exceptions = cast("BaseExceptionGroup[InvariantViolated]", caught).exceptions
            violations = list(cast("tuple[InvariantViolated, ...]", exceptions))
        except unittest.SkipTest:  # no stored case failed again (a flaky target): nothing shrunk
            pass
        except CheckerError:
            raise
        except Exception as exc:
            raise CheckerError(f"pcpcheck failed while checking: {exc!r}") from exc
        return {exc.observation.violations[0].invariant: exc.observation for exc in violations}


    def scan(self, observation: Observation) -> Observation:
        """A costly counterexample's smallest form (pcpcheck.search.minimize.scan); the replay
        that ran beside it stands for its replays."""
        def attempt(n: int) -> None:
            self.phase = f"looking for the smallest case that shows it again, attempt {n}"
        found, replayed = scan(observation, self.target, self.runner, self.run_many, self.sizes,
                               transform=self.transform, deadline=self.deadline,
                               record=self.record, on_attempt=attempt, stop=self.slow_stop)
        if replayed is not None:
            self.replayed[id(found)] = replayed
        return found

    def reduced(self, observation: Observation) -> Observation:
        def attempt(n: int) -> None:
            self.phase = f"reducing, attempt {n}"
        return reduced(observation, self.target, self.runner, self.run_many, self.sizes, attempt,
                       stop=self.slow_stop)

    def replays(self, observation: Observation) -> Replays:
        """The replay its scan ran beside it, else minimize.replay_counterexample's."""
        if id(observation) in self.replayed:
            return self.replayed[id(observation)]
        why = self.slow_stop()
        if why:
            observation.note = (f"{observation.note}; its case not replayed, for the same reason"
                                if observation.note and why in observation.note
                                else f"its case not replayed: {why}")
            return Replays(0, 0)
        self.phase = "replaying the counterexample"
        return replay_counterexample(observation, self.target, self.runner, self.run_many,
                                     slow=self.slow)


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


def _size(observation: Observation) -> tuple:
    return size(observation.prepared.case)
