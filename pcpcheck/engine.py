"""The search: hypothesis draws cases per regime, every case is judged, violations are shrunk.

Each invariant gets its own exception class, so hypothesis treats violations of different
invariants as different bugs and shrinks each to its own minimal case (report_multiple_bugs).
A case is reported under the first invariant it violates (spec.names.INVARIANTS order).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from pcpcheck.cases import Case, cases
from pcpcheck.check import Observation
from spec.names import INVARIANTS, LAYOUT

REPORTED = (LAYOUT, *INVARIANTS)  # reporting order: a release's layout before its gather


class InvariantViolated(Exception):
    """Raised inside the hypothesis test; carries the observation of the failing case."""

    def __init__(self, observation: Observation):
        self.observation = observation
        first = observation.violations[0]
        super().__init__(f"{first.invariant} violated on rank(s) {first.ranks}")


_VIOLATION_TYPES = {i: type(f"{i}Violated", (InvariantViolated,), {}) for i in REPORTED}


class CheckerError(Exception):
    """pcpcheck itself failed (not the target): a bug to report, never a verdict."""


@dataclass
class RegimeResult:
    regime: str
    cases: int = 0
    checked: Counter = field(default_factory=Counter)  # invariant -> cases evaluated
    violated: Counter = field(default_factory=Counter)  # invariant -> cases violating it
    counterexamples: list[Observation] = field(default_factory=list)  # shrunk, one per invariant
    not_applicable: str = ""  # why the target cannot reach this regime (then nothing is drawn)
    seconds: float = 0.0  # wall time of the whole search
    check_seconds: float = 0.0  # of which running and judging cases (drawing excluded)


def search(target, regime: str, runner, *, max_examples: int, max_ranks: int = 8,
           derandomize: bool = True, seed: int | None = None, pcp_sizes=None,
           strategy=None) -> RegimeResult:
    """Check `target` on up to max_examples drawn cases of one regime, shrinking violations.

    `runner` is any backend with `observe_case(case, target) -> Observation` (threads, processes).
    `pcp_sizes` restricts the world sizes drawn (a process backend's pools); default 2..max_ranks.
    `strategy` replaces the default case strategy (`pcpcheck vllm` draws steps in a release's order).
    """
    result = RegimeResult(regime)

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=derandomize,
              report_multiple_bugs=True, verbosity=Verbosity.quiet, print_blob=False,
              phases=(Phase.explicit, Phase.generate, Phase.shrink),
              suppress_health_check=list(HealthCheck))
    @given(case=strategy if strategy is not None
           else cases(regimes=(regime,), max_ranks=max_ranks, pcp_sizes=pcp_sizes))
    def check(case: Case) -> None:
        started = time.perf_counter()
        observation = runner.observe_case(case, target)
        result.check_seconds += time.perf_counter() - started
        result.cases += 1
        result.checked.update(observation.checked)
        result.violated.update(v.invariant for v in observation.violations)
        if observation.violations:
            raise _VIOLATION_TYPES[observation.violations[0].invariant](observation)

    if seed is not None and not derandomize:
        check = hypothesis_seed(seed)(check)
    started = time.perf_counter()
    try:
        check()
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
    result.seconds = time.perf_counter() - started
    result.counterexamples.sort(key=lambda o: REPORTED.index(o.violations[0].invariant))
    return result
