"""What happens to a counterexample once the search has one: its smaller cases run until none
shows it again, then its own case runs again to tell a flaky target from a steady one.

- `reduced`: greedy reductions (pcpcheck.search.reduce.smaller) that keep its first violated
  invariant, for a counterexample hypothesis shrank (its shrink can stop in a local minimum).
- `scan`: a costly counterexample (a rank hung or died: every run of it costs a timeout or a
  worker) is not shrunk by hypothesis, whose every attempt could cost as much: its smaller cases
  (reduce.ascending) are tried in order of size, each beside its replay on a twin backend, so the
  first that shows it again is the smallest tried and its replay ran in the same wait.
- `replay_counterexample`: the counterexample's case REPLAYS more times (a costly one once); a
  violation its own replays do not always show is flaky.
What cut a phase short is the counterexample's `note`, which the report prints.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pcpcheck.judge.run import run_cases
from pcpcheck.judge.verdict import Observation
from pcpcheck.search.reduce import ascending, smaller

REPLAYS = 5  # runs of each counterexample's case after the search
SCAN_ATTEMPTS = 500  # smaller cases tried for a costly counterexample, at most


@dataclass(frozen=True)
class Replays:
    """How often a counterexample's case showed its violation again when run `runs` more times."""

    runs: int
    reproduced: int  # runs whose first violation was the counterexample's

    @property
    def flaky(self) -> bool:
        return self.reproduced < self.runs


def _shows(observation, invariant: str) -> bool:
    return bool(observation.violations) and observation.violations[0].invariant == invariant


def replay_counterexample(observation: Observation, target, runner, run_many=run_cases,
                          slow: bool = False) -> Replays:
    """The counterexample's case run REPLAYS more times (once if costly, each run costing a
    timeout or a worker, or `slow`, each costing seconds); a replay that hangs or kills its
    worker ends them."""
    runs = 1 if observation.costly or slow else REPLAYS
    invariant = observation.violations[0].invariant
    done = reproduced = 0
    for again in run_many([observation.prepared.case] * runs, target, runner):
        done += 1
        reproduced += _shows(again, invariant)
        if again.costly and not observation.costly:
            break
    return Replays(done, reproduced)


def reduced(observation: Observation, target, runner, run_many=run_cases, sizes=None,
            on_attempt=None, budget: int = 400, seconds: float = 60.0,
            stop: Callable[[], str | None] | None = None) -> Observation:
    """The counterexample after greedy reductions (reduce.smaller, to world sizes among `sizes`)
    that keep its first violated invariant. At most `budget` cases and `seconds`; a case that
    hangs or kills its worker ends them, and so does `stop()` answering why. `on_attempt(n)`
    before the n-th case runs."""
    invariant = observation.violations[0].invariant
    deadline = time.perf_counter() + seconds
    attempts, improved = 0, True
    while improved:
        improved = False
        for case in smaller(observation.prepared.case, sizes):
            if attempts >= budget or time.perf_counter() > deadline:
                return observation
            why = stop() if stop is not None else None
            if why:
                observation.note = f"reductions stopped after {attempts} attempts: {why}"
                return observation
            attempts += 1
            if on_attempt is not None:
                on_attempt(attempts)
            candidate = next(iter(run_many([case], target, runner)))
            if candidate.costly:
                observation.note = (f"reductions stopped after {attempts} attempts: attempt "
                                    f"{attempts} hung or killed its worker")
                return observation
            if _shows(candidate, invariant):
                observation, improved = candidate, True
                break
    return observation


def scan(observation: Observation, target, runner, run_many, sizes, *, transform=None,
         deadline: float | None = None, record=None, on_attempt=None,
         stop: Callable[[], str | None] | None = None) -> tuple[Observation, Replays | None]:
    """A costly counterexample's smallest form, and its replay where one ran beside it: the
    smaller cases tried in order of size (reduce.ascending, to world sizes among `sizes`; mapped
    by `transform`, None dropped), each on `runner` and at the same time on its twin backend.
    The first that shows the same violation again is the smallest tried. At most SCAN_ATTEMPTS
    cases, 3 timeouts + 30 s, `deadline` (time.monotonic()) and `stop()` (why it must stop,
    else None). `record(observation)` counts every case run on `runner`; `on_attempt(n)` before
    the n-th."""
    invariant = observation.violations[0].invariant
    candidates = ascending(observation.prepared.case, sizes)
    if transform is not None:
        candidates = (c for c in map(transform, candidates) if c is not None)
    twin = runner.twin()
    began = time.perf_counter()
    budget = 3 * runner.timeout + 30.0
    found, again, tried = observation, None, 0
    stopped: list[str] = []  # why `stop` ended the scan, checked before each attempt

    def until_stopped(cases):
        for case in cases:
            why = stop() if stop is not None else None
            if why:
                stopped.append(why)
                return
            yield case
    if on_attempt is not None:
        on_attempt(1)
    try:
        attempts = _beside(until_stopped(candidates), target, runner, twin, run_many)
        for tried, (mine, theirs) in enumerate(attempts, 1):
            if on_attempt is not None:
                on_attempt(tried + 1)
            if record is not None:
                record(mine)
            if _shows(mine, invariant):
                found, again = mine, theirs
                break
            if tried >= SCAN_ATTEMPTS or time.perf_counter() - began > budget or (
                    deadline is not None and time.monotonic() >= deadline):
                break
    finally:
        if twin is not None:
            twin.close()
    seconds = time.perf_counter() - began
    how = "hung" if any(view.lost == "hung" for view in observation.ranks) else "killed its worker"
    if found is observation and stopped:
        found.note = f"shrinking stopped after {tried} attempts / {seconds:.1f} s: {stopped[0]}"
    elif found is observation:
        found.note = (f"shrinking stopped after {tried} attempts / {seconds:.1f} s: no smaller "
                      f"case tried showed it again (the case {how})")
    else:
        found.note = (f"shrunk in {seconds:.1f} s: the first of {tried} smaller cases, tried "
                      f"in order of size, that showed it again ("
                      + ("its replay ran beside it, " if again is not None else "")
                      + f"each case that {how} cost one wait)")
    return found, (None if again is None else Replays(1, int(_shows(again, invariant))))


def _beside(cases, target, runner, twin, run_many
            ) -> Iterator[tuple[Observation, Observation | None]]:
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
