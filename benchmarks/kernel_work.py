"""The release's slot kernel's work, in one process: launches, programs and CPU of
`_compute_slot_mappings_kernel` (and the layout work around it) on steps as the strategy draws
them, printed, never asserted.

    python benchmarks/kernel_work.py [--release 0.34.0] [--steps 300] [--seed 45] [--builder]

Per regime (sharded and replicated one after the other, as `pcpcheck vllm` runs them, so the
second reuses the first's kernel results; dcp), every rank's manager view of `--steps` drawn
steps (pcpcheck.worker.release_code.manager_view, what a worker runs per rank), three ways:
  bounded, own:  only the steps the landed bound let through the kernel (at most 3 requests and
                 12 kernel programs; the others take the reference formula), triton's own builtins
  every, own:    every step through the kernel, triton's own builtins
  every, plans:  every step through the kernel, each builtin planned (release_interpreter.Plans)
Printed per way: steps through the kernel, launches run (not served from the result cache),
programs in them, kernel CPU, ms per program, and the layout work's CPU in all.

With --builder, instead, the floor of a program: `every, plans` alone, each of the
interpreter's builder methods (InterpreterBuilder: the only code that touches a program's data,
its loads, stores and numpy ops) timed where a slot-kernel program calls it, from before the
first plan is made (a plan holds the methods it calls): builder calls per program and their
share of the kernel's time (wall clock: one thread, a quiet machine), the part that no reuse
of triton's type-level work (plans, or a whole program's builder calls replayed) can remove.
What the timers add (measured on a method doing nothing) is taken off both.
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
from pcpcheck.worker.release_kernels import import_triton
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
        wall = time.perf_counter()
        slot_kernel = getattr(self.fn, "__name__", "") == KERNEL
        tally["in_kernel"] = slot_kernel
        try:
            return call(self, *args, **kwargs)
        finally:
            tally["in_kernel"] = False
            if slot_kernel:
                tally["cpu"] += time.process_time() - started
                tally["wall"] += time.perf_counter() - wall
                tally["launches"] += 1
                tally["programs"] += grid[0] * grid[1] * grid[2]
    return counting


def timer_cost(timed_maker, tally: dict, calls: int = 200_000) -> tuple[float, float]:
    """Seconds a timed call adds, in all and within its own timed interval: `timed_maker`'s
    wrapper around a method that does nothing, against the method alone."""
    def nothing(*args):
        return None

    wrapped = timed_maker(nothing)
    tally.update(in_kernel=True, builder=0.0)
    started = time.perf_counter()
    for _ in range(calls):
        wrapped(None)
    total = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(calls):
        nothing(None)
    bare = time.perf_counter() - started
    inside = tally["builder"] - bare
    tally.update(in_kernel=False, builder=0.0, calls=0)
    return (total - bare) / calls, max(inside, 0.0) / calls


def builder_timed(interpreter, tally: dict) -> tuple[float, float]:
    """Every public InterpreterBuilder method timed where a slot-kernel launch calls it (the
    outermost call only: a method calling another counts once), into tally["builder"] and
    tally["calls"]; on while tally["in_kernel"]. Before any plan is made: a plan calls the
    methods it recorded. Returns timer_cost's two figures for these wrappers."""
    kind = interpreter.InterpreterBuilder
    depth = [0]

    def timed(method):
        def call(*args, **kwargs):
            if depth[0] or not tally["in_kernel"]:
                return method(*args, **kwargs)
            depth[0] += 1
            started = time.perf_counter()  # a tenth of process_time's cost: less distortion
            try:
                return method(*args, **kwargs)
            finally:
                tally["builder"] += time.perf_counter() - started
                tally["calls"] += 1
                depth[0] -= 1
        return call

    cost = timer_cost(timed, tally)
    for name in dir(kind):
        method = getattr(kind, name)
        if not name.startswith("_") and callable(method) and name != "set_grid_idx":
            setattr(kind, name, timed(method))
    return cost


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
    parser.add_argument("--builder", action="store_true",
                        help="the builder's share of the kernel's time, `every, plans` alone")
    args = parser.parse_args()
    tally = {"cpu": 0.0, "wall": 0.0, "launches": 0, "programs": 0, "builder": 0.0, "calls": 0,
             "in_kernel": False}
    if import_triton() is None:  # what load_release does first, here before any timer
        raise SystemExit("triton is not installed: pip install 'pcpcheck[kernels]'")
    from triton.runtime import interpreter

    added = inside = 0.0  # seconds a builder timer adds to a call, and within its interval
    if args.builder:
        added, inside = builder_timed(interpreter, tally)
    release = release_code.load_release(str(fetch_release(args.release)))
    interpreter.GridExecutor.__call__ = counted(interpreter, tally)
    plans = interpreter._pcpcheck_plans
    every = release_code.kernel_step
    # sharded and replicated on the same requests (D = 1 in both: the second reuses results)
    groups = {"sharded, then replicated": [steps_of(release, regime, args.steps, f"{args.seed}")
                                           for regime in (SHARDED, REPLICATED)],
              "dcp": [steps_of(release, DCP, args.steps, f"{args.seed}-dcp")]}
    ways = (("bounded, own", landed_bound, plans.off), ("every, own", every, plans.off),
            ("every, plans", every, contextlib.nullcontext))
    if args.builder:
        ways = ways[2:]
    print(f"vLLM {args.release}, {args.steps} drawn steps per regime (seed {args.seed})")
    for name, runs in groups.items():
        for way, gate, mode in ways:
            release_code.kernel_step = gate
            release.kernels._filled.clear()  # no filled tables nor kernel results kept
            tally.update(cpu=0.0, wall=0.0, launches=0, programs=0, builder=0.0, calls=0)
            through = sum(gate(release, batch) for steps in runs for batch in steps)
            started = time.process_time()
            with mode():
                for steps in runs:
                    for batch in steps:
                        for rank in range(batch.pcp_size):
                            release_code.manager_view(release, batch, rank)
            layout = time.process_time() - started
            programs = max(tally["programs"], 1)
            print(f"{name}: {way}: {through} of {sum(map(len, runs))} steps through the kernel, "
                  f"{tally['launches']} launches, {tally['programs']} programs, kernel "
                  f"{tally['cpu']:.2f} s CPU ({tally['cpu'] / programs * 1000:.3f} ms a "
                  f"program), layout work in all {layout:.2f} s")
            if args.builder:  # less what the timers themselves added (timer_cost)
                builder = tally["builder"] - tally["calls"] * inside
                kernel = tally["wall"] - tally["calls"] * added
                print(f"{name}: {way}: {tally['calls'] / programs:.0f} builder calls a program, "
                      f"{builder:.2f} of the kernel's {kernel:.2f} s in them "
                      f"({100 * builder / max(kernel, 1e-9):.0f}%, wall clock in one thread, "
                      f"less the timers' {added * 1e6:.2f} us a call; "
                      f"{builder / programs * 1000:.3f} ms a program)")
    release_code.kernel_step = every


if __name__ == "__main__":
    main()
