"""The CUDA stream model's cost per step: the sharded regime of impl checked with and without
`--async` (the protocol on the CPU model of streams, against the gather alone), the two
commands alternating; CPU seconds of each command and every process under it, per case, and
cases per second. Printed, never asserted.

    python benchmarks/async_cost.py [--cases 2000] [--rounds 3] [--max-ranks 4]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time


def run(extra: list[str], cases: int, max_ranks: int) -> tuple[float, float]:
    """(ms CPU per case, cases per second) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "pcpcheck", "check", "impl", "--regime", "sharded",
                    "--max-examples", str(cases), "--max-ranks", str(max_ranks), *extra],
                   check=True, capture_output=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return 1000 * cpu / cases, cases / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-ranks", type=int, default=4)
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {"gather": [], "--async": []}
    for _ in range(args.rounds):
        figures["gather"].append(run([], args.cases, args.max_ranks))
        figures["--async"].append(run(["--async"], args.cases, args.max_ranks))
    for name, runs in figures.items():
        cpu = [c for c, _ in runs]
        rate = [r for _, r in runs]
        print(f"{name:8} ms CPU per case {', '.join(f'{c:.2f}' for c in cpu)} "
              f"(median {statistics.median(cpu):.2f}); cases/s {', '.join(f'{r:.0f}' for r in rate)}")
    ratio = statistics.median(c for c, _ in figures["--async"]) / statistics.median(
        c for c, _ in figures["gather"])
    print(f"the stream model costs {ratio:.2f}x the gather's CPU per case")


if __name__ == "__main__":
    main()
