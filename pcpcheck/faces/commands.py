"""The commands `pcpcheck check|diff|vllm` on parsed arguments (pcpcheck.faces.options): each
checks its output paths, calls the API, prints the report (pcpcheck.render.report) and writes the
outputs asked for (pcpcheck.render.outputs). The `pcpcheck` command (pcpcheck.faces.cli) and
torchrun's rank 0 (pcpcheck.faces.torchrun_rank) run them; an error is theirs to report."""

from __future__ import annotations

import contextlib
import sys

from pcpcheck import api
from pcpcheck.judge.explain import LEGEND
from pcpcheck.render import report
from pcpcheck.render.outputs import STDOUT, check_outputs, write_outputs
from pcpcheck.render.progress import LinePrinter
from pcpcheck.render.repro import write_release_reproducer
from pcpcheck.render.tree_report import regime_line, tree_diff_text
from pcpcheck.shared.defaults import DEFAULT_MAX_EXAMPLES, DEFAULT_RELEASE_EXAMPLES
from pcpcheck.shared.errors import UsageError
from pcpcheck.shared.results import unreached


def run(args, runner=None) -> int:
    """The command `args` names; `runner` given (torchrun's rank 0: `check` only) is used as
    is, else the API starts one. With `--json -` the JSON is stdout's only text: everything the
    command prints goes to stderr."""
    if getattr(args, "json", None) == STDOUT:
        args.json_stream = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            return _run(args, runner)
    return _run(args, runner)


def _run(args, runner) -> int:
    if args.command == "merge":
        return run_merge(args)
    if args.command == "diff":
        return run_diff(args)
    if args.command == "vllm":
        return run_vllm(args)
    return run_check(args, runner)


def run_check(args, runner=None) -> int:
    """`pcpcheck check`; `runner` given (torchrun's rank 0) is used as is, else the API starts one.
    Output paths are checked first; a write that fails after the run never hides the verdict."""
    check_outputs(args)
    api.use_cache_dir()
    if args.replay:
        return _replay(args, runner)
    result = api.check(args.target, regimes=args.regimes, max_examples=args.max_examples,
                       shard=args.shard,
                       max_ranks=args.max_ranks, seed=args.seed, budget_s=args.budget,
                       backend=args.backend, baseline=args.baseline, function=args.function,
                       asynchronous=args.async_protocol, async_order=args.async_order,
                       timeout=args.timeout, world_sizes=args.world_sizes, device=args.device,
                       progress=LinePrinter(), runner=runner, jobs=args.jobs,
                       exhaustive=args.exhaustive, scope=args.scope)
    print(report.result_text(result))
    write_outputs(args, result)
    return result.exit_code


def _replay(args, runner) -> int:
    """`--replay`: one case (parsed and checked by `parse`), judged; outputs like a search's."""
    result = api.replay_case(args.target, args.replay, function=args.function,
                             asynchronous=args.async_protocol, async_order=args.async_order,
                             backend=args.backend, timeout=args.timeout, device=args.device,
                             runner=runner)
    print(f"pcpcheck: checking {result.target_name}")
    if result.stand_ins:
        print(f"  stood in for: {', '.join(result.stand_ins)}")
    if result.counterexamples:
        print(result.counterexamples[0].report)
        print("\n" + LEGEND)
    else:
        print(f"  replayed case holds: every invariant of {', '.join(_checked(result))}")
    write_outputs(args, result)
    return result.exit_code


def _checked(result) -> list[str]:
    return [count.invariant for count in result.regimes[0].invariants if count.checked]


def run_vllm(args) -> int:
    """`pcpcheck vllm SOURCE`: the release's manager, gather and wrappers on every rank (in a
    worker process: pcpcheck.api.check_release)."""
    check_outputs(args)
    api.use_cache_dir()
    if args.steps:
        result = api.check_steps(args.source, args.steps, timeout=args.timeout)
        print(result.text())
        if args.repro_dir:
            for finding in (f for f in result.findings if f.case):
                print("reproducer: " + write_release_reproducer(
                    args.repro_dir, result.source, result.release, finding.step, finding.kind,
                    finding.case))
        return result.exit_code
    if args.replay:
        result = api.replay_release(args.source, args.replay, timeout=args.timeout)
        if result.counterexamples:  # the verdict first, what it rests on after it
            print(result.counterexamples[0].report)
        else:
            print(f"  replayed step holds: {', '.join(_checked(result))}")
        print("\n".join(report.release_header(result.release, result.target_name, result.stand_ins)))
        write_outputs(args, result)
        return result.exit_code
    result = api.check_release(args.source, regimes=args.regimes, max_examples=args.max_examples,
                               max_ranks=args.max_ranks, seed=args.seed, budget_s=args.budget,
                               timeout=args.timeout, empty_steps=args.empty_steps,
                               baseline=args.baseline, progress=LinePrinter(),
                               exhaustive=args.exhaustive, scope=args.scope, shard=args.shard,
                               changed_against=args.changed_against)
    print(report.result_text(result))
    print(f"\n{result.target_name}: " + ", ".join(
        f"{regime} {text.split(':')[0]}" for regime, text in result.verdicts().items()))
    write_outputs(args, result)
    return result.exit_code


def run_diff(args) -> int:
    """`pcpcheck diff`: print as each regime ends; --json after the verdict, never masking it."""
    check_outputs(args)
    api.use_cache_dir()
    if api.diffs_trees(args.old, args.new):
        return run_tree_diff(args)
    for option in ("html", "replay"):
        if getattr(args, option):
            raise UsageError(f"--{option} applies where OLD and NEW are vLLM trees")
    print(f"pcpcheck diff: old {args.old}, new {args.new}")

    def show(regime) -> None:
        if regime.not_applicable:
            print(f"  {regime.regime:<12} {unreached(regime.not_applicable, 'not applicable: ')}", flush=True)
            return
        state = "same outcomes" if regime.case is None else "DIFFERENT"
        print(f"  {regime.regime:<12} {regime.cases:>6} cases: {state}", flush=True)
        if regime.report:
            print(regime.report)

    result = api.diff(args.old, args.new, regimes=args.regimes,
                      max_examples=args.max_examples or DEFAULT_MAX_EXAMPLES,
                      max_ranks=args.max_ranks, seed=args.seed, function=args.function,
                      timeout=args.timeout, on_regime=show)
    differences = sum(r.case is not None for r in result.regimes)
    print(f"\n{differences} regime(s) with a difference" if differences else "\nno difference found")
    write_outputs(args, result)
    return result.exit_code


def run_tree_diff(args) -> int:
    """`pcpcheck diff OLD NEW` for two vLLM trees (each in workers of its own): a line per
    regime as it ends, then the differing steps side by side and the verdict."""
    if args.function:
        raise UsageError("--function names a gather target's function: OLD and NEW are vLLM trees")
    print(f"pcpcheck diff: old {args.old}, new {args.new} (vLLM trees: the same steps through "
          "both whole PCP paths, compared stage by stage)")
    if args.replay:
        result = api.replay_tree_diff(args.old, args.new, args.replay, timeout=args.timeout)
    else:
        result = api.diff_trees(args.old, args.new, regimes=args.regimes,
                                max_examples=args.max_examples or DEFAULT_RELEASE_EXAMPLES,
                                max_ranks=args.max_ranks, seed=args.seed, timeout=args.timeout,
                                on_regime=lambda regime: print(regime_line(regime), flush=True))
    print(tree_diff_text(result, with_regimes=bool(args.replay)))
    write_outputs(args, result)
    return result.exit_code


def run_merge(args) -> int:
    """`pcpcheck merge PART.json ...`: the parts of a run split by --shard, one verdict."""
    check_outputs(args)
    result = api.merge(args.parts)
    print(f"pcpcheck merge: {len(args.parts)} of {result.shards} shard(s) of {result.target_name}")
    print(report.result_text(result))
    write_outputs(args, result)
    return result.exit_code
