"""The release path's cost: a checkout of the landed code (--before) beside this tree, the
commands alternating, printed, never asserted.

    python benchmarks/release_cost.py --before /tmp/landed [--rounds 2] [--release 0.34.0]
                                      [--no-exhaustive]

1. CPU of `pcpcheck vllm RELEASE --regime sharded --regime replicated --regime dcp
   --max-examples 1000` (the command and every process under it), per tree, and this / landed.
2. Steps per second of the release's default exhaustive scope (`pcpcheck vllm RELEASE
   --exhaustive`): its steps over its wall time, per tree, and this / landed.
3. This tree's per-stage counts of run 1 (its --json): per regime, the steps each stage of the
   path table ran as the release's own code.

Each tree's packages are imported from the tree itself (benchmarks/cpu_per_case.py import_path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark folder is no package
from cpu_per_case import HERE, import_path, measure

DRAWN = ["--regime", "sharded", "--regime", "replicated", "--regime", "dcp",
         "--max-examples", "1000"]


def _alternating(trees: dict, argv: list[str], rounds: int) -> dict[str, list[tuple]]:
    """Per tree, (CPU s, wall s, cases) of each round, the trees taking turns."""
    runs: dict[str, list[tuple]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, (tree, path) in trees.items():
            runs[name].append(measure(tree, path, argv))
    return runs


def _line(label: str, unit: str, values: dict[str, list[float]]) -> str:
    medians = {name: statistics.median(v) for name, v in values.items()}
    return (f"{label}: {unit}, " + "; ".join(
        f"{name} {', '.join(f'{v:.1f}' for v in vs)} (median {medians[name]:.1f})"
        for name, vs in values.items()) + f"; this / landed {medians['this'] / medians['landed']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the landed code")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--release", default="0.34.0")
    parser.add_argument("--no-exhaustive", action="store_true", help="skip figure 2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"landed": (args.before, import_path(args.before.resolve(), Path(scratch) / "a")),
                 "this": (HERE, import_path(HERE, Path(scratch) / "b"))}
        drawn = ["vllm", args.release, *DRAWN]
        runs = _alternating(trees, drawn, args.rounds)
        print(_line(f"pcpcheck {' '.join(drawn)}", "CPU s",
                    {name: [cpu for cpu, _, _ in r] for name, r in runs.items()}))
        if not args.no_exhaustive:
            exhaustive = ["vllm", args.release, "--exhaustive"]
            runs = _alternating(trees, exhaustive, args.rounds)
            print(_line(f"pcpcheck {' '.join(exhaustive)}", "steps/s",
                        {name: [cases / wall for _, wall, cases in r] for name, r in runs.items()}))
        report = Path(scratch) / "this.json"
        measure(HERE, trees["this"][1], [*drawn, "--json", str(report)])
        for regime, summary in json.loads(report.read_text())["regimes"].items():
            stages = ", ".join(f"{stage} {count}" for stage, count in summary["real_stages"].items())
            print(f"this tree, {regime}: {summary['cases']} steps; the release's own code ran: "
                  f"{stages}")


if __name__ == "__main__":
    main()
