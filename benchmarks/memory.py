"""Peak memory of `pcpcheck check` as the number of cases grows: printed, never asserted.

Runs `pcpcheck check impl` with each --max-examples given and samples, every 50 ms, the peak
resident set (VmHWM) of every process of the run: the driver(s), their fork servers and the
workers hosting the ranks (told apart by the names pcpcheck gives them, /proc/PID/comm). Prints
per run the largest peak of each role, the sum of all peaks (an upper bound: a server and its
workers share most pages), and the sum of each process's largest sampled proportional set size
(PSS: a shared page counts once, split among its sharers).

    python benchmarks/memory.py --cases 3000,30000 [--jobs N] [--regime sharded ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(child) for child in handle.read().split()]
        except OSError:
            pass
    return found


def _tree(pid: int) -> list[int]:
    pids, index = [pid], 0
    while index < len(pids):
        pids += _children(pids[index])
        index += 1
    return pids


ROLES = {"pcpcheck-worker": "worker", "pcpcheck-server": "server"}


def _peak_kib(pid: int) -> tuple[str, int, int] | None:
    """(role, peak RSS, PSS now) in KiB."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            pss = next(int(line.split()[1]) for line in handle if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return None
    return (ROLES.get(fields["Name"].strip(), "driver"), int(fields.get("VmHWM", "0 kB").split()[0]),
            pss)


def measure(cases: int, jobs: int, regimes: list[str]) -> dict:
    command = [sys.executable, "-m", "pcpcheck", "check", "impl", "--max-examples", str(cases)]
    command += ([f"--jobs={jobs}"] if jobs else []) + [f"--regime={r}" for r in regimes]
    started = time.monotonic()
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks: dict[int, tuple[str, int, int]] = {}
    while run.poll() is None:
        for pid in _tree(run.pid):
            seen = _peak_kib(pid)
            if seen is not None:  # a first sample may predate the name: a named role sticks
                before = peaks.get(pid, seen)
                role = seen[0] if seen[0] != "driver" else before[0]
                peaks[pid] = (role, max(seen[1], before[1]), max(seen[2], before[2]))
        time.sleep(0.05)
    if run.returncode != 0:
        raise SystemExit(f"pcpcheck exited {run.returncode}: {run.stderr.read().decode()[-500:]}")
    by_role = {role: max((kib for r, kib, _ in peaks.values() if r == role), default=0)
               for role in ("driver", "server", "worker")}
    return {"seconds": time.monotonic() - started, "processes": len(peaks),
            "total_mib": sum(kib for _, kib, _ in peaks.values()) / 1024,
            "pss_mib": sum(pss for _, _, pss in peaks.values()) / 1024,
            **{f"{role}_mib": kib / 1024 for role, kib in by_role.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="3000,30000", help="comma list of --max-examples")
    parser.add_argument("--jobs", type=int, default=None, help="default: pcpcheck's")
    parser.add_argument("--regime", action="append", default=None)
    args = parser.parse_args()
    regimes = args.regime or []
    print(f"pcpcheck check impl {f'--jobs={args.jobs} ' if args.jobs else ''}"
          f"{' '.join('--regime=' + r for r in regimes) or '(default regimes)'}; peak RSS (VmHWM) "
          "per process, MiB")
    for cases in map(int, args.cases.split(",")):
        figures = measure(cases, args.jobs, regimes)
        print(f"  {cases:>6} cases/regime: largest driver {figures['driver_mib']:6.1f}, fork server "
              f"{figures['server_mib']:6.1f}, largest worker {figures['worker_mib']:6.1f}, sum over "
              f"{figures['processes']} processes {figures['total_mib']:6.1f}, PSS "
              f"{figures['pss_mib']:6.1f}; {figures['seconds']:.1f} s")


if __name__ == "__main__":
    main()
