"""The deployment model's cost per step (pcpcheck/worker/deployment.py: the platform, the device
mapping's function mode, torch.cuda's stream model bound to every rank's call): a checkout of the
landed code (--before) beside this tree, the commands alternating, printed, never asserted.

    python benchmarks/deployment_cost.py --before /tmp/landed [--rounds 3]

Each command runs in a fresh process tree; its CPU is what the command and every process under
it used (getrusage of the reaped children), divided by the cases (steps) it judged. Each tree's
packages are imported from the tree itself (benchmarks/cpu_per_case.py import_path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark folder is no package
from cpu_per_case import HERE, import_path, measure

COMMANDS = {
    "check impl (4 regimes x 3,000 cases, P <= 4)": ["check", "impl", "--max-ranks", "4"],
    "vllm 0.34.0 (sharded, dcp; 300 steps each)": ["vllm", "0.34.0", "--regime", "sharded",
                                                   "--regime", "dcp", "--max-examples", "300"],
}


def run(tree: Path, path: str, argv: list[str]) -> float:
    """ms CPU per case of one run of `pcpcheck ARGV` from `tree`."""
    cpu, _wall, cases = measure(tree, path, argv)
    return 1000 * cpu / cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the landed code")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"landed": (args.before, import_path(args.before.resolve(), Path(scratch) / "a")),
                 "this": (HERE, import_path(HERE, Path(scratch) / "b"))}
        for label, argv in COMMANDS.items():
            per_case: dict[str, list[float]] = {name: [] for name in trees}
            for _ in range(args.rounds):
                for name, (tree, path) in trees.items():
                    per_case[name].append(run(tree, path, argv))
            medians = {name: statistics.median(values) for name, values in per_case.items()}
            print(f"{label}: ms CPU per case, " + "; ".join(
                f"{name} {', '.join(f'{v:.2f}' for v in values)} (median {medians[name]:.2f})"
                for name, values in per_case.items())
                + f"; this / landed {medians['this'] / medians['landed']:.2f}")


if __name__ == "__main__":
    main()
