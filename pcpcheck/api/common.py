"""What every API call (pcpcheck.api, pcpcheck.api.release) sets up and shares: a case or target
given from outside checked, options in range, a backend started, the regimes searched one after
another under one budget, and one case's result."""

from __future__ import annotations

import importlib
import os
import time
from collections import Counter

from pcpcheck.api import assemble
from pcpcheck.backends import BACKENDS, make_backend
from pcpcheck.judge.baseline import Baseline
from pcpcheck.search import scope as scopes
from pcpcheck.search import shard as shards
from pcpcheck.search.draw import parse_case
from pcpcheck.search.engine import RegimeResult, count_coverage
from pcpcheck.search.jobs import budget_share
from pcpcheck.search.minimize import Replays
from pcpcheck.shared.case import Case
from pcpcheck.shared.defaults import DEFAULT_BACKEND, MAX_RANKS, MIN_RANKS
from pcpcheck.shared.errors import UsageError
from pcpcheck.shared.results import CheckResult, Options, RegimeSummary, ReleaseRecord
from pcpcheck_spec.names import REGIMES


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
    if not MIN_RANKS <= options.max_ranks <= MAX_RANKS:
        raise UsageError(f"--max-ranks must be between {MIN_RANKS} and {MAX_RANKS}, got {options.max_ranks}")
    if not 0 < options.timeout < float("inf"):  # nan fails both comparisons
        raise UsageError(f"--timeout must be positive and finite (seconds), got {options.timeout}")
    if options.budget_s is not None and options.budget_s <= 0:
        raise UsageError(f"--budget must be positive seconds, got {options.budget_s}")
    if options.backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {options.backend!r}")
    if options.world_sizes and not all(MIN_RANKS <= p <= MAX_RANKS for p in options.world_sizes):
        raise UsageError(f"every world size must be between {MIN_RANKS} and {MAX_RANKS}: "
                         f"{list(options.world_sizes)}")


def read_shard(shard) -> shards.Shard | None:
    """--shard's value ('K/N' or (K, N)) checked: UsageError unless 1 <= K <= N."""
    if shard is None:
        return None
    try:
        return shards.parse_shard(shard if isinstance(shard, str) else "/".join(map(str, shard)))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def exhaustive_scope(exhaustive: bool, scope, backend: str = DEFAULT_BACKEND, world_sizes=None,
                     default: scopes.Scope = scopes.DEFAULT_SCOPE):
    """Options.scope: the scope's KEY=VALUE text when exhaustive (unnamed keys: `default`'s),
    else None (UsageError for a scope without --exhaustive, a malformed one, or ranks a process
    backend does not pool)."""
    if not exhaustive:
        if scope is not None:
            raise UsageError("--scope bounds an exhaustive check: add --exhaustive")
        return None
    if scope is None:
        scope = default
    elif isinstance(scope, str):
        try:
            scope = scopes.parse_scope(scope, default)
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
    return (2, 4) if backend == "gloo" else tuple(sorted({MIN_RANKS, min(gpus, MAX_RANKS)}))


def make_runner(backend: str, *, timeout: float, world_sizes, device: str, start: bool = True):
    """The backend (pcpcheck.backends), its process pools started unless start=False (a replay)."""
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():  # else every case fails in the worker, as if the target
            why = "it is built without CUDA" if torch.version.cuda is None else "it finds no GPU"
            raise UsageError(f"--device cuda: torch {torch.__version__} cannot use a GPU here "
                             f"({why}); run on a machine with one, or leave --device at cpu")
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



def one_after_another(options: Options, progress: Progress, search_regime) -> list:
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


def one_case(source: str, target, observation, options: Options, describe=None,
              release: ReleaseRecord | None = None) -> CheckResult:
    regime = observation.prepared.case.batch.regime
    result = RegimeResult(regime=regime, cases=1, checked=Counter(observation.checked),
                          violated=Counter(v.invariant for v in observation.violations))
    count_coverage(result, observation)
    if observation.violations:
        result.counterexamples, result.replays = [observation], [Replays(1, 1)]
    return assemble.result(source, target, options, [result], Baseline(None, ()), describe, release)
