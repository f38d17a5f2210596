"""The release's slot kernel's work, in one process: launches, programs and CPU of
`_compute_slot_mappings_kernel` (and the layout work around it) on steps as the strategy draws
them, printed, never asserted.

    python benchmarks/kernel_work.py [--release 0.34.0] [--steps 300] [--seed 45]

Per regime (sharded and replicated one after the other, as `pcpcheck vllm` runs them, so the
second reuses the first's kernel results; dcp), every rank's manager view of `--steps` drawn
steps (pcpcheck.worker.release_code.manager_view, what a worker runs per rank), three ways:
  bounded, own:  only the steps the landed bound let through the kernel (at most 3 requests and
                 12 kernel programs; the others take the reference formula), triton's own builtins
  every, own:    every step through the kernel, triton's own builtins
  every, plans:  every step through the kernel, each builtin planned (release_interpreter.Plans)
Printed per way: steps through the kernel, launches run (not served from the result cache),
programs in them, kernel CPU, ms per program, and the layout work's CPU in all.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time

import pcpcheck_reference as reference
from pcpcheck.search.draw import draw_case
from pcpcheck.search.release_search import era_case
from pcpcheck.shared.source import fetch_release
from pcpcheck.worker import release_code
from pcpcheck.worker.release_step import in_release_order
from pcpcheck_spec.names import DCP, REPLICATED, SHARDED

KERNEL = "_compute_slot_mappings_kernel"
LANDED_REQUESTS, LANDED_PROGRAMS = 3, 12  # the bound before issue 45


def landed_bound(release, batch) -> bool:
    """Whether the landed code's bound let this step through the kernel."""
    dummies = 1 if release.step_dummies(batch) else 0
    requests = len(batch.requests)
    return (release.kernels.real and requests <= LANDED_REQUESTS
            and reference.dcp_size(batch) * (requests + dummies + 1) <= LANDED_PROGRAMS)


def counted(interpreter, tally: dict):
    """GridExecutor.__call__ counting the slot kernel's launches, programs and CPU."""
    call = interpreter.GridExecutor.__call__

    def counting(self, *args, **kwargs):
        started, grid = time.process_time(), tuple(self.grid) + (1, 1)
        try:
            return call(self, *args, **kwargs)
        finally:
            if getattr(self.fn, "__name__", "") == KERNEL:
                tally["cpu"] += time.process_time() - started
                tally["launches"] += 1
                tally["programs"] += grid[0] * grid[1] * grid[2]
    return counting


def steps_of(release, regime: str, count: int, seed: str) -> list:
    """`count` steps of `regime` as drawn from `seed` (the same seed: the same requests)."""
    rng, steps = random.Random(seed), []
    while len(steps) < count:
        case = era_case(draw_case(rng, regimes=(regime,))[0], release.caps)
        if case is not None:
            steps.append(in_release_order(case, release)[0].batch)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="0.34.0")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=45)
    args = parser.parse_args()
    release = release_code.load_release(str(fetch_release(args.release)))
    from triton.runtime import interpreter

    tally = {"cpu": 0.0, "launches": 0, "programs": 0}
    interpreter.GridExecutor.__call__ = counted(interpreter, tally)
    plans = interpreter._pcpcheck_plans
    every = release_code.kernel_step
    # sharded and replicated on the same requests (D = 1 in both: the second reuses results)
    groups = {"sharded, then replicated": [steps_of(release, regime, args.steps, f"{args.seed}")
                                           for regime in (SHARDED, REPLICATED)],
              "dcp": [steps_of(release, DCP, args.steps, f"{args.seed}-dcp")]}
    ways = (("bounded, own", landed_bound, plans.off), ("every, own", every, plans.off),
            ("every, plans", every, contextlib.nullcontext))
    print(f"vLLM {args.release}, {args.steps} drawn steps per regime (seed {args.seed})")
    for name, runs in groups.items():
        for way, gate, mode in ways:
            release_code.kernel_step = gate
            release.kernels._filled.clear()  # no filled tables nor kernel results kept
            tally.update(cpu=0.0, launches=0, programs=0)
            through = sum(gate(release, batch) for steps in runs for batch in steps)
            started = time.process_time()
            with mode():
                for steps in runs:
                    for batch in steps:
                        for rank in range(batch.pcp_size):
                            release_code.manager_view(release, batch, rank)
            layout = time.process_time() - started
            per = tally["cpu"] / tally["programs"] * 1000 if tally["programs"] else 0.0
            print(f"{name}: {way}: {through} of {sum(map(len, runs))} steps through the kernel, "
                  f"{tally['launches']} launches, {tally['programs']} programs, kernel "
                  f"{tally['cpu']:.2f} s CPU ({per:.3f} ms a program), layout work in all "
                  f"{layout:.2f} s")
    release_code.kernel_step = every


if __name__ == "__main__":
    main()
