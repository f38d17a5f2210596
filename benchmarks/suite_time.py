"""The README's test command as a newcomer runs it, timed: a fresh clone of this checkout's HEAD,
a fresh virtual environment, `pip install torch==2.13.0 -e '.[test]'`, then `python -m pytest`,
optionally beside CPU-bound processes. Printed, never asserted.

    python benchmarks/suite_time.py [--beside 2] [--keep]

Prints the commit, the load average before and after, the pytest summary line, the test
command's wall time and the CPU of it and everything it reaped (user + system).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beside", type=int, default=0,
                        help="CPU-bound processes running beside the tests")
    parser.add_argument("--keep", action="store_true", help="keep the clone and its venv")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="pcpcheck-suite-"))
    clone, venv = scratch / "clone", scratch / "venv"
    subprocess.run(["git", "clone", "-q", str(HERE), str(clone)], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "log", "--oneline", "-1"], check=True,
                            capture_output=True, text=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "torch==2.13.0", "-e", ".[test]"],
                   cwd=clone, check=True)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.beside)]
    try:
        before, started = _load(), time.monotonic()
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([python, "-m", "pytest"], cwd=clone, capture_output=True,
                              text=True, env={**os.environ, "VIRTUAL_ENV": str(venv)})
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    print(f"{commit}: `python -m pytest` on a fresh clone and venv, beside {args.beside} "
          f"CPU-bound processes; load average {before} before, {_load()} after")
    print(f"  {lines[-1] if lines else '(no output)'} (exit {done.returncode})")
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            print(f"  {line}")
    print(f"  wall {wall:.1f} s; CPU {after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime:.1f} s")
    if args.keep:
        print(f"  kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
