"""The exhaustive search of one regime: every step within a scope (pcpcheck.search.scope), each
once, in order of size, streamed through the same run_many as the random search (several in
flight).

No shrinking: steps come smallest first, so the first step that violates an invariant is a
smallest one. Once one has, the steps of its size (P, requests, tokens: reduce.size's order) are
finished, so each invariant first violated at that size has its smallest step too, and the
search stops there, as TLC stops at its first violation; otherwise it runs the whole scope.
"""

from __future__ import annotations

import time

from pcpcheck.judge.run import run_cases
from pcpcheck.search import scope as scopes
from pcpcheck.search import shard as shards
from pcpcheck.search.engine import RegimeResult, Search, priority, uncited

NOTE = ("none needed: exhaustive search, the first violating step in order of size (P, requests, "
        "tokens): no step of the scope smaller than it violates an invariant")


def _level(case) -> tuple[int, int, int]:
    batch = case.batch
    return batch.pcp_size, len(batch.requests), sum(r.num_tokens for r in batch.requests)


def _steps(scope: scopes.Scope, regime: str, transform):
    """The scope's steps, each mapped by `transform` (a release's batch order: None drops a step
    it never runs), each distinct one once."""
    if transform is None:
        yield from scopes.steps(scope, regime)
        return
    seen = set()
    for case in scopes.steps(scope, regime):
        case = transform(case)
        if case is not None and case not in seen:
            seen.add(case)
            yield case


def exhaust(target, regime: str, runner, scope: scopes.Scope, *, deadline: float | None = None,
            on_case=None, on_wait=None, run_many=run_cases, transform=None,
            shard: shards.Shard | None = None) -> RegimeResult:
    """Check `target` on every step of `regime` within `scope` (engine.search's arguments, less
    the drawing ones; a `transform` that reorders requests keeps each step's size). The result's
    `scope_steps` is how many steps the scope holds, its `cases` how many ran: fewer when a
    violation or the deadline stopped it. The steps run are always a prefix of the order, so
    the first step met violating an invariant is the smallest that does. `shard` (K, N): the
    part's steps alone, every N-th from the K-th (pcpcheck.search.shard), and scope_steps the
    part's count."""
    run = Search(target=target, regime=regime, runner=runner, max_examples=0,
                 max_ranks=max(scope.pcp_sizes), pcp_sizes=tuple(scope.pcp_sizes),
                 deadline=deadline, on_case=on_case, transform=None, run_many=run_many,
                 on_wait=on_wait)
    result = run.result
    result.scope_steps = shards.share(scopes.count(scope, regime) if transform is None
                                      else sum(1 for _ in _steps(scope, regime, transform)), shard)
    started = time.perf_counter()
    stop_after: list = []  # the size level of the first violation, once met
    smallest: dict = {}  # first invariant -> the first step (in order of size) reported under it
    witness: dict = {}  # invariant -> the first step violating it at all
    out_of_time = False

    def stream():
        for case in shards.take(_steps(scope, regime, transform), shard):
            if out_of_time or (stop_after and _level(case) != stop_after[0]):
                return
            yield case

    with run.watching(runner):
        count = 0
        for observation in run_many(stream(), target, runner):
            count += 1
            run.phase = f"exhaustive, step {count + 1}"
            first = run.record(observation)
            if first is not None:
                if not stop_after:
                    stop_after.append(_level(observation.prepared.case))
                smallest.setdefault(first, observation)  # the first met is the smallest
                for violation in observation.violations:
                    witness.setdefault(violation.invariant, observation)
            if observation.costly:
                break
            if deadline is not None and time.monotonic() >= deadline:
                out_of_time = result.budget_reached = True
        result.check_seconds = result.seconds = time.perf_counter() - started
        result.counterexamples = sorted(smallest.values(), key=priority)
        for observation in result.counterexamples:
            observation.note = NOTE
        result.counterexamples += uncited(result.counterexamples, witness)
        result.replays = [run.replays(o) for o in result.counterexamples]
    return result
