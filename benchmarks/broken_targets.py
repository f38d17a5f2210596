"""Wall time to the verdict of broken targets, printed, never asserted: `pcpcheck check` on each
function of tests/broken/targets.py with the default regimes, before (a checkout of the landed
code, --before) and after (this tree), side by side, alternating, one run each.

    git worktree add /tmp/landed <landed commit>
    python benchmarks/broken_targets.py --before /tmp/landed [--timeout 10] [--max-examples 5]

A run still going after --limit seconds is stopped and shown as "> LIMIT s". The bound printed:
2 x --timeout per regime, plus the workers' start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "tests" / "broken" / "targets.py"
CASES = (("every call hangs", "hangs"), ("only P = 8 hangs", "hangs_at_p8"),
         ("every call segfaults", "segfaults"), ("deep recursion", "recurses"),
         ("os._exit(3) in the call", "exits_3"), ("a correct target", "correct"),
         ("slow, crashes on some steps", "slow_and_crashing"),
         ("slow, wrong on some steps", "slow_and_wrong"))
REGIMES = 4  # the default regimes


def run(tree: Path, function: str, args, limit: float) -> str:
    """`pcpcheck check` from `tree`: "S s, exit N, FIRST-ID" (or "> LIMIT s")."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out.json"
        command = [sys.executable, "-m", "pcpcheck", "check", str(TARGETS), "--function", function,
                   "--json", str(out), *args]
        env = {**os.environ, "PYTHONPATH": str(tree), "TMPDIR": scratch}
        started = time.monotonic()
        try:
            done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                                  timeout=limit)
        except subprocess.TimeoutExpired:
            return f"> {limit:.0f} s"
        seconds = time.monotonic() - started
        first = "-"
        if out.exists():
            shown = json.loads(out.read_text())["counterexamples"]
            first = shown[0]["invariant"] if shown else "holds"
        return f"{seconds:6.1f} s, exit {done.returncode}, {first}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the landed code")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--max-examples", type=int, default=5)
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--only", help="comma list of the functions to run")
    options = parser.parse_args()
    args = ["--max-examples", str(options.max_examples), "--timeout", f"{options.timeout:g}"]
    print(f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {REGIMES} regimes; bound "
          f"{REGIMES} x 2 x {options.timeout:g} s = {REGIMES * 2 * options.timeout:.0f} s plus "
          "the workers' start")
    print(f"{'target':<26}{'before (landed)':<34}after")
    for name, function in CASES:
        if options.only and function not in options.only.split(","):
            continue
        before = run(options.before, function, args, options.limit) if options.before else "-"
        after = run(ROOT, function, args, options.limit)
        print(f"{name:<26}{before:<34}{after}", flush=True)


if __name__ == "__main__":
    main()
