"""The API of `pcpcheck diff OLD NEW` where both are vLLM trees (a release, a wheel, a checkout:
what `pcpcheck vllm` takes): `diff_trees` runs the same steps through both whole paths and
compares them stage by stage (pcpcheck.search.tree_search, pcpcheck.judge.tree_compare);
`replay_tree_diff` reruns one step on both. Each tree is read and fetched here, loaded and run
only in a backend's worker of its own: two releases cannot share a process."""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from typing import cast

from pcpcheck.api.common import read_case, validate
from pcpcheck.api.release import release_info, release_runner
from pcpcheck.judge.explain import release_counterexample, release_replay_command
from pcpcheck.judge.tree_compare import (
    COMPARED_STAGES,
    SIDES,
    TreePair,
    difference_report,
    differing_stage,
    differs_at,
    side_by_side,
    tree_replay_command,
)
from pcpcheck.search.engine import RegimeResult
from pcpcheck.search.minimize import Replays
from pcpcheck.search.reduce import size
from pcpcheck.search.tree_search import BackendPair, both_run, run_tree_pairs, search_trees
from pcpcheck.shared.case import describe
from pcpcheck.shared.defaults import DEFAULT_MAX_RANKS, DEFAULT_RELEASE_EXAMPLES, DEFAULT_TIMEOUT
from pcpcheck.shared.errors import UsageError
from pcpcheck.shared.results import (
    DifferingStep,
    Options,
    RegimeTreeDiff,
    SideViolation,
    StageRank,
    TreeDiffResult,
    version,
)
from pcpcheck.shared.source import Source, names_a_tree, resolve
from pcpcheck_spec.names import DEFAULT_REGIMES
from pcpcheck_spec.registry import IDS


def diffs_trees(old, new) -> bool:
    """Whether `pcpcheck diff OLD NEW` compares two vLLM trees (else two gather targets);
    UsageError where it is given one of each."""
    trees = [names_a_tree(os.fspath(side)) for side in (old, new)]
    if trees[0] != trees[1]:
        tree, target = (old, new) if trees[0] else (new, old)
        raise UsageError(f"diff compares two vLLM trees or two gather targets: {tree} is a vLLM "
                         f"tree, {target} a gather target")
    return trees[0]


def diff_trees(old, new, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_RELEASE_EXAMPLES,
               max_ranks: int = DEFAULT_MAX_RANKS, seed: int | None = None,
               timeout: float = DEFAULT_TIMEOUT, on_regime=None) -> TreeDiffResult:
    """Run the same drawn steps through two vLLM trees' whole PCP paths, per regime, and
    compare them stage by stage: on how many steps they differ, at which stage first, the
    smallest step per first stage with both sides' values side by side, and each side's own
    violations. `on_regime(RegimeTreeDiff)` as each regime ends. old, new: as
    `check_release`'s source. Raises UsageError, SourceError, InterfaceDrift, WorkerError."""
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(regimes=tuple(dict.fromkeys(regimes)), max_examples=max_examples,
                      max_ranks=max_ranks, seed=seed, timeout=timeout)
    validate(options)
    started = time.monotonic()
    sources = (resolve(os.fspath(old)), resolve(os.fspath(new)))
    given = (os.fspath(old), os.fspath(new))
    found = []
    with _loaded(sources, timeout) as (releases, backends):
        for regime in options.regimes:
            began = time.monotonic()
            searched = search_trees(releases, regime, backends, max_examples=max_examples,
                                    max_ranks=max_ranks, seed=seed)
            found.append(_regime(searched, releases, sources, given,
                                 round(time.monotonic() - began, 3)))
            if on_regime is not None:
                on_regime(found[-1])
    return _result(sources, options, found, time.monotonic() - started)


def replay_tree_diff(old, new, case, *, timeout: float = DEFAULT_TIMEOUT) -> TreeDiffResult:
    """One drawn step (a Case, or its JSON as a difference's replay line gives it) through both
    trees, compared: a TreeDiffResult of one regime and one step."""
    if isinstance(case, str):
        case = read_case(case)
    regime = case.batch.regime
    options = Options(regimes=(regime,), max_examples=1, max_ranks=case.batch.pcp_size,
                      timeout=timeout)
    sources = (resolve(os.fspath(old)), resolve(os.fspath(new)))
    with _loaded(sources, timeout) as (releases, backends):
        if both_run(case, releases) is None:
            raise UsageError(f"--replay: a step one of the trees does not run (its configuration "
                             f"rejects it, or it schedules no token): {case.to_json()}")
        pair = next(run_tree_pairs([case], releases, backends))
        searched = RegimeResult(regime=regime, cases=1,
                                violated=Counter(v.invariant for v in pair.violations))
        if pair.violations:
            searched.counterexamples, searched.replays = [pair], [Replays(1, 1)]
        found = _regime(searched, releases, sources, (os.fspath(old), os.fspath(new)), 0.0)
    return _result(sources, options, [found], 0.0)


@contextlib.contextmanager
def _loaded(sources: tuple[Source, Source], timeout: float):
    """Each tree loaded in a threads backend of its own: (its ReleaseInfos, the BackendPair)."""
    with contextlib.ExitStack() as stack:
        backends = [stack.enter_context(release_runner(timeout)) for _ in sources]
        releases = tuple(release_info(backend, source.spec())
                         for backend, source in zip(backends, sources))
        yield releases, BackendPair(*backends)


def _result(sources, options: Options, regimes: list, seconds: float) -> TreeDiffResult:
    return TreeDiffResult(version=version(), old=sources[0].location, new=sources[1].location,
                          old_release=sources[0].release, new_release=sources[1].release,
                          options=options, regimes=tuple(regimes), seconds=round(seconds, 3))


def _regime(searched: RegimeResult, releases, sources, given, seconds: float) -> RegimeTreeDiff:
    """A regime's search, as the result states it."""
    if searched.not_applicable:
        return RegimeTreeDiff(regime=searched.regime, not_applicable=searched.not_applicable)
    first_stages = tuple((stage, searched.violated[differs_at(stage)])
                         for stage in COMPARED_STAGES if searched.violated[differs_at(stage)])
    violated = []
    for finding, count in searched.violated.items():
        if differing_stage(finding) is None and count:
            side, invariant = finding.split(" ", 1)
            violated.append((side, invariant, count))
    violated.sort(key=lambda v: (SIDES.index(v[0]), IDS.index(v[1]) if v[1] in IDS else len(IDS)))
    names = (sources[0].describe(), sources[1].describe())
    differences, violations = [], []
    pairs = cast("list[TreePair]", searched.counterexamples)  # a tree search's observations
    found = sorted(zip(pairs, searched.replays), key=lambda found: size(found[0].drawn))
    for pair, replays in found:
        first = pair.violations[0].invariant
        if differing_stage(first) is not None:
            differences.append(_differing_step(pair, replays, searched.regime, releases, names,
                                               given))
        else:
            side, invariant = first.split(" ", 1)
            release, observation = releases[SIDES.index(side)], pair.side(side)
            other = pair.side(SIDES[1 - SIDES.index(side)])
            violations.append(SideViolation(
                side=side, invariant=invariant, case=observation.prepared.case.to_json(),
                replay=release_replay_command(release, observation),
                report=release_counterexample(release, searched.regime, observation, replays),
                other_violations=tuple(v.invariant for v in other.violations)))
    return RegimeTreeDiff(regime=searched.regime, steps=searched.cases,
                          differing=sum(count for _, count in first_stages),
                          first_stages=first_stages, violated=tuple(violated),
                          differences=tuple(differences), violations=tuple(violations),
                          seconds=seconds)


def _differing_step(pair: TreePair, replays: Replays, regime: str, releases, names,
                    given) -> DifferingStep:
    stage = pair.stage
    assert stage is not None  # a difference's pair
    replay = tree_replay_command(given[0], given[1], pair.drawn)
    reports = [release_counterexample(release, regime, pair.side(side))
               if pair.side(side).violations else "" for side, release in zip(SIDES, releases)]
    return DifferingStep(
        stage=stage, case=pair.drawn.to_json(), batch=describe(pair.drawn),
        ranks=tuple(StageRank(rank=rank, old=old, new=new)
                    for rank, old, new in side_by_side(pair)),
        old_value=tuple(pair.old_values[stage]), new_value=tuple(pair.new_values[stage]),
        old_violations=tuple(v.invariant for v in pair.old.violations),
        new_violations=tuple(v.invariant for v in pair.new.violations),
        old_report=reports[0], new_report=reports[1], replay=replay,
        report=difference_report(pair, regime, names, replay),
        flaky=(replays.runs, replays.reproduced) if replays.flaky else None)
