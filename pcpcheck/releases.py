"""The API of a vLLM release (`pcpcheck vllm SOURCE`; pcpcheck.api exports each function): check
its own PCP path in every regime it can reach, replay one step, replay steps recorded from a live
vLLM. The release is read and fetched in this process, loaded and run only in a backend's worker."""

from __future__ import annotations

import json
import os

from pcpcheck import assemble
from pcpcheck import scope as scopes
from pcpcheck.baseline import Baseline, load_baseline
from pcpcheck.results import DEFAULT_RELEASE_EXAMPLES, CheckResult, Options, PathStage, ReleaseRecord
from pcpcheck.runs import (Progress, exhaustive_scope, make_runner, one_after_another, one_case,
                           read_case, validate)
from pcpcheck.shared.messages import RELEASE
from pcpcheck_spec.names import DEFAULT_REGIMES


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
        results = one_after_another(
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
    return one_case(spec["location"], release, observation, options,
                     describe=lambda regime, observation, replays: (
                         replay_command(release, observation),
                         counterexample(release, regime, observation)),
                     release=release_record(release))
