"""The API of a vLLM release (`pcpcheck vllm SOURCE`; pcpcheck.api exports each function): check
its own PCP path in every regime it can reach, replay one step, replay steps recorded from a live
vLLM. The release is read and fetched in this process, loaded and run only in a backend's worker."""

from __future__ import annotations

import json
import os

from pcpcheck.api import assemble
from pcpcheck.api.common import (
    Progress,
    exhaustive_scope,
    make_runner,
    one_after_another,
    one_case,
    read_case,
    read_shard,
    validate,
)
from pcpcheck.judge.baseline import Baseline, load_baseline
from pcpcheck.search import scope as scopes
from pcpcheck.shared.changed import CHANGED_LINES, Changes
from pcpcheck.shared.defaults import DEFAULT_MAX_RANKS, DEFAULT_RELEASE_EXAMPLES, DEFAULT_TIMEOUT
from pcpcheck.shared.protocol import RELEASE, LinesRun
from pcpcheck.shared.results import CheckResult, FileLines, Options, PathStage, ReleaseRecord
from pcpcheck_spec.names import DEFAULT_REGIMES


def check_release(source, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_RELEASE_EXAMPLES,
                  max_ranks: int = DEFAULT_MAX_RANKS, seed: int | None = None, budget_s: float | None = None,
                  timeout: float = DEFAULT_TIMEOUT, empty_steps: bool = False,
                  baseline: str | os.PathLike | None = None,
                  progress: Progress | None = None, exhaustive: bool = False,
                  scope=None, shard=None, changed_against: str | None = None) -> CheckResult:
    """Check a vLLM release's own PCP path (`pcpcheck vllm SOURCE`): its PCPManager's layout
    (LAYOUT) and its gather and wrappers on every rank, per regime it can reach.

    source: a release ('0.33.0', 'vllm==0.33.0'; fetched with pip into the wheel cache), a wheel,
    a checkout, or 'installed'. The release is read and fetched here, but loaded and run only in
    the backend's worker process. baseline: known violations, as for `check`; exhaustive,
    scope: as `check`'s (each step in the release's batch order, each distinct one once);
    shard: as `check`'s. changed_against: BASE, a git revision of the checkout or a second tree
    (pcpcheck.api.changed_against): the record's `changes` says which changed lines ran.
    Raises UsageError, SourceError, InterfaceDrift (LoadError's), WorkerError.
    """
    from pcpcheck.judge.explain import release_counterexample as counterexample
    from pcpcheck.judge.explain import release_replay_command as replay_command
    from pcpcheck.search.release_search import search_regime
    from pcpcheck.shared.source import resolve
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(regimes=tuple(dict.fromkeys(regimes)), max_examples=max_examples,
                      max_ranks=max_ranks, seed=seed, budget_s=budget_s, timeout=timeout,
                      baseline=None if baseline is None else os.fspath(baseline),
                      empty_steps=empty_steps,
                      scope=exhaustive_scope(exhaustive, scope,
                                             default=scopes.RELEASE_DEFAULT_SCOPE),
                      shard=read_shard(shard))
    validate(options)
    known = load_baseline(options.baseline) if options.baseline else Baseline(options.baseline, ())
    bounds = None if options.scope is None else scopes.parse_scope(options.scope)
    tree = resolve(os.fspath(source))  # finds or fetches the files; executes nothing
    spec = tree.spec()
    changes = None
    if changed_against is not None:  # a bad BASE stops here, before anything runs
        from pcpcheck.api.changed_against import changes_against
        changes = changes_against(tree, changed_against)
    progress = progress or Progress()
    with release_runner(timeout) as backend:
        release = release_info(backend, spec)
        if changes is not None:
            release, changes = _watching(backend, release, spec, tree, changes)
        progress.started(release, options)
        results = one_after_another(
            options, progress, lambda regime, share, on_case, on_wait: search_regime(
                release, regime, backend, max_examples=max_examples, max_ranks=max_ranks,
                seed=seed, empty_steps=empty_steps, deadline=share, on_case=on_case,
                on_wait=on_wait, scope=bounds, shard=options.shard))
    return assemble.result(spec["location"], release, options, results, known,
                           describe=lambda regime, observation, replays: (
                               replay_command(release, observation),
                               counterexample(release, regime, observation, replays)),
                           release=release_record(release, backend.lines_run, changes))


def release_runner(timeout: float):
    """The backend a release runs in: its own threads in one worker, on the CPU (pcpcheck's
    deployment model stands in for the GPU)."""
    return make_runner("threads", timeout=timeout, world_sizes=None, device="cpu")


def release_info(backend, spec: dict):
    """The release loaded in the backend's worker: its ReleaseInfo (plain data)."""
    return backend.load(json.dumps(spec, sort_keys=True), RELEASE)


def _watching(backend, release, spec: dict, tree, changes: Changes):
    """(the release as its steps run it, `changes` located in its path's files): where the path's
    files changed, the release loaded again with their changed lines, for the worker's line
    recorder to trace every step until each has run (its modules are the worker's, loaded
    once); only now are the path's files known."""
    from pcpcheck.api.changed_against import locate
    path = release.release.get("functions") or {}
    changes = locate(changes, tree, path)
    watch = changes.watch(path)
    return (release_info(backend, {**spec, CHANGED_LINES: watch}) if watch else release), changes


def release_record(release, lines_run: LinesRun | None = None,
                   changes: Changes | None = None) -> ReleaseRecord:
    """The record of a release loaded (its ReleaseInfo), with the lines of its path's functions
    that the run's steps ran (`lines_run`, as the backend merged its workers' reports) and the
    lines a change touched (`changes`)."""
    info = release.release
    lines_run = lines_run or LinesRun()
    lines = tuple(FileLines(file=relpath, functions=tuple(functions),
                            run=tuple(sorted(lines_run.run.get(relpath, set()) & set(functions))))
                  for relpath, functions in (info.get("functions") or {}).items())
    return ReleaseRecord(release=info["release"], kind=info["source"]["kind"],
                         location=info["source"]["location"], files=tuple(info["files"].items()),
                         adapted=tuple(info["adapted"]), layout_model=info["caps"]["era"],
                         capabilities=dict(info["caps"]),
                         paths=tuple(PathStage(**stage) for stage in info.get("paths") or ()),
                         lines=lines, lines_steps=lines_run.steps,
                         lines_traced=lines_run.traced, changes=changes)


def check_steps(source, steps, *, timeout: float = DEFAULT_TIMEOUT, shrink: bool = True):
    """Recorded steps of a live vLLM (a recording file or directory, docs/record.md) replayed
    through a release's path (`pcpcheck vllm SOURCE --steps`): every invariant judged on each
    step, and each rank's recorded slot map and num_decode_tokens compared with what the release
    computes; a violated step shrunk (shrink=True). Returns a
    pcpcheck.search.step_replay.StepsResult. Raises UsageError (a malformed line, naming
    FILE:LINE) before anything runs, and the errors of check_release."""
    from pcpcheck.search.step_replay import (
        StepsResult,
        outputs_hashed,
        read_recording,
        recording_files,
        replay_steps,
    )
    from pcpcheck.shared.source import resolve
    files = [str(f) for f in recording_files(steps)]
    recorded = read_recording(steps)
    spec = resolve(os.fspath(source)).spec()
    with release_runner(timeout) as backend:
        release = release_info(backend, spec)
        findings, judged = replay_steps(release, recorded, backend, shrink=shrink)
    version = release.release["release"]
    return StepsResult(target_name=f"vLLM {version} ({spec['location']})", source=spec["location"],
                       release=version, files=files, steps=len(recorded), judged=judged,
                       findings=findings, outputs_hashed=outputs_hashed(recorded))


def replay_release(source, case, *, timeout: float = DEFAULT_TIMEOUT) -> CheckResult:
    """One step (a Case, or its JSON) through a vLLM release's path on every rank, judged
    (`pcpcheck vllm SOURCE --replay`)."""
    from pcpcheck.judge.explain import release_counterexample as counterexample
    from pcpcheck.judge.explain import release_replay_command as replay_command
    from pcpcheck.judge.release_case import observe_release_case
    from pcpcheck.shared.source import resolve
    if isinstance(case, str):
        case = read_case(case)
    spec = resolve(os.fspath(source)).spec()
    with release_runner(timeout) as backend:
        release = release_info(backend, spec)
        observation = observe_release_case(case, release, backend)
        record = release_record(release, backend.lines_run)
    options = Options(regimes=(case.batch.regime,), max_examples=1, max_ranks=case.batch.pcp_size,
                      timeout=timeout)
    return one_case(spec["location"], release, observation, options,
                     describe=lambda regime, observation, replays: (
                         replay_command(release, observation),
                         counterexample(release, regime, observation)),
                     release=record)
