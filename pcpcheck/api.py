"""pcpcheck's Python API, the one face every other face calls: `check` a target in every regime,
`check_release` a vLLM release's own PCP path, `diff` two versions, `replay` one case.

    result = pcpcheck.check("path/to/pcp.py", regimes=("sharded",), budget_s=60)
    result.holds, result.exit_code, result.counterexamples, result.to_json()

The command line (`pcpcheck.cli`), the pytest plugin and torchrun's rank entry parse their
arguments, call these functions and render what they return (`pcpcheck.results`: the report,
JSON, JUnit, HTML and reproducers are renderings of a result).
"""

from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import asdict, replace

from pcpcheck import assemble, report
from pcpcheck.backends import BACKENDS, make_backend
from pcpcheck.baseline import Baseline, load_baseline
from pcpcheck.cases import parse_case
from pcpcheck.judge import run_case
from pcpcheck.compare import DIFFERENT, run_pairs
from pcpcheck import scope as scopes
from pcpcheck.engine import RegimeResult, count_coverage, search
from pcpcheck.exhaustive import exhaust
from pcpcheck.minimize import Replays
from pcpcheck.jobs import budget_share, search_in_parallel
from pcpcheck.results import (DEFAULT_MAX_EXAMPLES, DEFAULT_RELEASE_EXAMPLES, CheckResult,
                              Counterexample, DiffResult, Options, RegimeDiff, RegimeSummary,
                              PathStage, ReleaseRecord, Verdict, version)
from pcpcheck.shared.case import Case
from pcpcheck.shared.errors import (CheckerError, InterfaceDrift, LoadError, SourceError,
                                    UsageError, WorkerError)
from pcpcheck.shared.messages import RELEASE
from pcpcheck_spec.names import DEFAULT_REGIMES, REGIMES, SHARDED

NO_SHARD_FLAG = ("the gather has no shard_decode_requests parameter: decodes are never sharded "
                 "in its era (vLLM before 0.32)")


# --- for a command: the process it runs in ------------------------------------------------------

def prefork() -> None:
    """Start this process's fork server now, as a fork of it (pcpcheck.backends.forkserver):
    for a command's own process, at its start, before it runs a thread or a torch op."""
    from pcpcheck.backends.pool import FORK_SERVER
    FORK_SERVER.prefork()


def use_cache_dir() -> None:
    """Hypothesis's files (its constants cache, any database) go to $XDG_CACHE_HOME/pcpcheck,
    never the caller's working directory. Commands only: the API leaves a host suite's alone."""
    from hypothesis.configuration import set_hypothesis_home_dir
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    set_hypothesis_home_dir(os.path.join(base, "pcpcheck", "hypothesis"))


def torchrun_session(backend: str, timeout: float):
    """This torchrun process's part of a check (pcpcheck.backends.torchrun.Session): gloo or
    nccl as asked, else nccl where CUDA is, gloo elsewhere."""
    from pcpcheck.backends.torchrun import Session
    if backend not in ("gloo", "nccl"):
        import torch
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    return Session(backend, timeout)


def read_case(text: str) -> Case:
    """A case given from outside (a replay line, a reproducer): UsageError (one line) unless it
    is well formed."""
    try:
        return parse_case(text)
    except ValueError as exc:
        raise UsageError(f"not a well-formed case: {exc}") from None


# --- options ------------------------------------------------------------------------------------

def resolve_target(target) -> str:
    """A target as the loader (and a worker process) takes it: a callable becomes module:name."""
    if isinstance(target, (str, os.PathLike)) or target is None:
        return "impl" if target is None else os.fspath(target)
    if not callable(target):
        raise UsageError(f"target must be a callable, a path or module:function, "
                         f"not {type(target).__name__}")
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    where = f"{module}:{name}"
    if not module or not name or module == "__main__" or not name.isidentifier():
        raise UsageError(f"{where}: a callable target must be a module-level function importable "
                         "by name (ranks run in other processes); pass 'module:function' or a path")
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception as exc:  # noqa: BLE001 - its module may fail to import anywhere else too
        raise UsageError(f"{where}: its module does not import: {type(exc).__name__}: {exc}") from None
    if found is not target and getattr(found, "__wrapped__", None) is not target:
        raise UsageError(f"{where}: importing it by that name gives a different object")
    return where


def validate(options: Options) -> None:
    """Every option in range, or UsageError naming it."""
    unknown = [r for r in options.regimes if r not in REGIMES]
    if unknown or not options.regimes:
        raise UsageError(f"regimes must be among {', '.join(REGIMES)}, got {list(options.regimes)}")
    if options.max_examples < 1:
        raise UsageError(f"max_examples must be at least 1, got {options.max_examples}")
    if not 2 <= options.max_ranks <= 8:
        raise UsageError(f"--max-ranks must be between 2 and 8, got {options.max_ranks}")
    if not 0 < options.timeout < float("inf"):  # nan fails both comparisons
        raise UsageError(f"--timeout must be positive and finite (seconds), got {options.timeout}")
    if options.budget_s is not None and options.budget_s <= 0:
        raise UsageError(f"--budget must be positive seconds, got {options.budget_s}")
    if options.backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {options.backend!r}")
    if options.world_sizes and not all(2 <= p <= 8 for p in options.world_sizes):
        raise UsageError(f"every world size must be between 2 and 8: {list(options.world_sizes)}")


def exhaustive_scope(exhaustive: bool, scope, backend: str = "threads", world_sizes=None):
    """Options.scope: the scope's KEY=VALUE text when exhaustive, else None (UsageError for a
    scope without --exhaustive, a malformed one, or ranks a process backend does not pool)."""
    if not exhaustive:
        if scope is not None:
            raise UsageError("--scope bounds an exhaustive check: add --exhaustive")
        return None
    if scope is None:
        scope = scopes.DEFAULT_SCOPE
    elif isinstance(scope, str):
        try:
            scope = scopes.parse_scope(scope)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if backend != "threads" or world_sizes:
        raise UsageError("--exhaustive runs on the threads backend (its scope names the world "
                         "sizes: --scope ranks=...)")
    return scope.spec()


def default_world_sizes(backend: str, world_sizes, device: str):
    """The world sizes a process backend pools (None for threads), checked against the GPUs."""
    if backend == "threads":
        return world_sizes
    import torch
    if device != "cpu":
        raise UsageError(f"--device {device} is for --backend threads ({backend} ranks use "
                         + ("cuda:rank" if backend == "nccl" else "the CPU") + ")")
    gpus = torch.cuda.device_count() if backend == "nccl" else 0
    if backend == "nccl":
        if gpus < 2:
            raise UsageError(f"--backend nccl needs at least 2 GPUs, found {gpus}")
        if world_sizes and max(world_sizes) > gpus:
            raise UsageError(f"--backend nccl: world size {max(world_sizes)} needs "
                             f"{max(world_sizes)} GPUs, found {gpus}")
    if world_sizes:
        return tuple(world_sizes)
    return (2, 4) if backend == "gloo" else tuple(sorted({2, min(gpus, 8)}))


def make_runner(backend: str, *, timeout: float, world_sizes, device: str, start: bool = True):
    """The backend (pcpcheck.backends), its process pools started unless start=False (a replay)."""
    try:
        return make_backend(backend, timeout=timeout, world_sizes=world_sizes if start else None,
                            device=device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class Progress:
    """What `check` tells as it goes (all optional): the CLI prints lines, a TTY a live one."""

    def started(self, target, options: Options) -> None: ...
    def case(self, regime: str, result) -> None: ...  # result: the engine's RegimeResult so far
    def waiting(self, regime: str, rank: int, seconds: float, timeout: float, phase: str) -> None:
        """A rank has run `seconds` (a second or more) on one case of `regime`, out of its
        `timeout`; `phase`: what the search is doing ("shrinking, attempt 3")."""
    def finished(self, summary: RegimeSummary) -> None: ...


# --- check ----------------------------------------------------------------------------------------

def check(target, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_MAX_EXAMPLES,
          max_ranks: int = 8, seed: int | None = None, budget_s: float | None = None,
          backend: str = "threads", baseline: str | os.PathLike | None = None,
          function: str | None = None, timeout: float = 10.0, world_sizes=None,
          device: str = "cpu", progress: Progress | None = None, runner=None,
          jobs: int | None = None, exhaustive: bool = False, scope=None) -> CheckResult:
    """Check a gather implementation against the spec in each regime.

    target: a callable (importable as module:function), a .py path, 'module:function' or 'impl'.
    seed None: derandomized, the same cases every run. budget_s: wall-clock seconds across
    regimes, shared out among the regimes still to run. baseline: a file of known violations
    (`REGIME INVARIANT` per line). runner: an already started backend (torchrun's rank 0).
    jobs: driver processes searching regimes at once (default_jobs: one per two cores on the
    threads backend); the result does not depend on it.
    exhaustive: instead of drawing max_examples cases, check every step within `scope` (a
    pcpcheck.scope.Scope or its `KEY=VALUE,...` text; default scope.DEFAULT_SCOPE), smallest
    first (pcpcheck.exhaustive); the result's regimes say how many steps the scope holds.
    Raises UsageError, LoadError, WorkerError (rank processes failed to start), CheckerError.
    """
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(tuple(dict.fromkeys(regimes)), max_examples, max_ranks, seed, budget_s,
                      backend, tuple(world_sizes) if world_sizes else None, device, timeout,
                      function, None if baseline is None else os.fspath(baseline),
                      scope=exhaustive_scope(exhaustive, scope, backend, world_sizes))
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
        options = Options(**{**asdict(options), "world_sizes": sizes})
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
    return loaded, _one_after_another(
        options, progress, lambda regime, share, on_case, on_wait: _search_regime(
            loaded, runner, options, regime, share, on_case, on_wait))


def _one_after_another(options: Options, progress: Progress, search_regime) -> list:
    """`search_regime(regime, deadline, on_case, on_wait)` for each regime in turn, each given
    its share of the budget left."""
    deadline = None if options.budget_s is None else time.monotonic() + options.budget_s
    results = []
    for index, regime in enumerate(options.regimes):
        share = budget_share(deadline, len(options.regimes) - index)
        results.append(search_regime(
            regime, share, lambda r, regime=regime: progress.case(regime, r),
            lambda rank, seconds, phase, regime=regime: progress.waiting(
                regime, rank, seconds, options.timeout, phase)))
        progress.finished(assemble.summary(results[-1]))
    return results


def default_jobs(backend: str, runner=None) -> int:
    """Driver processes by default on the threads backend: one per two cores, since a driver
    and its worker, with cases streamed in batches, keep two cores busy (measured on 2 cores:
    the default run took 10.1 s with one driver and 10.5-10.8 s with two). A process backend's
    pools, or a runner given, are driven by this process alone."""
    return max(1, (os.cpu_count() or 1) // 2) if backend == "threads" and runner is None else 1


def _search_regime(target, runner, options: Options, regime: str, deadline, on_case,
                   on_wait=None) -> RegimeResult:
    if regime == SHARDED and not target.accepts_shard:  # its era has no decode sharding
        return RegimeResult(regime, not_applicable=NO_SHARD_FLAG)
    if options.scope is not None:
        return exhaust(target, regime, runner, scopes.parse_scope(options.scope),
                       deadline=deadline, on_case=on_case, on_wait=on_wait)
    return search(target, regime, runner, max_examples=options.max_examples,
                  max_ranks=options.max_ranks, derandomize=options.seed is None, seed=options.seed,
                  pcp_sizes=options.world_sizes, deadline=deadline, on_case=on_case,
                  on_wait=on_wait)


def _search_in_drivers(source: str, options: Options, jobs: int, progress: Progress):
    """The regimes searched by `jobs` driver processes at once (pcpcheck.jobs); progress lines
    in regime order, each when it and every regime before it are done."""
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


# --- a vLLM release ------------------------------------------------------------------------------

def check_release(source, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_RELEASE_EXAMPLES,
                  max_ranks: int = 8, seed: int | None = None, budget_s: float | None = None,
                  timeout: float = 10.0, empty_steps: bool = False,
                  baseline: str | os.PathLike | None = None,
                  progress: Progress | None = None, exhaustive: bool = False,
                  scope=None) -> CheckResult:
    """Check a vLLM release's own PCP path (`pcpcheck vllm SOURCE`): its PCPManager's layout
    (LAYOUT) and its gather and wrappers on every rank, per regime it can reach.

    source: a release ('0.33.0', 'vllm==0.33.0'; fetched with pip into the wheel cache), a wheel,
    a checkout, or 'installed'. The release is read and fetched here, but loaded and run only in
    the backend's worker process. baseline: known violations, as for `check`; exhaustive,
    scope: as `check`'s (each step in the release's batch order, each distinct one once).
    Raises UsageError, SourceError, InterfaceDrift (LoadError's), WorkerError.
    """
    from pcpcheck.vllm.source import resolve
    from pcpcheck.vllm.verdict import counterexample, replay_command, search_regime
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(tuple(dict.fromkeys(regimes)), max_examples, max_ranks, seed, budget_s,
                      "threads", None, "cpu", timeout, None,
                      None if baseline is None else os.fspath(baseline), empty_steps,
                      exhaustive_scope(exhaustive, scope))
    validate(options)
    known = load_baseline(options.baseline) if options.baseline else Baseline(options.baseline, ())
    bounds = None if options.scope is None else scopes.parse_scope(options.scope)
    spec = resolve(os.fspath(source)).spec()  # finds or fetches the files; executes nothing
    progress = progress or Progress()
    with make_runner("threads", timeout=timeout, world_sizes=None, device="cpu") as backend:
        release = load_release(backend, spec)
        progress.started(release, options)
        results = _one_after_another(
            options, progress, lambda regime, share, on_case, on_wait: search_regime(
                release, regime, backend, max_examples=max_examples, max_ranks=max_ranks,
                seed=seed, empty_steps=empty_steps, deadline=share, on_case=on_case,
                on_wait=on_wait, scope=bounds))
    return assemble.result(spec["location"], release, options, results, known,
                           describe=lambda regime, observation, replays: (
                               replay_command(release, observation),
                               counterexample(release, regime, observation, replays)),
                           release=release_record(release))


def load_release(backend, spec: dict):
    """The release loaded in the backend's worker: its ReleaseInfo (plain data)."""
    return backend.load(json.dumps(spec, sort_keys=True), RELEASE)


def release_record(release) -> ReleaseRecord:
    info = release.release
    return ReleaseRecord(info["release"], info["source"]["kind"], info["source"]["location"],
                         tuple(info["files"].items()), tuple(info["adapted"]),
                         info["caps"]["era"], dict(info["caps"]),
                         tuple(PathStage(**stage) for stage in info.get("paths") or ()))


def check_steps(source, steps, *, timeout: float = 10.0, shrink: bool = True):
    """Recorded steps of a live vLLM (a recording file or directory, docs/record.md) replayed
    through a release's path (`pcpcheck vllm SOURCE --steps`): every invariant judged on each
    step, and each rank's recorded slot map and num_decode_tokens compared with what the release
    computes; a violated step shrunk (shrink=True). Returns a pcpcheck.vllm.steps.StepsResult.
    Raises UsageError (a malformed line, naming FILE:LINE) before anything runs, and the errors
    of check_release."""
    from pcpcheck.vllm.source import resolve
    from pcpcheck.vllm.steps import (StepsResult, outputs_hashed, read_recording,
                                     recording_files, replay_steps)
    files = [str(f) for f in recording_files(steps)]
    recorded = read_recording(steps)
    spec = resolve(os.fspath(source)).spec()
    with make_runner("threads", timeout=timeout, world_sizes=None, device="cpu") as backend:
        release = load_release(backend, spec)
        findings, judged = replay_steps(release, recorded, backend, shrink=shrink)
    version = release.release["release"]
    return StepsResult(f"vLLM {version} ({spec['location']})", spec["location"], version, files,
                       len(recorded), judged, findings, outputs_hashed(recorded))


# --- one case -----------------------------------------------------------------------------------

def replay_case(target, case, *, function: str | None = None, backend: str = "threads",
                timeout: float = 10.0, device: str = "cpu", runner=None) -> CheckResult:
    """One case (a Case, or its JSON as a counterexample prints it) run once on the target and
    judged: a CheckResult of one regime and one case, with its counterexample if it fails
    (`pcpcheck check --replay`). runner: an already started backend (torchrun's rank 0)."""
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
    options = Options((case.batch.regime,), 1, case.batch.pcp_size, None, None, backend, None,
                      device, timeout, function, None)
    return _one_case(source, loaded, observation, options)


def replay(target, case_json: str, function: str | None = None,
           timeout: float = 10.0) -> Verdict:
    """Judge one case (JSON as printed by pcpcheck) against a target (run in a worker): what a
    reproducer asks."""
    result = replay_case(target, case_json, function=function, timeout=timeout)
    if result.holds:
        return Verdict(True, (), "")
    shown = result.counterexamples[0]
    return Verdict(False, tuple(v.invariant for v in shown.violations), shown.report)


def replay_release(source, case, *, timeout: float = 10.0) -> CheckResult:
    """One step (a Case, or its JSON) through a vLLM release's path on every rank, judged
    (`pcpcheck vllm SOURCE --replay`)."""
    from pcpcheck.vllm.source import resolve
    from pcpcheck.vllm.judge import observe_release_case
    from pcpcheck.vllm.verdict import counterexample, replay_command
    if isinstance(case, str):
        case = read_case(case)
    spec = resolve(os.fspath(source)).spec()
    with make_runner("threads", timeout=timeout, world_sizes=None, device="cpu") as backend:
        release = load_release(backend, spec)
        observation = observe_release_case(case, release, backend)
    options = Options((case.batch.regime,), 1, case.batch.pcp_size, None, None, "threads", None,
                      "cpu", timeout, None, None)
    return _one_case(spec["location"], release, observation, options,
                     describe=lambda regime, observation, replays: (
                         replay_command(release, observation),
                         counterexample(release, regime, observation)),
                     release=release_record(release))


def _one_case(source: str, target, observation, options: Options, describe=None,
              release: ReleaseRecord | None = None) -> CheckResult:
    from collections import Counter
    regime = observation.prepared.case.batch.regime
    result = RegimeResult(regime, cases=1, checked=Counter(observation.checked),
                          violated=Counter(v.invariant for v in observation.violations))
    count_coverage(result, observation)
    if observation.violations:
        result.counterexamples, result.replays = [observation], [Replays(1, 1)]
    return assemble.result(source, target, options, [result], Baseline(None, ()), describe, release)


# --- diff -----------------------------------------------------------------------------------------

def diff(old, new, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_MAX_EXAMPLES,
         max_ranks: int = 8, seed: int | None = None, function: str | None = None,
         timeout: float = 10.0, on_regime=None) -> DiffResult:
    """Run two versions on the same drawn cases: per regime, the smallest case where their
    per-rank outcomes differ (the search of `check`, with a difference as its finding).
    `on_regime(RegimeDiff)` as each regime ends. A regime one of them cannot reach (its era has
    no decode sharding) is not applicable, as `check` reports it."""
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(tuple(dict.fromkeys(regimes)), max_examples, max_ranks, seed, None,
                      "threads", None, "cpu", timeout, function, None)
    validate(options)
    old_source, new_source = resolve_target(old), resolve_target(new)
    found = []
    with make_runner("threads", timeout=timeout, world_sizes=None, device="cpu") as runner:
        targets = (runner.load(old_source, function), runner.load(new_source, function))
        for regime in options.regimes:
            lacking = [f"{side} ({t.source})" for side, t in zip(("old", "new"), targets)
                       if regime == SHARDED and not t.accepts_shard]
            if lacking:
                result = RegimeDiff(regime, 0, None, "", f"{', '.join(lacking)}: {NO_SHARD_FLAG}")
            else:
                searched = search(targets, regime, runner, max_examples=max_examples,
                                  max_ranks=max_ranks, derandomize=seed is None, seed=seed,
                                  run_many=run_pairs)
                pairs = [o for o in searched.counterexamples if o.violations[0].invariant == DIFFERENT]
                result = RegimeDiff(regime, searched.cases, None, "") if not pairs else RegimeDiff(
                    regime, searched.cases, pairs[0].prepared.case.to_json(),
                    report.difference(pairs[0], regime, targets[0].source, targets[1].source))
            found.append(result)
            if on_regime is not None:
                on_regime(result)
    return DiffResult(version(), old_source, new_source, options, tuple(found))


__all__ = ["check", "check_release", "check_steps", "diff", "replay", "replay_case",
           "replay_release", "CheckResult", "Counterexample", "DiffResult", "RegimeDiff",
           "RegimeSummary", "ReleaseRecord", "Options", "Verdict", "Progress", "UsageError", "LoadError",
           "SourceError", "InterfaceDrift", "CheckerError", "WorkerError", "version"]
