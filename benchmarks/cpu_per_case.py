"""CPU seconds per case of the default run, driver and workers together: a checkout of the
landed code (--before) beside this tree, the two commands alternating, printed, never asserted.

    python benchmarks/cpu_per_case.py --before /tmp/landed [--rounds 3] [--max-ranks 4,8]

Each run is `python -m pcpcheck check impl --max-ranks P` (the default run: four regimes of 3,000
cases) in a fresh process tree; its CPU is what the command and every process under it used
(getrusage of the reaped children: the fork server reaps its workers, the driver the fork
server), divided by the cases it judged. Each tree's packages are imported from the tree itself
(a folder of links maps pcpcheck_spec to its spec/ and so on), never from the installed copy.
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


def run(tree: Path, path: str, max_ranks: int) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, cases) of one default run from `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pcpcheck", "check", "impl",
                           "--max-ranks", str(max_ranks)], cwd=tree, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": path})
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = re.search(r"all regimes:\s+(\d+) cases", done.stdout)
    if done.returncode != 0 or found is None:
        sys.exit(f"{tree}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return cpu, wall, int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the landed code")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-ranks", default="4,8")
    options = parser.parse_args()
    trees = {"landed": options.before.resolve(), "this tree": HERE}
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
            medians = {name: statistics.median(values) for name, values in per_case.items()}
            print(f"P <= {max_ranks}: median ms CPU per case, landed {medians['landed']:.2f}, "
                  f"this tree {medians['this tree']:.2f}: "
                  f"{medians['landed'] / medians['this tree']:.2f}x cheaper", flush=True)


if __name__ == "__main__":
    main()
