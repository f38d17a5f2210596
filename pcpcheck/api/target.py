"""The API of a gather implementation (a target: a pcp.py file, module:function, impl): `check`
it in every regime, `diff` two versions on the same cases, `replay_case` one case, `replay` one
case as a reproducer asks. The target is loaded and run only in a backend's worker processes."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace

from pcpcheck.api import assemble
from pcpcheck.api.common import (
    Progress,
    default_world_sizes,
    exhaustive_scope,
    make_runner,
    one_after_another,
    one_case,
    read_case,
    read_shard,
    resolve_target,
    validate,
)
from pcpcheck.judge.baseline import Baseline, load_baseline
from pcpcheck.judge.compare import DIFFERENT, run_pairs
from pcpcheck.judge.explain import difference
from pcpcheck.judge.run import run_case
from pcpcheck.search import scope as scopes
from pcpcheck.search.engine import RegimeResult, search
from pcpcheck.search.exhaustive import exhaust
from pcpcheck.search.jobs import search_in_parallel
from pcpcheck.shared.defaults import (
    DEFAULT_BACKEND,
    DEFAULT_DEVICE,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_MAX_RANKS,
    DEFAULT_TIMEOUT,
)
from pcpcheck.shared.errors import UsageError
from pcpcheck.shared.protocol import async_function
from pcpcheck.shared.results import (
    CheckResult,
    DiffResult,
    Options,
    RegimeDiff,
    Verdict,
    version,
)
from pcpcheck_spec.names import ASYNC_ORDER, DEFAULT_REGIMES, SHARDED

NO_SHARD_FLAG = ("the gather has no shard_decode_requests parameter: decodes are never sharded "
                 "in its era (vLLM before 0.32)")


# --- check ----------------------------------------------------------------------------------------

def with_protocol(function: str | None, asynchronous: str | None,
                  async_order: Sequence[str]) -> str | None:
    """The function the workers load: the gather's, with the asynchronous protocol if any."""
    if asynchronous is None:
        return function
    return async_function(function, asynchronous, tuple(async_order))


def check(target, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_MAX_EXAMPLES,
          max_ranks: int = DEFAULT_MAX_RANKS, seed: int | None = None, budget_s: float | None = None,
          backend: str = DEFAULT_BACKEND, baseline: str | os.PathLike | None = None,
          function: str | None = None, timeout: float = DEFAULT_TIMEOUT, world_sizes=None,
          device: str = DEFAULT_DEVICE, progress: Progress | None = None, runner=None,
          jobs: int | None = None, exhaustive: bool = False, scope=None,
          shard=None, asynchronous: str | None = None,
          async_order: Sequence[str] = ASYNC_ORDER) -> CheckResult:
    """Check a gather implementation against the spec in each regime.

    target: a callable (importable as module:function), a .py path, 'module:function' or 'impl'.
    seed None: derandomized, the same cases every run. budget_s: wall-clock seconds across
    regimes, shared out among the regimes still to run. baseline: a file of known violations
    (`REGIME INVARIANT` per line). runner: an already started backend (torchrun's rank 0).
    jobs: driver processes searching regimes at once (default_jobs: one per two cores on the
    threads backend); the result does not depend on it.
    exhaustive: instead of drawing max_examples cases, check every step within `scope` (a
    pcpcheck.search.scope.Scope or its `KEY=VALUE,...` text; default scope.DEFAULT_SCOPE), smallest
    first (pcpcheck.search.exhaustive); the result's regimes say how many steps the scope holds.
    shard: (K, N) or 'K/N', part K of the run split N ways (pcpcheck.search.shard), for
    `merge` to join.
    asynchronous: also check the target's asynchronous protocol, this class ("": the one with
    start and finish), driven in `async_order` (docs/async.md) in the sharded regime.
    Raises UsageError, LoadError, WorkerError (rank processes failed to start), CheckerError.
    """
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(regimes=tuple(dict.fromkeys(regimes)), max_examples=max_examples,
                      max_ranks=max_ranks, seed=seed, budget_s=budget_s, backend=backend,
                      world_sizes=tuple(world_sizes) if world_sizes else None, device=device,
                      timeout=timeout, function=with_protocol(function, asynchronous, async_order),
                      baseline=None if baseline is None else os.fspath(baseline),
                      scope=exhaustive_scope(exhaustive, scope, backend, world_sizes),
                      shard=read_shard(shard))
    validate(options)
    known = load_baseline(options.baseline) if options.baseline else Baseline(options.baseline, ())
    source = resolve_target(target)
    progress = progress or Progress()
    jobs = default_jobs(backend, runner) if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    started = time.monotonic()
    if runner is None:
        sizes = default_world_sizes(backend, options.world_sizes, device)
        options = replace(options, world_sizes=sizes)
        if jobs > 1 and backend == "threads" and len(options.regimes) > 1:
            loaded, results = _search_in_drivers(source, options, jobs, progress)
        else:
            with make_runner(backend, timeout=timeout, world_sizes=sizes, device=device) as own:
                loaded, results = _search_here(source, own, options, progress)
    else:
        loaded, results = _search_here(source, runner, options, progress)
    return replace(assemble.result(source, loaded, options, results, known),
                   seconds=round(time.monotonic() - started, 3))


def _search_here(source: str, runner, options: Options, progress: Progress):
    """The regimes searched one after another on `runner`: (target, results)."""
    loaded = runner.load(source, options.function)  # in the backend's workers, never here
    progress.started(loaded, options)
    return loaded, one_after_another(
        options, progress, lambda regime, share, on_case, on_wait: _search_regime(
            loaded, runner, options, regime, share, on_case, on_wait))


def default_jobs(backend: str, runner=None) -> int:
    """Driver processes by default on the threads backend: one per two cores, since a driver
    and its worker, with cases streamed in batches, keep two cores busy (measured on 2 cores:
    the default run took 10.1 s with one driver and 10.5-10.8 s with two). A process backend's
    pools, or a runner given, are driven by this process alone."""
    return max(1, (os.cpu_count() or 1) // 2) if backend == "threads" and runner is None else 1


def _search_regime(target, runner, options: Options, regime: str, deadline, on_case,
                   on_wait=None) -> RegimeResult:
    if regime == SHARDED and not target.accepts_shard:  # its era has no decode sharding
        return RegimeResult(regime=regime, not_applicable=NO_SHARD_FLAG)
    if options.scope is not None:
        return exhaust(target, regime, runner, scopes.parse_scope(options.scope),
                       deadline=deadline, on_case=on_case, on_wait=on_wait, shard=options.shard)
    return search(target, regime, runner, max_examples=options.max_examples,
                  max_ranks=options.max_ranks, derandomize=options.seed is None, seed=options.seed,
                  pcp_sizes=options.world_sizes, deadline=deadline, on_case=on_case,
                  on_wait=on_wait, shard=options.shard)


def _search_in_drivers(source: str, options: Options, jobs: int, progress: Progress):
    """The regimes searched by `jobs` driver processes at once (pcpcheck.search.jobs); progress
    lines in regime order, each when it and every regime before it are done."""
    def open_backend():
        runner = make_runner("threads", timeout=options.timeout, world_sizes=options.world_sizes,
                             device=options.device)
        try:
            return runner, runner.load(source, options.function)
        except BaseException:
            runner.close()
            raise

    def search_regime(index, target, runner, share, on_case, on_wait):
        return _search_regime(target, runner, options, options.regimes[index], share, on_case,
                              on_wait)

    loaded, done, shown = [], {}, [0]

    def on_loaded(target):
        loaded.append(target)
        progress.started(target, options)

    def on_done(index, result):
        done[index] = result
        while shown[0] in done:  # in order: a later regime's line waits for the earlier ones
            progress.finished(assemble.summary(done[shown[0]]))
            shown[0] += 1

    results = search_in_parallel(
        len(options.regimes), jobs, open_backend, search_regime, budget_s=options.budget_s,
        on_loaded=on_loaded, on_case=lambda index, r: progress.case(options.regimes[index], r),
        on_wait=lambda index, rank, seconds, phase: progress.waiting(
            options.regimes[index], rank, seconds, options.timeout, phase),
        on_done=on_done)
    return loaded[0], results


# --- one case -----------------------------------------------------------------------------------

def replay_case(target, case, *, function: str | None = None, backend: str = DEFAULT_BACKEND,
                timeout: float = DEFAULT_TIMEOUT, device: str = DEFAULT_DEVICE, runner=None,
                asynchronous: str | None = None,
                async_order: Sequence[str] = ASYNC_ORDER) -> CheckResult:
    """One case (a Case, or its JSON as a counterexample prints it) run once on the target and
    judged: a CheckResult of one regime and one case, with its counterexample if it fails
    (`pcpcheck check --replay`). runner: an already started backend (torchrun's rank 0).
    asynchronous, async_order: as check's."""
    function = with_protocol(function, asynchronous, async_order)
    if isinstance(case, str):
        case = read_case(case)
    source = resolve_target(target)
    own = runner is None
    if own:
        runner = make_runner(backend, timeout=timeout, world_sizes=None, device=device, start=False)
    try:
        loaded = runner.load(source, function)  # in the backend's workers, never here
        observation = run_case(case, loaded, runner)
    finally:
        if own:
            runner.close()
    options = Options(regimes=(case.batch.regime,), max_examples=1, max_ranks=case.batch.pcp_size,
                      backend=backend, device=device, timeout=timeout, function=function)
    return one_case(source, loaded, observation, options)


def replay(target, case_json: str, function: str | None = None,
           timeout: float = DEFAULT_TIMEOUT) -> Verdict:
    """Judge one case (JSON as printed by pcpcheck) against a target (run in a worker): what a
    reproducer asks."""
    result = replay_case(target, case_json, function=function, timeout=timeout)
    if result.holds:
        return Verdict(True, (), "")
    shown = result.counterexamples[0]
    return Verdict(False, tuple(v.invariant for v in shown.violations), shown.report)


# --- diff -----------------------------------------------------------------------------------------

def diff(old, new, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_MAX_EXAMPLES,
         max_ranks: int = DEFAULT_MAX_RANKS, seed: int | None = None, function: str | None = None,
         timeout: float = DEFAULT_TIMEOUT, on_regime=None) -> DiffResult:
    """Run two versions on the same drawn cases: per regime, the smallest case where their
    per-rank outcomes differ (the search of `check`, with a difference as its finding).
    `on_regime(RegimeDiff)` as each regime ends. A regime one of them cannot reach (its era has
    no decode sharding) is not applicable, as `check` reports it."""
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(regimes=tuple(dict.fromkeys(regimes)), max_examples=max_examples,
                      max_ranks=max_ranks, seed=seed, timeout=timeout, function=function)
    validate(options)
    old_source, new_source = resolve_target(old), resolve_target(new)
    found = []
    with make_runner("threads", timeout=timeout, world_sizes=None, device="cpu") as runner:
        targets = (runner.load(old_source, function), runner.load(new_source, function))
        for regime in options.regimes:
            lacking = [f"{side} ({t.source})" for side, t in zip(("old", "new"), targets)
                       if regime == SHARDED and not t.accepts_shard]
            if lacking:
                result = RegimeDiff(regime=regime, cases=0, case=None, report="",
                                    not_applicable=f"{', '.join(lacking)}: {NO_SHARD_FLAG}")
            else:
                searched = search(targets, regime, runner, max_examples=max_examples,
                                  max_ranks=max_ranks, derandomize=seed is None, seed=seed,
                                  run_many=run_pairs)
                pairs = [o for o in searched.counterexamples if o.violations[0].invariant == DIFFERENT]
                result = RegimeDiff(regime=regime, cases=searched.cases, case=None, report="")
                if pairs:
                    result = RegimeDiff(
                        regime=regime, cases=searched.cases, case=pairs[0].prepared.case.to_json(),
                        report=difference(pairs[0], regime, targets[0].source, targets[1].source))
            found.append(result)
            if on_regime is not None:
                on_regime(result)
    return DiffResult(version=version(), old=old_source, new=new_source, options=options,
                      regimes=tuple(found))
