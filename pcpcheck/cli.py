"""pcpcheck's command line: parse the arguments (pcpcheck.options), call the API, render what it
returns (pcpcheck.report, pcpcheck.outputs).

    pcpcheck                          check the bundled implementation in every regime
    pcpcheck check TARGET [options]   check a pcp.py file, a module:function, or `impl`
    pcpcheck diff OLD NEW [options]   run two versions on the same cases, report where they differ
    pcpcheck vllm SOURCE [options]    check a vLLM release's own PCP path on every rank

Exit codes: 0 every invariant holds (diff: no difference), 1 a violation (diff: a difference),
2 a usage or load error (one line on stderr, no traceback).
"""

from __future__ import annotations

import os
import sys

__all__ = ["command", "main", "run_check"]

INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def command() -> int:
    """The `pcpcheck` command, a process of its own: once its arguments parse (`--version` and
    `--help` answer before anything is imported), its fork server is forked from it, before it
    runs a thread or a torch op (pcpcheck.backends.forkserver)."""
    import signal
    interrupted = []

    def on_sigint(signum, frame):
        interrupted.append(signum)
        raise KeyboardInterrupt

    def unraisable(info, default=sys.unraisablehook):
        # Ctrl-C landing in a callback Python cannot raise from (a weakref's, during an import)
        # is printed there and lost; the flag below reports it instead.
        if not issubclass(info.exc_type, KeyboardInterrupt):
            default(info)

    signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = unraisable
    code = main(prefork=True)
    if interrupted:
        # Raised inside exec() of a string (dataclasses and namedtuple build their methods so),
        # a KeyboardInterrupt sets a flag that makes CPython end the process by SIGINT at exit,
        # even once handled; any exec() resets it.
        exec("")  # noqa: S102
        if code != INTERRUPTED:
            print("pcpcheck: interrupted", file=sys.stderr)
            return INTERRUPTED
    return code


def main(argv: list[str] | None = None, *, prefork: bool = False) -> int:
    # Ctrl-C is clean from the first instant: this module imports nothing else at its top, so
    # the console script is in this handler as soon as it has imported it.
    try:
        return _main(sys.argv[1:] if argv is None else argv, prefork)
    except KeyboardInterrupt:
        print("pcpcheck: interrupted", file=sys.stderr)
        return INTERRUPTED


def _main(argv: list[str], prefork: bool) -> int:
    from pcpcheck.results import EXIT_USAGE
    from pcpcheck.shared.errors import ERRORS, error_line
    try:
        from pcpcheck.options import parse
        args = parse(argv)
        from pcpcheck import api
        if prefork:
            api.prefork()
        if args.command == "diff":
            return run_diff(args)
        if args.command == "vllm":
            return run_vllm(args)
        return run_check(args)
    except ERRORS as exc:
        print(f"pcpcheck: {error_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`pcpcheck | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
        return EXIT_USAGE
    except OSError as exc:
        print(f"pcpcheck: cannot write {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


def run_check(args, runner=None) -> int:
    """`pcpcheck check`; `runner` given (torchrun's rank 0) is used as is, else the API starts one.
    Output paths are checked first; a write that fails after the run never hides the verdict."""
    from pcpcheck import api, report
    from pcpcheck.outputs import check_outputs, write_outputs
    check_outputs(args)
    api.use_cache_dir()
    if args.replay:
        return _replay(args, runner)
    from pcpcheck.progress import LinePrinter
    result = api.check(args.target, regimes=args.regimes, max_examples=args.max_examples,
                       max_ranks=args.max_ranks, seed=args.seed, budget_s=args.budget,
                       backend=args.backend, baseline=args.baseline, function=args.function,
                       timeout=args.timeout, world_sizes=args.world_sizes, device=args.device,
                       progress=LinePrinter(), runner=runner, jobs=args.jobs,
                       exhaustive=args.exhaustive, scope=args.scope)
    print(report.result_text(result))
    write_outputs(args, result)
    return result.exit_code


def _replay(args, runner) -> int:
    """`--replay`: one case (parsed and checked by `parse`), judged; outputs like a search's."""
    from pcpcheck import api, report
    from pcpcheck.outputs import write_outputs
    result = api.replay_case(args.target, args.replay, function=args.function,
                             backend=args.backend, timeout=args.timeout, device=args.device,
                             runner=runner)
    print(f"pcpcheck: checking {result.target_name}")
    if result.stand_ins:
        print(f"  stood in for: {', '.join(result.stand_ins)}")
    if result.counterexamples:
        print(result.counterexamples[0].report)
        print("\n" + report.LEGEND)
    else:
        print(f"  replayed case holds: every invariant of {', '.join(_checked(result))}")
    write_outputs(args, result)
    return result.exit_code


def _checked(result) -> list[str]:
    return [count.invariant for count in result.regimes[0].invariants if count.checked]


def run_vllm(args) -> int:
    """`pcpcheck vllm SOURCE`: the release's manager, gather and wrappers on every rank (in a
    worker process: pcpcheck.api.check_release)."""
    from pcpcheck import api, report
    from pcpcheck.outputs import check_outputs, write_outputs
    check_outputs(args)
    api.use_cache_dir()
    if args.replay:
        result = api.replay_release(args.source, args.replay, timeout=args.timeout)
        print("\n".join(report.release_header(result.release, result.target_name, result.stand_ins)))
        if result.counterexamples:
            print(result.counterexamples[0].report)
        else:
            print(f"  replayed step holds: {', '.join(_checked(result))}")
        write_outputs(args, result)
        return result.exit_code
    from pcpcheck.progress import LinePrinter
    result = api.check_release(args.source, regimes=args.regimes, max_examples=args.max_examples,
                               max_ranks=args.max_ranks, seed=args.seed, budget_s=args.budget,
                               timeout=args.timeout, empty_steps=args.empty_steps,
                               baseline=args.baseline, progress=LinePrinter(),
                               exhaustive=args.exhaustive, scope=args.scope)
    print(report.result_text(result))
    print(f"\n{result.target_name}: " + ", ".join(
        f"{regime} {text.split(':')[0]}" for regime, text in result.verdicts().items()))
    write_outputs(args, result)
    return result.exit_code


def run_diff(args) -> int:
    """`pcpcheck diff`: print as each regime ends; --json after the verdict, never masking it."""
    from pcpcheck import api
    from pcpcheck.outputs import check_outputs, write_outputs
    check_outputs(args)
    api.use_cache_dir()
    print(f"pcpcheck diff: old {args.old}, new {args.new}")

    def show(regime) -> None:
        if regime.not_applicable:
            print(f"  {regime.regime:<12} not applicable: {regime.not_applicable}", flush=True)
            return
        state = "same outcomes" if regime.case is None else "DIFFERENT"
        print(f"  {regime.regime:<12} {regime.cases:>6} cases: {state}", flush=True)
        if regime.report:
            print(regime.report)

    result = api.diff(args.old, args.new, regimes=args.regimes, max_examples=args.max_examples,
                      max_ranks=args.max_ranks, seed=args.seed, function=args.function,
                      timeout=args.timeout, on_regime=show)
    differences = sum(r.case is not None for r in result.regimes)
    print(f"\n{differences} regime(s) with a difference" if differences else "\nno difference found")
    write_outputs(args, result)
    return result.exit_code


if __name__ == "__main__":
    raise SystemExit(command())
