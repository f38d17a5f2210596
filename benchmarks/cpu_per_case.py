"""CPU seconds per case of the default run, driver and workers together: a checkout of the
landed code (--before) beside this tree, the two commands alternating, printed, never asserted.

    python benchmarks/cpu_per_case.py --before /tmp/landed [--rounds 3] [--max-ranks 4,8]

Each run is `python -m pcpcheck check impl --max-ranks P` (the default run: four regimes of 3,000
cases) in a fresh process tree; its CPU is what the command and every process under it used
(getrusage of the reaped children: the fork server reaps its workers, the driver the fork
server), divided by the cases it judged. Each tree's packages are imported from the tree itself
(a folder of links maps pcpcheck_spec to its spec/ and so on), never from the installed copy.

Then the floor of this tree, per P: what no checker of this design can go below. The fixed
start (the CPU of the same command with --max-examples 1, spread over the default run's cases),
and the target's own calls: the default run's very cases, their inputs built beforehand, run
in this process on the greenlet scheduler the worker uses (CPU of the calls alone), and of that
the scheduler's share (a target that only gathers one small tensor per case). Last, the checker's
own CPU per case of each tree: its median less this tree's floor.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PACKAGES = {"pcpcheck": "pcpcheck", "pcpcheck_spec": "spec", "pcpcheck_reference": "reference",
            "pcpcheck_impl": "impl"}


def import_path(tree: Path, links: Path) -> str:
    """`links`, made a folder whose entries are the tree's packages under their import names."""
    links.mkdir()
    for name, folder in PACKAGES.items():
        (links / name).symlink_to(tree / folder)
    return str(links)


def measure(tree: Path, path: str, argv: list[str]) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, cases) of one run of `pcpcheck ARGV` from `tree`, in a fresh
    process tree (its CPU: the command and every process under it, reaped)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pcpcheck", *argv], cwd=tree,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = re.search(r"all regimes:\s+(\d+) cases", done.stdout)
    if done.returncode != 0 or found is None:
        sys.exit(f"{tree} {argv}: exit {done.returncode}\n{done.stdout[-2000:]}"
                 f"{done.stderr[-2000:]}")
    return cpu, wall, int(found.group(1))


def run(tree: Path, path: str, max_ranks: int) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, cases) of one default run from `tree`."""
    return measure(tree, path, ["check", "impl", "--max-ranks", str(max_ranks)])


def floor(max_ranks: int) -> tuple[float, float, float]:
    """(fixed start, the target's calls, the scheduler's share): ms CPU per case of this tree's
    default run at `max_ranks`."""
    import random

    import torch

    from pcpcheck.judge.prepare import prepare
    from pcpcheck.search.draw import draw_case
    from pcpcheck.worker.loader import load_target
    from pcpcheck.worker.rankctx import current_group
    from pcpcheck.worker.runner import ThreadRunner
    from pcpcheck_spec.names import DEFAULT_REGIMES

    cases = 3000
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "pcpcheck", "check", "impl", "--max-ranks", str(max_ranks),
                    "--max-examples", "1"], cwd=HERE, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    total = cases * len(DEFAULT_REGIMES)
    prepared = []
    for regime in DEFAULT_REGIMES:
        rng = random.Random(0)  # the search's draws, derandomized: a seed of 0 per regime
        prepared += [prepare(draw_case(rng, (regime,), max_ranks)[0]) for _ in range(cases)]
    inputs = [[p.inputs(rank) for rank in range(p.size)] for p in prepared]
    targets = [load_target("impl") for _ in range(max_ranks)]
    runner = ThreadRunner()
    small = torch.zeros(1)

    def calls(call) -> float:
        began = time.process_time()
        for each, rank_inputs in zip(prepared, inputs):
            runner.run(each.size, lambda rank: call(each, rank_inputs[rank], rank))
        return time.process_time() - began

    target = calls(lambda each, args, rank: targets[rank].call(*args, each.shard,
                                                               group=current_group()))
    scheduler = calls(lambda each, args, rank: current_group().all_gather(small, 0))
    return 1e3 * start / total, 1e3 * target / total, 1e3 * scheduler / total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path,
                        help="a checkout of the landed code (required, but with --floor-only)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-ranks", default="4,8")
    parser.add_argument("--floor-only", action="store_true", help="print this tree's floor alone")
    options = parser.parse_args()
    if options.floor_only:
        print_floors(options.max_ranks)
        return
    if options.before is None:
        parser.error("--before is required (a checkout of the landed code), but with --floor-only")
    trees = {"landed": options.before.resolve(), "this tree": HERE}
    medians: dict[int, dict[str, float]] = {}  # P -> tree -> median ms CPU per case
    with tempfile.TemporaryDirectory() as scratch:
        paths = {name: import_path(tree, Path(scratch, name.replace(" ", "_")))
                 for name, tree in trees.items()}
        for max_ranks in map(int, options.max_ranks.split(",")):
            per_case: dict[str, list[float]] = {name: [] for name in trees}
            for round_ in range(options.rounds):
                for name, tree in trees.items():
                    cpu, wall, cases = run(tree, paths[name], max_ranks)
                    per_case[name].append(1e3 * cpu / cases)
                    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
                    print(f"P <= {max_ranks}, round {round_ + 1}, {name:<9}: {cases} cases, "
                          f"{cpu:6.1f} s CPU, {wall:5.1f} s wall, {1e3 * cpu / cases:.2f} ms CPU "
                          f"per case (load {load})", flush=True)
            medians[max_ranks] = {name: statistics.median(values) for name, values in per_case.items()}
            landed, this = medians[max_ranks]["landed"], medians[max_ranks]["this tree"]
            print(f"P <= {max_ranks}: median ms CPU per case, landed {landed:.2f}, "
                  f"this tree {this:.2f}: {landed / this:.2f}x cheaper", flush=True)
    floors = print_floors(options.max_ranks)
    for max_ranks, below in floors.items():  # the checker's own: the total less the floor
        landed, this = (medians[max_ranks][name] - below for name in ("landed", "this tree"))
        print(f"P <= {max_ranks}: the checker's own ms CPU per case (median less this tree's "
              f"floor), landed {landed:.2f}, this tree {this:.2f}: {landed / this:.2f}x cheaper",
              flush=True)


def print_floors(max_ranks_list: str) -> dict[int, float]:
    """Print this tree's floor per P; the floors (ms CPU per case) by P."""
    floors = {}
    for max_ranks in map(int, max_ranks_list.split(",")):
        start, target, scheduler = floor(max_ranks)
        floors[max_ranks] = start + target
        print(f"P <= {max_ranks}: floor of this tree, ms CPU per case: fixed start {start:.2f}, "
              f"the target's calls {target:.2f} (of which the scheduler {scheduler:.2f}): "
              f"{start + target:.2f} together (load "
              + " ".join(f"{x:.1f}" for x in os.getloadavg()) + ")", flush=True)
    return floors


if __name__ == "__main__":
    main()
