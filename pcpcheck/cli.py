"""pcpcheck's command line.

    pcpcheck                          check the bundled implementation in every regime
    pcpcheck check TARGET [options]   check a pcp.py file, a module:function, or `impl`
    pcpcheck diff OLD NEW [options]   run two versions on the same cases, report where they differ

Exit codes: 0 every invariant holds (diff: no difference), 1 a violation (diff: a difference),
2 a usage or load error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

from pcpcheck import report
from pcpcheck.cases import Case
from pcpcheck.check import run_case
from pcpcheck.engine import CheckerError, RegimeResult, search
from pcpcheck.backends import make_backend
from pcpcheck.backends.base import WorkerError
from pcpcheck.loader import LoadError
from spec.names import DEFAULT_REGIMES, HAZARD_REGIMES, REGIMES

EXIT_HOLDS, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2
DEFAULT_MAX_EXAMPLES = 3000


class UsageError(Exception):
    """Bad arguments: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit itself; we want one line and exit 2
        raise UsageError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--function", help="name of the gather function in the target file")
    parser.add_argument("--regime", action="append", choices=(*REGIMES, "all"), metavar="REGIME",
                        help=f"regime to check, repeatable: {', '.join(REGIMES)}, or all "
                             f"(default: {', '.join(DEFAULT_REGIMES)}; {', '.join(HAZARD_REGIMES)} "
                             "is a hazard regime, checked only when named or with all)")
    parser.add_argument("--max-examples", type=_positive_int, default=DEFAULT_MAX_EXAMPLES,
                        help="cases drawn per regime (default %(default)s)")
    parser.add_argument("--max-ranks", type=int, default=8,
                        help="largest PCP size P drawn, 2..8 (default %(default)s)")
    parser.add_argument("--seed", type=int, help="random seed (default: derandomized, repeatable)")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds a rank may take for one case before it counts as hung")
    parser.add_argument("--json", metavar="FILE", help="write the verdict as JSON for CI")


def _world_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(dict.fromkeys(int(part) for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of whole numbers: {text!r}") from None
    if not sizes or not all(2 <= size <= 8 for size in sizes):
        raise argparse.ArgumentTypeError(f"every world size must be between 2 and 8: {text!r}")
    return sizes


def _add_backend(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("threads", "gloo", "nccl"), default="threads",
                        help="ranks as in-process threads (default), or torch.distributed "
                             "processes over gloo (CPU) or NCCL (one GPU per rank)")
    parser.add_argument("--world-sizes", type=_world_sizes, metavar="P,P,...",
                        help="world sizes P to draw, each 2..8 (default: 2..--max-ranks for "
                             "threads, 2,4 for gloo, 2 and the GPU count for nccl)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="threads backend: put every tensor and the cache write on this device")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pcpcheck", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)
    check = commands.add_parser("check", help="check a gather implementation against the spec")
    check.add_argument("target", nargs="?", default="impl",
                       help="a .py file, module:function, or impl (the bundled one, default)")
    _add_common(check)
    _add_backend(check)
    check.add_argument("--repro-dir", metavar="DIR",
                       help="write a standalone pytest reproducer per violation into DIR")
    check.add_argument("--replay", metavar="CASE_JSON",
                       help="judge this one case (as printed in a counterexample's replay line)")
    diff = commands.add_parser("diff", help="compare two versions of the gather on the same cases")
    diff.add_argument("old")
    diff.add_argument("new")
    _add_common(diff)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    if not argv or argv[0] not in ("check", "diff", "-h", "--help"):
        argv = ["check", *argv]
    args = _parser().parse_args(argv)
    if not 2 <= args.max_ranks <= 8:
        raise UsageError(f"--max-ranks must be between 2 and 8, got {args.max_ranks}")
    if not 0 < args.timeout < float("inf"):  # nan fails both comparisons
        raise UsageError(f"--timeout must be positive and finite (seconds), got {args.timeout}")
    if not args.regime:
        args.regimes = DEFAULT_REGIMES
    elif "all" in args.regime:
        args.regimes = REGIMES
    else:
        args.regimes = tuple(dict.fromkeys(args.regime))
    if getattr(args, "replay", None):  # a malformed case is a usage error before anything starts
        args.replay = replay_case(args.replay)
    if getattr(args, "backend", "threads") != "threads":
        _check_process_backend(args)
    return args


def _check_process_backend(args) -> None:
    import torch
    if args.device != "cpu":
        raise UsageError(f"--device {args.device} is for --backend threads ({args.backend} "
                         "ranks use " + ("cuda:rank" if args.backend == "nccl" else "the CPU") + ")")
    gpus = torch.cuda.device_count() if args.backend == "nccl" else 0
    if args.backend == "nccl":
        if gpus < 2:
            raise UsageError(f"--backend nccl needs at least 2 GPUs, found {gpus}")
        if args.world_sizes and max(args.world_sizes) > gpus:
            raise UsageError(f"--backend nccl: world size {max(args.world_sizes)} needs "
                             f"{max(args.world_sizes)} GPUs, found {gpus}")
    if not args.world_sizes:
        args.world_sizes = (2, 4) if args.backend == "gloo" else tuple(sorted({2, min(gpus, 8)}))


def make_runner(args):
    """The backend of `--backend` (and `--device`), started before the search."""
    backend = getattr(args, "backend", "threads")
    if backend == "threads" and getattr(args, "device", "cpu") == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available")
    return make_backend(backend, timeout=args.timeout, device=getattr(args, "device", "cpu"),
                        world_sizes=None if args.replay else getattr(args, "world_sizes", None))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
        if args.command == "diff":
            from pcpcheck.diff import run_diff
            return run_diff(args)
        return run_check(args)
    except UsageError as exc:
        print(f"pcpcheck: usage error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LoadError as exc:
        print(f"pcpcheck: cannot load target: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WorkerError as exc:  # the rank processes could not start, or pcpcheck failed in one
        print(f"pcpcheck: rank processes failed: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE
    except CheckerError as exc:
        print(f"pcpcheck: internal error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`pcpcheck | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
        return EXIT_USAGE
    except OSError as exc:  # --json or --repro-dir not writable
        print(f"pcpcheck: cannot write {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("pcpcheck: interrupted", file=sys.stderr)
        return 130


def run_check(args, runner=None) -> int:
    """Check a target; `runner` given (torchrun's rank 0) is used as is, else `make_runner`.
    The target is loaded by the backend's workers, never here."""
    if runner is not None:
        return _check(args, runner.load(args.target or "impl", args.function), runner)
    runner = make_runner(args)
    try:
        return _check(args, runner.load(args.target or "impl", args.function), runner)
    finally:
        runner.close()


def _check(args, target, runner) -> int:
    print(f"pcpcheck: checking {target.name}"
          + (f" ({args.backend}, world sizes {','.join(map(str, args.world_sizes))})"
             if getattr(args, "backend", "threads") != "threads" else ""))
    if target.stand_ins:
        print(f"  stood in for: {', '.join(target.stand_ins)}")
    if args.replay:
        return _replay(args, target, runner)
    results = []
    for regime in args.regimes:
        result = search(target, regime, runner, max_examples=args.max_examples,
                        max_ranks=args.max_ranks, derandomize=args.seed is None, seed=args.seed,
                        pcp_sizes=getattr(args, "world_sizes", None))
        results.append(result)
        print(f"  {regime:<12} {report.rates(result)}  "
              f"{'VIOLATED' if result.counterexamples else 'holds'}", flush=True)
    print()
    print("\n".join(report.verdict_table(results)))
    counterexamples = [(r.regime, o, p) for r in results for o, p in zip(r.counterexamples, r.replays)]
    into = report.fold([(regime, o) for regime, o, _ in counterexamples])
    if counterexamples:
        print("\n" + report.LEGEND)
    for number, index in enumerate((k for k, host in enumerate(into) if host is None), 1):
        regime, observation, replays = counterexamples[index]
        print(f"\nCounterexample {number}: "
              + report.counterexample(observation, regime, target.source, args.function,
                                      target, replays))
        folded = report.folded_line([(regime, o) for regime, o, _ in counterexamples], into, index)
        if folded:
            print(folded)
    written = _write_repros(args, target, counterexamples) if counterexamples else []
    hazards = sum(regime in HAZARD_REGIMES for regime, _, _ in counterexamples)
    print(f"\nall regimes: {report.rates(*results)}: "
          + (f"{len(counterexamples)} violation(s), {into.count(None)} shown"
             + (f", {hazards} in hazard regimes" if hazards else "")
             if counterexamples else "every invariant holds"))
    if args.json:
        _write_json(args.json, target, results, counterexamples, args.function, written, into)
    return EXIT_VIOLATION if counterexamples else EXIT_HOLDS


def _replay(args, target, runner) -> int:
    case = args.replay  # parsed and validated by `parse`
    observation = run_case(case, target, runner)
    regime = case.batch.regime
    if args.json:
        result = RegimeResult(regime, cases=1, checked=Counter(observation.checked),
                              violated=Counter(v.invariant for v in observation.violations))
        result.counterexamples = [observation] if observation.violations else []
        _write_json(args.json, target, [result], [(regime, o, None) for o in result.counterexamples],
                    args.function, [], [None] * len(result.counterexamples))
    if not observation.violations:
        print(f"  replayed case holds: every invariant of {', '.join(observation.checked)}")
        return EXIT_HOLDS
    print(report.counterexample(observation, regime, target.source, args.function, target))
    print("\n" + report.LEGEND)
    return EXIT_VIOLATION


def replay_case(text: str) -> Case:
    """The case of `--replay`: a usage error (one line) unless it is well formed."""
    try:
        return Case.from_json(text)
    except ValueError as exc:
        raise UsageError(f"--replay is not a well-formed case: {exc}") from None


def _write_repros(args, target, counterexamples) -> list[str]:
    if not getattr(args, "repro_dir", None):
        return []
    from pcpcheck.repro import write_reproducer
    return [write_reproducer(args.repro_dir, target, regime, observation, args.function)
            for regime, observation, _ in counterexamples]


def _write_json(path, target, results, counterexamples, function, repros, into) -> None:
    document = {
        "target": target.source,
        "verdict": "violated" if counterexamples else "holds",
        "regimes": {
            r.regime: {
                "hazard": r.regime in HAZARD_REGIMES,
                "cases": r.cases,
                "seconds": round(r.seconds, 3),
                "invariants": {i: {"checked": r.checked[i], "violated": r.violated[i]}
                               for i in r.checked},
            } for r in results},
        "counterexamples": [{
            "invariant": o.violations[0].invariant,
            "ranks": o.violations[0].ranks,
            "also_violated": [v.invariant for v in o.violations[1:]],
            "regime": regime,
            "hazard": regime in HAZARD_REGIMES,
            "folded_into": host,  # index of the shown counterexample it folds into, or null
            "case": json.loads(o.prepared.case.to_json()),
            "replay": report.replay_command(target.source, o, function),
            "flaky": ({"replays": p.runs, "reproduced": p.reproduced}
                      if p is not None and p.flaky else None),
            "report": report.counterexample(o, regime, target.source, function, target, p),
        } for (regime, o, p), host in zip(counterexamples, into)],
        "reproducers": repros,
    }
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2)


if __name__ == "__main__":
    raise SystemExit(main())
