"""Throughput of the check's hot loop: cases per second, printed, never asserted.

- run+judge: the isolated threads backend (one worker process hosting the P ranks) plus judging,
  on pre-drawn cases, per PCP size P: one case per round trip (what the search does, since
  hypothesis draws the next case only after judging this one), and pipelined (`check.run_cases`:
  the worker runs the next case while the driver judges this one);
- end to end: `engine.search` on the bundled impl, hypothesis drawing included.
Best of --repeat runs (the machine is shared).
"""

from __future__ import annotations

import argparse
import time

from hypothesis import HealthCheck, given, settings

from pcpcheck.backends import make_backend
from pcpcheck.cases import cases
from pcpcheck.check import run_case, run_cases
from pcpcheck.engine import search
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


def best_rate(run, count: int, repeat: int) -> float:
    best = 0.0
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = max(best, count / (time.perf_counter() - started))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="2,4,8")
    args = parser.parse_args()
    with make_backend("threads", timeout=10.0) as backend:
        target = backend.load("impl")
        print("run+judge on pre-drawn cases (bundled impl, all regimes mixed), cases/s:")
        for size in map(int, args.sizes.split(",")):
            batch = drawn_cases(size, 3000)
            for case in batch[:20]:  # warm the worker
                run_case(case, target, backend)
            one = best_rate(lambda: [run_case(case, target, backend) for case in batch],
                            len(batch), args.repeat)
            piped = best_rate(lambda: list(run_cases(batch, target, backend)), len(batch), args.repeat)
            print(f"  P={size}: {len(batch)} cases, {one:6.0f} one per round trip, {piped:6.0f} pipelined")
        print("end to end (hypothesis drawing included), P <= 4, 300 cases per regime:")
        for regime in REGIMES:
            result = search(target, regime, backend, max_examples=300, max_ranks=4)
            print(f"  {regime:<12} {result.cases / result.seconds:6.0f} cases/s end to end, "
                  f"{result.cases / result.check_seconds:6.0f} cases/s run+judge")


if __name__ == "__main__":
    main()
