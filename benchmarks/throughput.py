"""Throughput of the check's hot loop: cases per second, printed, never asserted.

- run+judge: a backend plus judging, on pre-drawn cases, per PCP size P: one case per round
  trip (`judge.run_case` per case: what a search that draws each case after judging the last
  one gets), and streamed (`judge.run_cases`: the backend sends several cases per message and
  keeps two messages in flight, base.BatchedBackend); threads (one worker process hosting the
  P ranks) and, with --backends, gloo (one process per rank, real collectives);
- end to end: `engine.search` on the bundled impl, drawing included (threads).
Best of --repeat runs (the machine is shared); the load average is printed with every figure.
"""

from __future__ import annotations

import argparse
import os
import random
import time

from pcpcheck.backends import make_backend
from pcpcheck.judge.run import run_case, run_cases
from pcpcheck.search.draw import draw_case
from pcpcheck.search.engine import search
from pcpcheck_spec.names import REGIMES


def drawn_cases(max_ranks: int, count: int):
    """The cases of size max_ranks among `count` drawn (every regime), seeded."""
    rng = random.Random(0)
    drawn = [draw_case(rng, REGIMES, max_ranks)[0] for _ in range(count)]
    return [case for case in drawn if case.batch.pcp_size == max_ranks]


def best_rate(run, count: int, repeat: int) -> float:
    best = 0.0
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = max(best, count / (time.perf_counter() - started))
    return best


def load() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def cpu_seconds(pids) -> float:
    """User + system CPU of processes (Linux /proc), to weigh a run on a shared machine."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def cpu_per_case(run, count: int, pids) -> str:
    """CPU per case of one run: the driver's and the workers' (less sensitive to load than
    cases/s)."""
    driver, workers = time.process_time(), cpu_seconds(pids)
    run()
    driver, workers = time.process_time() - driver, cpu_seconds(pids) - workers
    return f"CPU per case: driver {1e3 * driver / count:.2f} ms, workers {1e3 * workers / count:.2f} ms"


def run_and_judge(backend_name: str, sizes, count: int, repeat: int, max_batch: int | None) -> None:
    print(f"{backend_name}: run+judge on pre-drawn cases (bundled impl, all regimes mixed), cases/s:")
    for size in sizes:
        batch = drawn_cases(size, 3 * count)[:count]
        with make_backend(backend_name, timeout=10.0, world_sizes=[size]) as backend:
            if max_batch:
                backend.max_batch = max_batch
            target = backend.load("impl")
            for case in batch[:20]:  # warm the workers
                run_case(case, target, backend)
            def each(batch=batch, target=target, backend=backend):
                return [run_case(case, target, backend) for case in batch]

            def streaming(batch=batch, target=target, backend=backend):
                return list(run_cases(batch, target, backend))

            one = best_rate(each, len(batch), repeat)
            streamed = best_rate(streaming, len(batch), repeat)
            print(f"  P={size}: {len(batch)} cases, {one:6.0f} one per round trip, {streamed:6.0f} "
                  f"streamed ({load()})")
            print(f"    one per round trip: {cpu_per_case(each, len(batch), backend.pids)}")
            print(f"    streamed:           {cpu_per_case(streaming, len(batch), backend.pids)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--backends", default="threads", help="comma-separated: threads, gloo")
    parser.add_argument("--cases", type=int, default=1000, help="pre-drawn cases per P")
    parser.add_argument("--max-batch", type=int, default=None, help="cases per message at most")
    parser.add_argument("--no-search", action="store_true", help="skip the end-to-end figures")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    for name in args.backends.split(","):
        run_and_judge(name, sizes if name == "threads" else [s for s in sizes if s <= 4],
                      args.cases, args.repeat, args.max_batch)
    if args.no_search:
        return
    with make_backend("threads", timeout=10.0) as backend:
        target = backend.load("impl")
        print(f"end to end (threads, drawing included), P <= 4, 3000 cases per regime ({load()}):")
        for regime in REGIMES:
            result = search(target, regime, backend, max_examples=3000, max_ranks=4)
            print(f"  {regime:<12} {result.cases / result.seconds:6.0f} cases/s end to end, "
                  f"{result.cases / result.check_seconds:6.0f} cases/s run+judge")


if __name__ == "__main__":
    main()
