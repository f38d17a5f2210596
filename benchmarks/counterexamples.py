"""Time to a counterexample: for every zoo target, seconds to the first violation and to the
shrunk counterexample (search, greedy reductions and the flaky replays included), over several
random seeds; median and max printed, never asserted. Also the size of the shrunk case (P ranks,
W rows per rank, N real tokens), the largest over the seeds: what shrinking reached.

    python benchmarks/counterexamples.py [--seeds 5] [--max-examples 3000]

Each zoo target is checked in the regime where it is wrong (tests/test_zoo.py's table), on the
threads backend, with one backend (one worker process) per target.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pcpcheck_reference as reference
from pcpcheck.backends import make_backend
from pcpcheck.search.engine import search

ZOO = Path(__file__).resolve().parent.parent / "tests" / "zoo"
TARGETS = [  # file, the regime where it is wrong (tests/test_zoo.py's ZOO_CASES)
    ("upstream.py", "draft-mixed"), ("bug01_local_block.py", "replicated"),
    ("bug03_nd_ownership.py", "sharded"), ("bug04_truncated_slots.py", "sharded"),
    ("bug05_rows_padded_after_map.py", "sharded"), ("bug06_partial_expansion.py", "sharded"),
    ("bug07_zero_pad.py", "sharded"), ("bug08_slot_dtype.py", "replicated"),
    ("bug09_zero_rows_reshape.py", "replicated"), ("bug11_unmasked_replicas.py", "replicated"),
    ("bug12_token_major.py", "sharded"), ("bug13_decodes_not_prefix.py", "replicated"),
]


def size(case) -> tuple[int, int, int]:
    """(P, W, N) of a case: ranks, rows per rank, real tokens."""
    batch = case.batch
    return (batch.pcp_size, int(reference.layout(batch).width),
            sum(r.num_tokens for r in batch.requests))


def one_run(backend, target, regime: str, seed: int, max_examples: int):
    """(seconds to the first violating case, seconds to the end of the search, shrunk size)."""
    started = time.perf_counter()
    first = [None]

    def on_case(result) -> None:
        if first[0] is None and sum(result.violated.values()):
            first[0] = time.perf_counter() - started

    result = search(target, regime, backend, max_examples=max_examples, derandomize=False,
                    seed=seed, on_case=on_case)
    done = time.perf_counter() - started
    if not result.counterexamples:
        return float("nan"), done, None
    return first[0], done, max(size(o.prepared.case) for o in result.counterexamples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-examples", type=int, default=3000)
    args = parser.parse_args()
    print(f"seconds over {args.seeds} seeds (threads backend): first violation, shrunk "
          "counterexample (median / max)")
    for name, regime in TARGETS:
        with make_backend("threads") as backend:
            target = backend.load(str(ZOO / name))
            runs = [one_run(backend, target, regime, seed, args.max_examples)
                    for seed in range(args.seeds)]
        firsts, totals = [r[0] for r in runs], [r[1] for r in runs]
        sizes = [r[2] for r in runs if r[2] is not None]
        largest = "P={} W={} N={}".format(*max(sizes)) if sizes else "-"
        missed = sum(f != f for f in firsts)  # nan: no counterexample with this seed
        found = [f for f in firsts if f == f] or [float("nan")]
        print(f"  {name:<32} {regime:<12} first {statistics.median(found):6.3f} / "
              f"{max(found):6.3f}   shrunk {statistics.median(totals):6.2f} / {max(totals):6.2f}"
              f"   to at most {largest}"
              + (f"   ({missed} seed(s) found none)" if missed else ""), flush=True)


if __name__ == "__main__":
    main()
