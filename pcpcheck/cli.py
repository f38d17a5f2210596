"""pcpcheck's command line.

    pcpcheck                          check the bundled implementation in every regime
    pcpcheck check TARGET [options]   check a pcp.py file, a module:function, or `impl`
    pcpcheck diff OLD NEW [options]   run two versions on the same cases, report where they differ
    pcpcheck vllm SOURCE [options]    check a vLLM release's own PCP path (manager, gather, wrappers)

Exit codes: 0 every invariant holds (diff: no difference), 1 a violation (diff: a difference),
2 a usage or load error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pcpcheck import report
from pcpcheck.cases import Case
from pcpcheck.engine import CheckerError, RegimeResult, search
from pcpcheck.loader import LoadError, load_target
from pcpcheck.procs import DeviceThreadRunner, ProcessRunner, WorkerError
from pcpcheck.runner import ThreadRunner
from pcpcheck.vllm.release import InterfaceDrift
from pcpcheck.vllm.source import SourceError
from spec.names import REGIMES, SHARDED

EXIT_HOLDS, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2
DEFAULT_MAX_EXAMPLES = 3000
NO_SHARD_FLAG = ("the gather has no shard_decode_requests parameter: decodes are never sharded "
                 "in its era (vLLM before 0.32)")


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
    parser.add_argument("--regime", action="append", choices=REGIMES, metavar="REGIME",
                        help=f"regime to check, repeatable (default: all of {', '.join(REGIMES)})")
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
    _add_vllm(commands)
    return parser


DEFAULT_VLLM_EXAMPLES = 1000


def _add_vllm(commands) -> None:
    vllm = commands.add_parser("vllm", help="check a vLLM release's own PCP path on all ranks")
    vllm.add_argument("source", help="a release (0.33.0, vllm==0.33.0), a wheel, a checkout, "
                                     "or installed")
    vllm.add_argument("--regime", action="append", choices=REGIMES, metavar="REGIME",
                      help="regime to check, repeatable (default: all but draft-mixed, a "
                           "hazard regime)")
    vllm.add_argument("--max-examples", type=_positive_int, default=DEFAULT_VLLM_EXAMPLES,
                      help="steps drawn per regime (default %(default)s)")
    vllm.add_argument("--max-ranks", type=int, default=8,
                      help="largest PCP size P drawn, 2..8 (default %(default)s)")
    vllm.add_argument("--seed", type=int, help="random seed (default: derandomized, repeatable)")
    vllm.add_argument("--timeout", type=float, default=10.0,
                      help="seconds a rank may take for one step before it counts as hung")
    vllm.add_argument("--empty-steps", action="store_true",
                      help="also draw steps with no scheduled token (a hazard: the model "
                           "runner never runs them)")
    vllm.add_argument("--json", metavar="FILE", help="write the verdict as JSON")
    vllm.add_argument("--replay", metavar="CASE_JSON", help="judge this one step")


def parse(argv: list[str]) -> argparse.Namespace:
    if not argv or argv[0] not in ("check", "diff", "vllm", "-h", "--help"):
        argv = ["check", *argv]
    args = _parser().parse_args(argv)
    if not 2 <= args.max_ranks <= 8:
        raise UsageError(f"--max-ranks must be between 2 and 8, got {args.max_ranks}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    args.regimes = tuple(dict.fromkeys(args.regime)) if args.regime else REGIMES
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
    if backend == "threads":
        if getattr(args, "device", "cpu") != "cpu":
            try:
                return DeviceThreadRunner(timeout=args.timeout, device=args.device)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        return ThreadRunner(timeout=args.timeout)
    runner = ProcessRunner(backend, timeout=args.timeout)
    if not args.replay:
        try:
            runner.start(args.world_sizes)
        except BaseException:
            runner.close()
            raise
    return runner


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
        if args.command == "diff":
            from pcpcheck.diff import run_diff
            return run_diff(args)
        if args.command == "vllm":
            return run_vllm(args)
        return run_check(args)
    except UsageError as exc:
        print(f"pcpcheck: usage error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LoadError as exc:
        print(f"pcpcheck: cannot load target: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (SourceError, InterfaceDrift) as exc:  # pcpcheck vllm: one line naming the problem
        print(f"pcpcheck: {type(exc).__name__}: {exc}", file=sys.stderr)
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
    """Check a target; `runner` given (torchrun's rank 0) is used as is, else `make_runner`."""
    target = load_target(args.target, args.function)
    if runner is not None:
        return _check(args, target, runner)
    runner = make_runner(args)
    try:
        return _check(args, target, runner)
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
        if regime == SHARDED and not target.accepts_shard:  # its era has no decode sharding
            result = RegimeResult(regime, not_applicable=NO_SHARD_FLAG)
            print(f"  {regime:<12} not applicable: {NO_SHARD_FLAG}", flush=True)
            results.append(result)
            continue
        result = search(target, regime, runner, max_examples=args.max_examples,
                        max_ranks=args.max_ranks, derandomize=args.seed is None, seed=args.seed,
                        pcp_sizes=getattr(args, "world_sizes", None))
        results.append(result)
        print(f"  {regime:<12} {report.rates(result)}  "
              f"{'VIOLATED' if result.counterexamples else 'holds'}", flush=True)
    print()
    print("\n".join(report.verdict_table(results)))
    counterexamples = [(r.regime, o) for r in results for o in r.counterexamples]
    for index, (regime, observation) in enumerate(counterexamples, 1):
        print(f"\nCounterexample {index}: "
              + report.counterexample(observation, regime, target.source, args.function))
    written = _write_repros(args, target, counterexamples) if counterexamples else []
    print(f"\nall regimes: {report.rates(*results)}: "
          + (f"{len(counterexamples)} violation(s)" if counterexamples else "every invariant holds"))
    if args.json:
        _write_json(args.json, target, results, counterexamples, args.function, written)
    return EXIT_VIOLATION if counterexamples else EXIT_HOLDS


def run_vllm(args) -> int:
    """`pcpcheck vllm SOURCE`: the release's manager, gather and wrappers on every rank."""
    from pcpcheck.vllm import verdict
    release = verdict.load_release(args.source)
    print("\n".join(verdict.header(release)), flush=True)
    runner = ThreadRunner(timeout=args.timeout)
    if args.replay:
        try:
            observation = verdict.replay(release, runner, args.replay)
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--replay is not a case printed by pcpcheck: {exc}") from None
        if not observation.violations:
            print(f"  replayed step holds: {', '.join(observation.checked)}")
            return EXIT_HOLDS
        regime = observation.prepared.case.batch.regime
        print(verdict.counterexample(release, regime, observation))
        return EXIT_VIOLATION
    outcome = verdict.check_release(
        release, runner, regimes=tuple(dict.fromkeys(args.regime or verdict.DEFAULT_REGIMES)),
        max_examples=args.max_examples, max_ranks=args.max_ranks, seed=args.seed,
        empty_steps=args.empty_steps, progress=lambda r: print(verdict.regime_line(r), flush=True))
    for index, (regime, observation) in enumerate(outcome.counterexamples, 1):
        print(f"\nCounterexample {index}: " + verdict.counterexample(release, regime, observation))
    print(f"\n{release.name}: " + ", ".join(f"{k} {v.split(':')[0]}" for k, v in outcome.verdicts().items())
          + f"; {len(outcome.counterexamples)} violation(s) in {outcome.seconds:.1f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(verdict.to_json(outcome), handle, indent=2)
    return EXIT_VIOLATION if outcome.counterexamples else EXIT_HOLDS


def _replay(args, target, runner) -> int:
    try:
        case = Case.from_json(args.replay)
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--replay is not a case printed by pcpcheck: {exc}") from None
    observation = runner.observe_case(case, target)
    if not observation.violations:
        print(f"  replayed case holds: every invariant of {', '.join(observation.checked)}")
        return EXIT_HOLDS
    print(report.counterexample(observation, case.batch.regime, target.source, args.function))
    return EXIT_VIOLATION


def _write_repros(args, target, counterexamples) -> list[str]:
    if not getattr(args, "repro_dir", None):
        return []
    from pcpcheck.repro import write_reproducer
    return [write_reproducer(args.repro_dir, target, regime, observation, args.function)
            for regime, observation in counterexamples]


def _write_json(path, target, results, counterexamples, function, repros) -> None:
    document = {
        "target": target.source,
        "verdict": "violated" if counterexamples else "holds",
        "regimes": {
            r.regime: {
                "not_applicable": r.not_applicable or None,
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
            "case": json.loads(o.prepared.case.to_json()),
            "replay": report.replay_command(target.source, o, function),
            "report": report.counterexample(o, regime, target.source, function),
        } for regime, o in counterexamples],
        "reproducers": repros,
    }
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2)


if __name__ == "__main__":
    raise SystemExit(main())
