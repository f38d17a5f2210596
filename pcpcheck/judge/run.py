"""One case end to end, the one path every case takes: prepared here (pcpcheck.judge.prepare),
run on the backend's workers (pcpcheck.backends), observed (pcpcheck.judge.observe) and judged
(pcpcheck.judge.verdict) here, in the driver.

The layout and the expected caches come from the numpy reference; the verdicts come from the
predicates of spec/invariants.py, evaluated on the index-level observation (rows as labels).
"""

from __future__ import annotations

from pcpcheck.judge.observe import observe
from pcpcheck.judge.prepare import prepare
from pcpcheck.judge.verdict import Observation, judge
from pcpcheck.shared.case import Case


def run_case(case: Case, target, backend) -> Observation:
    """Run one case on the backend's workers and judge it."""
    return next(run_cases([case], target, backend))


def run_cases(cases, target, backend):
    """The one place a case goes through: prepared here, run on the backend's workers
    (pcpcheck.backends; several may be in flight), observed and judged here, in the driver.
    Yields an Observation per case, in order."""
    prepared = [None]

    def prepare_each():
        for case in cases:
            prepared.append(prepare(case))
            yield prepared[-1]

    for results in backend.run_many(prepare_each(), target):
        done = prepared.pop(1)
        views = [observe(done, rank, result) for rank, result in enumerate(results)]
        violations, checked = judge(done, views)
        yield Observation(prepared=done, ranks=views, violations=violations, checked=checked)
