"""Throughput of the check's hot loop: cases per second, printed, never asserted.

- run+judge: the thread rank runner plus judging on pre-drawn cases, per PCP size P;
- end to end: `engine.search` on the bundled impl, hypothesis drawing included.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings

from pcpcheck.cases import cases
from pcpcheck.engine import search
from pcpcheck.loader import load_target
from pcpcheck.runner import ThreadRunner
from spec.names import REGIMES


def drawn_cases(max_ranks: int, count: int):
    drawn = []

    @settings(max_examples=count, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(max_ranks=max_ranks))
    def collect(case):
        if case.batch.pcp_size == max_ranks:
            drawn.append(case)

    collect()
    return drawn


def main() -> None:
    target = load_target("impl")
    runner = ThreadRunner()
    print("run+judge on pre-drawn cases (bundled impl, all regimes mixed):")
    for size in (2, 4, 8):
        batch = drawn_cases(size, 3000)
        for case in batch[:20]:  # warm the rank threads
            runner.observe_case(case, target)
        started = time.perf_counter()
        for case in batch:
            runner.observe_case(case, target)
        seconds = time.perf_counter() - started
        print(f"  P={size}: {len(batch)} cases, {len(batch) / seconds:6.0f} cases/s")
    print("end to end (hypothesis drawing included), P <= 4, 300 cases per regime:")
    for regime in REGIMES:
        result = search(target, regime, runner, max_examples=300, max_ranks=4)
        print(f"  {regime:<12} {result.cases / result.seconds:6.0f} cases/s end to end, "
              f"{result.cases / result.check_seconds:6.0f} cases/s run+judge")


if __name__ == "__main__":
    main()
