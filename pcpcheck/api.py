"""Python entry points for scripts and generated reproducers."""

from __future__ import annotations

from dataclasses import dataclass

from pcpcheck import report
from pcpcheck.cases import Case
from pcpcheck.backends import make_backend
from pcpcheck.check import run_case


@dataclass
class Verdict:
    holds: bool
    violated: list[str]  # invariant IDs, first one is what the case is reported under
    report: str  # the counterexample as `pcpcheck check` prints it, or "" when it holds


def replay(target: str, case_json: str, function: str | None = None,
           timeout: float = 10.0) -> Verdict:
    """Judge one case (JSON as printed by pcpcheck) against a target (run in a worker)."""
    case = Case.from_json(case_json)
    with make_backend("threads", timeout=timeout) as backend:
        loaded = backend.load(target, function)
        observation = run_case(case, loaded, backend)
    violated = [v.invariant for v in observation.violations]
    text = report.counterexample(observation, case.batch.regime, loaded.source, function,
                                 loaded) if violated else ""
    return Verdict(not violated, violated, text)
