"""The driver's own work per case, printed, never asserted: microseconds of `judge.prepare`,
`judge.observe` (every rank) and `judge.judge` on pre-drawn cases, per PCP size P.

The workers' replies are collected once (threads backend, bundled impl, every regime mixed), then
each phase is timed alone over the whole batch: the driver's CPU time (no worker runs meanwhile;
on a shared machine CPU time moves less than wall time), best of --repeat.

    python benchmarks/driver.py [--sizes 2,4,8] [--count 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import time

from benchmarks.throughput import drawn_cases
from pcpcheck.backends import make_backend
from pcpcheck.judge.observe import observe
from pcpcheck.judge.prepare import prepare
from pcpcheck.judge.verdict import judge


def forget_batches() -> None:
    """Each repeat sees every case afresh: prepare keeps what it derives per batch (a batch drawn
    again within the cases is a hit, as in a search; one seen in an earlier repeat must not be)."""
    module = importlib.import_module("pcpcheck.judge.prepare")
    clear = getattr(getattr(module, "_kept_plan", None), "cache_clear", None)  # absent before the cache existed
    if clear:
        clear()


def each(function, arguments) -> None:
    """Call function on every argument tuple, keeping no result (as the search does: a growing
    heap would make the garbage collector's passes, not the work, the figure)."""
    for args in arguments:
        function(*args)


def observe_all(prepared, results):
    return [observe(prepared, rank, result) for rank, result in enumerate(results)]


def best_us(run, count: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        forget_batches()
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--count", type=int, default=1000, help="examples drawn per size")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print("driver work per case on pre-drawn cases (bundled impl, all regimes mixed), us:")
    print("   P  cases  prepare  observe    judge    total  (cases/s of driver work)")
    with make_backend("threads", timeout=10.0) as backend:
        target = backend.load("impl")
        for size in map(int, args.sizes.split(",")):
            cases = drawn_cases(size, args.count)
            prepared = [prepare(case) for case in cases]
            replies = list(backend.run_many(prepared, target))
            views = [observe_all(p, results) for p, results in zip(prepared, replies)]
            n = len(cases)
            prepare_us = best_us(lambda: each(prepare, ((case,) for case in cases)), n, args.repeat)
            observe_us = best_us(lambda: each(observe_all, zip(prepared, replies)), n, args.repeat)
            judge_us = best_us(lambda: each(judge, zip(prepared, views)), n, args.repeat)
            total = prepare_us + observe_us + judge_us
            print(f"  {size:2d} {n:6d} {prepare_us:8.1f} {observe_us:8.1f} {judge_us:8.1f} {total:8.1f}"
                  f"  ({1e6 / total:,.0f})")


if __name__ == "__main__":
    main()
