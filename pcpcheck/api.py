"""Python entry points for scripts and generated reproducers."""

from __future__ import annotations

from dataclasses import dataclass

from pcpcheck import report
from pcpcheck.cases import Case
from pcpcheck.loader import load_target
from pcpcheck.runner import ThreadRunner


@dataclass
class Verdict:
    holds: bool
    violated: list[str]  # invariant IDs, first one is what the case is reported under
    report: str  # the counterexample as `pcpcheck check` prints it, or "" when it holds


def replay(target: str, case_json: str, function: str | None = None,
           timeout: float = 10.0) -> Verdict:
    """Judge one case (JSON as printed by pcpcheck) against a target, in-process."""
    loaded = load_target(target, function)
    case = Case.from_json(case_json)
    observation = ThreadRunner(timeout=timeout).observe_case(case, loaded)
    violated = [v.invariant for v in observation.violations]
    text = report.counterexample(observation, case.batch.regime, loaded.source, function,
                                 loaded) if violated else ""
    return Verdict(not violated, violated, text)
