"""The invariant registry: every ID of SPEC.md with its predicate, scope and regimes.

The judge (pcpcheck.judge.verdict.judge), the verdict table and the SPEC-ID tests iterate
REGISTRY; its order is the reporting priority (a case is reported under the first ID it
violates). Adding an invariant is one entry here, one predicate in spec/invariants.py and one
section in SPEC.md.

An entry reads its predicate's arguments from an index-level observation of one case (`Step`):
plain data, the fields SPEC.md's "What is observable" lists.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import invariants as inv
from .names import (
    ASYNC_FALLBACK,
    ASYNC_INPUT,
    ASYNC_LIFETIME,
    ASYNC_READ,
    COLLECTIVE,
    DCP,
    LAYOUT,
    LENGTH,
    NO_MUTATION,
    PAD_HYGIENE,
    PAIRING,
    REGIMES,
    REPLICA,
    RETURNS,
    SHARD,
    SHARDED,
    UNIQUE,
)

# Scopes: what one evaluation of the predicate covers.
PER_RANK = "per rank"  # once per rank: (step, rank)
PER_TENSOR = "per tensor"  # once per rank and returned tensor: (step, rank, tensor)
GLOBAL = "global"  # once per case: (step,)
GLOBAL_PER_TENSOR = "global per tensor"  # once per tensor over every rank: (step, tensor)
PER_MANAGER = "per rank's manager"  # once per rank's PCPManager: (expected view, its view)

# Checkers: which command evaluates an ID. A gather alone has no layout: LAYOUT needs a release's
# own PCPManager, which only `pcpcheck vllm` runs; every gather ID is judged by both.
GATHER = "pcpcheck check"
RELEASE = "pcpcheck vllm"
# The asynchronous protocol beside a gather: evaluated on the ranks that ran it (their view has a
# stream trace), by `pcpcheck check --async`.
ASYNC = "pcpcheck check --async"


@dataclass
class Step:
    """One case at the index level. ranks[r] has: error (str | None), returned (bool), rows (per
    tensor, labels), slots, caches (per tensor, slot -> label), trace, inputs_before/after.
    expected[r]: slot -> token rank r must hold; tokens: every real token id. A rank that ran
    an asynchronous protocol also has streams (its stream trace, spec/streams.py), and
    readers[r] says what its readers read: reader index -> slots."""

    ranks: list[Any]
    expected: list[dict[int, int]]
    tokens: list[int]
    num_tensors: int
    readers: list[dict[int, list[int]]] = field(default_factory=list)


def _caches(step: Step, tensor: int) -> list[dict[int, int]]:
    return [view.caches[tensor] for view in step.ranks]


def _cache_differs(step: Step, tensor: int) -> list[int]:
    return [r for r, cache in enumerate(_caches(step, tensor)) if cache != step.expected[r]]


def _trace_differs(step: Step) -> list[int]:
    """The ranks whose trace differs from the majority's or never completed."""
    traces = [view.trace for view in step.ranks]
    common = max(traces, key=traces.count)
    return [r for r, trace in enumerate(traces)
            if trace != common or any(entry[0] == inv.INCOMPLETE for entry in trace)]


@dataclass(frozen=True)
class Invariant:
    id: str
    predicate: Callable[..., bool]
    scope: str
    regimes: tuple[str, ...]
    arguments: Callable[..., tuple[Any, ...]]  # (step, *unit) -> the predicate's arguments
    needs_output: bool = False  # evaluated only on ranks whose call returned well-formed outputs
    blame: Callable[..., list[int]] | None = None  # global scopes: the ranks at fault
    checkers: tuple[str, ...] = (GATHER, RELEASE)


_D1 = tuple(regime for regime in REGIMES if regime != DCP)  # every rank holds a full replica

REGISTRY: tuple[Invariant, ...] = (
    # Judged in the driver of `pcpcheck vllm` on each rank's manager view
    # (pcpcheck.judge.release_case), not by `evaluate`: the Step of a gather call has no layout.
    # Drafts use no manager: a draft step's is the map its release's draft path computes.
    Invariant(LAYOUT, inv.layout_conformance, PER_MANAGER, REGIMES,
              lambda expected, actual: (expected, actual), checkers=(RELEASE,)),
    Invariant(RETURNS, inv.returns, PER_RANK, REGIMES,
              lambda step, r: ([step.ranks[r].error],)),
    Invariant(COLLECTIVE, inv.collective_agreement, GLOBAL, REGIMES,
              lambda step: ([view.trace for view in step.ranks],), blame=_trace_differs),
    Invariant(NO_MUTATION, inv.no_input_mutation, PER_RANK, REGIMES,
              lambda step, r: (step.ranks[r].inputs_before, step.ranks[r].inputs_after)),
    Invariant(LENGTH, inv.length_agreement, PER_RANK, REGIMES,
              lambda step, r: (step.ranks[r].rows, step.ranks[r].slots), needs_output=True),
    Invariant(UNIQUE, inv.uniqueness, PER_RANK, REGIMES,
              lambda step, r: (step.ranks[r].slots,), needs_output=True),
    Invariant(PAD_HYGIENE, inv.pad_hygiene, PER_TENSOR, REGIMES,
              lambda step, r, k: (step.ranks[r].rows[k], step.ranks[r].slots), needs_output=True),
    Invariant(PAIRING, inv.pairing, PER_TENSOR, REGIMES,
              lambda step, r, k: (step.expected[r], step.ranks[r].rows[k], step.ranks[r].slots),
              needs_output=True),
    Invariant(REPLICA, inv.replica, GLOBAL_PER_TENSOR, _D1,
              lambda step, k: (step.expected[0], _caches(step, k)), blame=_cache_differs),
    Invariant(SHARD, inv.shard, GLOBAL_PER_TENSOR, (DCP,),
              lambda step, k: (step.expected, _caches(step, k), step.tokens), blame=_cache_differs),
    # An asynchronous protocol runs where decodes are sharded (`pcpcheck check --async`); a
    # gather whose file uses the stream API has its inputs' order judged in every regime (the
    # slots it returns the caller writes and reads on its own stream). The judge names what each
    # reader reads (Step.readers).
    Invariant(ASYNC_FALLBACK, inv.async_fallback, PER_RANK, (SHARDED,),
              lambda step, r: (step.ranks[r].streams,), checkers=(ASYNC,)),
    Invariant(ASYNC_INPUT, inv.async_inputs_ordered, PER_RANK, REGIMES,
              lambda step, r: (step.ranks[r].streams,), checkers=(ASYNC,)),
    Invariant(ASYNC_READ, inv.async_reads_ordered, PER_RANK, (SHARDED,),
              lambda step, r: (step.ranks[r].streams, step.readers[r]), checkers=(ASYNC,)),
    Invariant(ASYNC_LIFETIME, inv.async_inputs_kept, PER_RANK, REGIMES,
              lambda step, r: (step.ranks[r].streams,), checkers=(ASYNC,)),
)

IDS = tuple(entry.id for entry in REGISTRY)
BY_ID = {entry.id: entry for entry in REGISTRY}
GATHER_IDS = tuple(entry.id for entry in REGISTRY if GATHER in entry.checkers)
RELEASE_IDS = tuple(entry.id for entry in REGISTRY if RELEASE in entry.checkers)
ASYNC_IDS = tuple(entry.id for entry in REGISTRY if ASYNC in entry.checkers)


def applicable(regime: str, checker: str = GATHER) -> tuple[Invariant, ...]:
    """The entries a checker evaluates in a regime, in priority order."""
    return tuple(entry for entry in REGISTRY if regime in entry.regimes and checker in entry.checkers)


def pairs(checker: str | None = None) -> list[tuple[str, str]]:
    """Every (ID, regime) where the ID applies (for one checker, or any): each needs a trigger
    that makes it fire."""
    return [(entry.id, regime) for entry in REGISTRY for regime in entry.regimes
            if checker is None or checker in entry.checkers]


def evaluate(step: Step, regime: str) -> tuple[dict[str, list[int]], tuple[str, ...]]:
    """Run every applicable predicate on the step: (ID -> ranks violating it, IDs that ran).
    Predicates are pure: a unit whose arguments equal an earlier unit's (ranks and tensors often
    return the same rows) reuses that verdict instead of running the predicate again."""
    failed: dict[str, set[int]] = {}
    ran: list[str] = []
    every = range(len(step.ranks))
    returned = [r for r in every if step.ranks[r].returned]
    streaming = [r for r in every if getattr(step.ranks[r], "streams", None) is not None]
    for entry in _applicable_gather(regime) + (_applicable_async(regime) if streaming else ()):
        seen: list[tuple[Any, ...]] = []  # the distinct arguments the predicate ran on, and
        verdicts: list[bool] = []  # its result on each
        units: list[tuple[Any, ...]]  # per rank: (rank, tensor or None); global: () or (tensor,)
        unit: tuple[int, ...]  # what entry.arguments and entry.blame take after the step
        if entry.scope in (PER_RANK, PER_TENSOR):
            tensors = range(step.num_tensors) if entry.scope == PER_TENSOR else (None,)
            ranks = returned if entry.needs_output else every
            units = [(r, k) for r in ranks if ASYNC not in entry.checkers or r in streaming
                     for k in tensors]
            for r, k in units:
                unit = (r,) if k is None else (r, k)
                if not _holds(entry, entry.arguments(step, *unit), seen, verdicts):
                    failed.setdefault(entry.id, set()).add(r)
        else:
            units = [()] if entry.scope == GLOBAL else [(k,) for k in range(step.num_tensors)]
            for unit in units:
                if not _holds(entry, entry.arguments(step, *unit), seen, verdicts):
                    # blame is never None here: every global entry names one
                    failed.setdefault(entry.id, set()).update(entry.blame(step, *unit))  # type: ignore[misc]
        if units:
            ran.append(entry.id)
    return {i: sorted(failed[i]) for i in IDS if i in failed}, tuple(ran)


def _holds(
    entry: Invariant, arguments: tuple[Any, ...], seen: list[tuple[Any, ...]], verdicts: list[bool]
) -> bool:
    """The entry's predicate on these arguments: run, or the verdict on equal ones seen before."""
    if arguments in seen:
        return verdicts[seen.index(arguments)]
    seen.append(arguments)
    verdicts.append(entry.predicate(*arguments))
    return verdicts[-1]


_applicable_gather = functools.lru_cache(maxsize=None)(lambda regime: applicable(regime, GATHER))
_applicable_async = functools.lru_cache(maxsize=None)(lambda regime: applicable(regime, ASYNC))
