"""pcpcheck's command line.

    pcpcheck                          check the bundled implementation in every regime
    pcpcheck check TARGET [options]   check a pcp.py file, a module:function, or `impl`
    pcpcheck diff OLD NEW [options]   run two versions on the same cases, report where they differ

Exit codes: 0 every invariant holds (diff: no difference), 1 a violation (diff: a difference),
2 a usage or load error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from pcpcheck import report
from pcpcheck.api import (DEFAULT_MAX_EXAMPLES, DEFAULT_RELEASE_EXAMPLES, EXIT_HOLDS, EXIT_USAGE,
                          EXIT_VIOLATION, UsageError, check, check_release, default_world_sizes,
                          make_runner, version)
from pcpcheck.backends.base import WorkerError
from pcpcheck.cases import Case
from pcpcheck.check import run_case
from pcpcheck.engine import CheckerError
from pcpcheck.loader import LoadError
from pcpcheck.vllm.release import InterfaceDrift
from pcpcheck.vllm.source import SourceError
from pcpcheck_spec.names import DEFAULT_REGIMES, HAZARD_REGIMES, REGIMES
from pcpcheck_spec.registry import GATHER_IDS, RELEASE_IDS

__all__ = ["main", "parse", "run_check", "UsageError", "LoadError", "CheckerError",
           "EXIT_HOLDS", "EXIT_VIOLATION", "EXIT_USAGE"]


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
    _add_search(parser, DEFAULT_MAX_EXAMPLES, "cases")


def _add_search(parser: argparse.ArgumentParser, max_examples: int, unit: str) -> None:
    """What every searching command takes: regimes, how many `unit` per regime, ranks, seed,
    the per-rank timeout and the JSON output."""
    parser.add_argument("--regime", action="append", choices=(*REGIMES, "all"), metavar="REGIME",
                        help=f"regime to check, repeatable: {', '.join(REGIMES)}, or all "
                             f"(default: {', '.join(DEFAULT_REGIMES)}; {', '.join(HAZARD_REGIMES)} "
                             "is a hazard regime, checked only when named or with all)")
    parser.add_argument("--max-examples", type=_positive_int, default=max_examples,
                        help=f"{unit} drawn per regime (default %(default)s)")
    parser.add_argument("--max-ranks", type=int, default=8,
                        help="largest PCP size P drawn, 2..8 (default %(default)s)")
    parser.add_argument("--seed", type=int, help="random seed (default: derandomized, repeatable)")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds a rank may take for one case before it counts as hung")
    parser.add_argument("--json", metavar="FILE",
                        help="write the result as JSON (schema: docs/json-schema.md)")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


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
    parser.add_argument("--version", action="version", version=f"pcpcheck {version()}")
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)
    check = commands.add_parser("check", help="check a gather implementation against the spec")
    check.add_argument("target", nargs="?", default="impl",
                       help="a .py file, module:function, or impl (the bundled one, default)")
    _add_common(check)
    _add_backend(check)
    check.add_argument("--repro-dir", metavar="DIR",
                       help="write a standalone pytest reproducer per violation into DIR")
    check.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                       help="wall-clock limit across all regimes; the report says how many "
                            "cases each regime reached")
    check.add_argument("--jobs", type=_positive_int, metavar="N",
                       help="threads backend: regimes searched by N driver processes at once, "
                            "each with its own worker (default: one per two cores); the "
                            "result does not depend on it")
    check.add_argument("--junit", metavar="FILE",
                       help="write a JUnit XML report: one test case per regime x invariant")
    check.add_argument("--html", metavar="DIR",
                       help="write a page per counterexample and a summary page into DIR")
    check.add_argument("--baseline", metavar="FILE",
                       help="known violations, one 'REGIME INVARIANT' per line (# comments): "
                            "they do not fail the run; listed ones no longer found are reported")
    check.add_argument("--replay", metavar="CASE_JSON",
                       help="judge this one case (as printed in a counterexample's replay line)")
    diff = commands.add_parser("diff", help="compare two versions of the gather on the same cases")
    diff.add_argument("old")
    diff.add_argument("new")
    _add_common(diff)
    _add_vllm(commands)
    return parser


def _add_vllm(commands) -> None:
    vllm = commands.add_parser("vllm", help="check a vLLM release's own PCP path on all ranks")
    vllm.add_argument("source", help="a release (0.33.0, vllm==0.33.0), a wheel, a checkout, "
                                     "or installed")
    _add_search(vllm, DEFAULT_RELEASE_EXAMPLES, "steps")
    vllm.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                      help="wall-clock limit across all regimes")
    vllm.add_argument("--empty-steps", action="store_true",
                      help="also draw steps with no scheduled token (a hazard: the model "
                           "runner never runs them)")
    vllm.add_argument("--replay", metavar="CASE_JSON", help="judge this one step")


def parse(argv: list[str]) -> argparse.Namespace:
    if not argv or argv[0] not in ("check", "diff", "vllm", "-h", "--help", "--version"):
        argv = ["check", *argv]
    args = _parser().parse_args(argv)
    if not args.regime:
        args.regimes = DEFAULT_REGIMES
    elif "all" in args.regime:
        args.regimes = REGIMES
    else:
        args.regimes = tuple(dict.fromkeys(args.regime))
    if not 0 < args.timeout < float("inf"):  # nan fails both comparisons
        raise UsageError(f"--timeout must be positive and finite (seconds), got {args.timeout}")
    if args.command == "vllm" and args.replay:
        args.replay = replay_case(args.replay)
    if args.command == "check":
        if args.replay:  # a malformed case is a usage error before anything starts
            args.replay = replay_case(args.replay)
        args.world_sizes = default_world_sizes(args.backend, args.world_sizes, args.device)
    return args


def use_cache_dir() -> None:
    """Hypothesis's files (its constants cache, any database) go to $XDG_CACHE_HOME/pcpcheck,
    never the caller's working directory. Commands only: the API leaves a host suite's alone."""
    from hypothesis.configuration import set_hypothesis_home_dir
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    set_hypothesis_home_dir(os.path.join(base, "pcpcheck", "hypothesis"))


def command() -> int:
    """The `pcpcheck` command, a process of its own: its fork server is forked from it now,
    before it runs a thread or a torch op (pcpcheck.backends.forkserver)."""
    from pcpcheck.backends.pool import FORK_SERVER
    FORK_SERVER.prefork()
    return main()


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
    except (SourceError, InterfaceDrift) as exc:  # pcpcheck vllm: one line naming the problem
        print(f"pcpcheck: {type(exc).__name__}: {exc}", file=sys.stderr)
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
    except OSError as exc:
        print(f"pcpcheck: cannot write {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("pcpcheck: interrupted", file=sys.stderr)
        return 130


def run_check(args, runner=None) -> int:
    """Check a target; `runner` given (torchrun's rank 0) is used as is, else the API starts one.
    Output paths are checked first; a write that fails after the run never hides the verdict."""
    check_outputs(args)
    use_cache_dir()
    if args.replay:
        return _replay(args, runner)
    from pcpcheck.progress import LinePrinter
    result = check(args.target, regimes=args.regimes, max_examples=args.max_examples,
                   max_ranks=args.max_ranks, seed=args.seed, budget_s=args.budget,
                   backend=args.backend, baseline=args.baseline, function=args.function,
                   timeout=args.timeout, world_sizes=args.world_sizes, device=args.device,
                   progress=LinePrinter(), runner=runner, jobs=args.jobs)
    print_report(result)
    write_outputs(args, result)
    return result.exit_code


def run_vllm(args) -> int:
    """`pcpcheck vllm SOURCE`: the release's manager, gather and wrappers on every rank (in a
    worker process: pcpcheck.api.check_release)."""
    check_outputs(args)
    use_cache_dir()
    if args.replay:
        return _replay_release(args)
    from pcpcheck.progress import LinePrinter
    result = check_release(args.source, regimes=args.regimes, max_examples=args.max_examples,
                           max_ranks=args.max_ranks, seed=args.seed, budget_s=args.budget,
                           timeout=args.timeout, empty_steps=args.empty_steps,
                           progress=LinePrinter())
    print_report(result)
    print(f"\n{result.target_name}: " + ", ".join(
        f"{regime} {text.split(':')[0]}" for regime, text in result.verdicts().items()))
    write_outputs(args, result)
    return result.exit_code


def _replay_release(args) -> int:
    from pcpcheck.api import load_release
    from pcpcheck.vllm import verdict
    from pcpcheck.vllm.source import resolve
    spec = resolve(args.source).spec()
    with make_runner("threads", timeout=args.timeout, world_sizes=None, device="cpu") as backend:
        release = load_release(backend, spec)
        print("\n".join(verdict.header(release)), flush=True)
        observation = verdict.observe_release_case(args.replay, release, backend)
    if not observation.violations:
        print(f"  replayed step holds: {', '.join(observation.checked)}")
        return EXIT_HOLDS
    print(verdict.counterexample(release, args.replay.batch.regime, observation))
    return EXIT_VIOLATION


def print_report(result) -> None:
    print()
    ids = RELEASE_IDS if result.release is not None else GATHER_IDS
    print("\n".join(report.verdict_table(result.regimes, ids)))

    shown = [k for k, c in enumerate(result.counterexamples) if c.folded_into is None]
    if shown:
        print("\n" + report.LEGEND)
    for number, index in enumerate(shown, 1):
        counterexample = result.counterexamples[index]
        known = " (known: in the baseline)" if counterexample.known else ""
        print(f"\nCounterexample {number}{known}: {counterexample.report}")
        folded = report.folded_line([f"{c.invariant} in {c.regime}"
                                     for c in result.counterexamples if c.folded_into == index])
        if folded:
            print(folded)
    new, known = len(result.new_violations), len(result.counterexamples) - len(result.new_violations)
    summary = f"{new} violation(s), {len(shown)} shown" if new else "every invariant holds"
    hazards = sum(c.hazard for c in result.new_violations)
    if hazards:
        summary += f", {hazards} in hazard regimes"
    if known:
        summary += f", {known} known violation(s) from the baseline"
    print(f"\nall regimes: {report.rates(*result.regimes, wall=result.seconds)}: {summary}")
    if any(s.budget_reached for s in result.regimes):
        print(f"budget of {result.options.budget_s:g} s reached; cases per regime: " + ", ".join(
            f"{s.regime} {s.cases}" for s in result.regimes))
    if result.baseline and result.baseline.fixed:
        print(f"no longer found, remove from {result.baseline.path}: " + "; ".join(
            f"{regime} {invariant}" for regime, invariant in result.baseline.fixed))


_OUTPUT_FILES = ("json", "junit")
_OUTPUT_DIRS = ("html", "repro_dir")


def check_outputs(args) -> None:
    """Every output path usable, before the run: UsageError (exit 2) names the first that is not."""
    for name in _OUTPUT_FILES + _OUTPUT_DIRS:
        path = getattr(args, name, None)
        if not path:
            continue
        option = "--" + name.replace("_", "-")
        is_dir = name in _OUTPUT_DIRS
        if os.path.exists(path):
            if os.path.isdir(path) != is_dir:
                raise UsageError(f"{option} {path}: " + ("not a directory" if is_dir else "is a directory"))
            if not os.access(path, os.W_OK):
                raise UsageError(f"{option} {path}: not writable")
            continue
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            if not is_dir:
                raise UsageError(f"{option} {path}: directory {parent} does not exist")
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise UsageError(f"{option} {path}: cannot create it in {parent}")


def write_outputs(args, result) -> None:
    """Write each output asked for; say why any failed, and that the verdict stands."""
    failed = 0

    def attempt(path, write):
        nonlocal failed
        try:
            return write()
        except OSError as exc:
            failed += 1
            print(f"pcpcheck: cannot write {exc.filename or path}: {exc.strerror or exc}",
                  file=sys.stderr)

    if getattr(args, "repro_dir", None) and result.counterexamples:
        from pcpcheck.repro import write_reproducers
        written = attempt(args.repro_dir, lambda: write_reproducers(args.repro_dir, result))
        result = dataclasses.replace(result, reproducers=tuple(written or ()))
    if getattr(args, "html", None):
        from pcpcheck.html import write_html
        attempt(args.html, lambda: write_html(args.html, result))
    if getattr(args, "json", None):
        attempt(args.json, lambda: _write_text(args.json, result.to_json()))
    if getattr(args, "junit", None):
        from pcpcheck.junit import junit_xml
        attempt(args.junit, lambda: _write_text(args.junit, junit_xml(result)))
    if failed:
        print(f"pcpcheck: the verdict above stands (exit {result.exit_code}); {failed} "
              "output(s) not written", file=sys.stderr)


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _replay(args, runner) -> int:
    """`--replay`: one case (parsed and validated by `parse`), judged; --json like a search."""
    own = runner is None
    if own:
        runner = make_runner(args.backend, timeout=args.timeout, world_sizes=args.world_sizes,
                             device=args.device, start=False)
    try:
        target = runner.load(args.target, args.function)
        print(f"pcpcheck: checking {target.name}")
        if target.stand_ins:
            print(f"  stood in for: {', '.join(target.stand_ins)}")
        observation = run_case(args.replay, target, runner)
    finally:
        if own:
            runner.close()
    regime = args.replay.batch.regime
    if args.json:
        from pcpcheck.api import replay_result
        write_outputs(args, replay_result(args, target, observation))
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


if __name__ == "__main__":
    raise SystemExit(command())
