"""P ranks in one process, exchanging real tensors: the scheduler of the `threads` backend's
worker (pcpcheck.worker.main) and of trusted in-process tests.

Ranks are greenlets scheduled cooperatively on the calling thread: a rank runs until it enters a
collective or returns, then the next rank runs; when every rank waits in the same collective, it
completes and every rank gets its own copy of the result. Switching greenlets costs about a
microsecond, and the schedule is deterministic, so a case replays identically.

A rank that returns or raises while its peers wait in a collective is detected at once (no rank
can run and not all wait): the waiting ranks are released with `CollectiveAborted`. A rank that
never returns is not this module's business: `on_switch` tells the host which rank runs, and the
host (the driver, from outside the process) stops the process when that rank's time is up.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import torch
from greenlet import greenlet

from pcpcheck.shared.protocol import FINISHED, RUNNING, WAITING
from pcpcheck.worker.rankctx import bound_group
from pcpcheck_spec.names import INCOMPLETE


class CollectiveAborted(RuntimeError):
    """Raised inside a rank whose collective can never complete (a peer left or disagreed)."""


@dataclass(kw_only=True)
class RankOutcome:
    """What one rank's call produced: a value or an error, and the collectives it issued."""

    value: object = None
    error: str | None = None  # the target's own exception, as one line
    error_detail: str | None = None  # its traceback, for reports
    trace: list[tuple] = field(default_factory=list)  # (op, dim, shape, dtype) per collective
    streams: list[tuple] | None = None  # an asynchronous step's stream trace (spec/streams.py)

    def record_error(self, exc: BaseException) -> None:
        """The target raised: keep one line for the verdict and the traceback's tail."""
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - a hostile __str__
            text = ""
        self.error = f"{type(exc).__name__}: {text}".splitlines()[0][:300] if text else type(exc).__name__
        self.error_detail = traceback.format_exc(limit=-6)


class RankGroup:
    """The vLLM-style group a rank sees: world_size, rank_in_group, all_gather(t, dim)."""

    def __init__(self, world: RankWorld, rank: int):
        self._world = world
        self.world_size = world.size
        self.rank_in_group = rank

    def all_gather(self, input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return self._world.all_gather(self.rank_in_group, input_, dim)

    @property
    def trace(self) -> list[tuple]:
        """This rank's collectives so far in the case (where a step's later call begins)."""
        return self._world.trace(self.rank_in_group)


class _Case:
    """Scheduler state of one case."""

    def __init__(self, size: int):
        self.outcomes = [RankOutcome() for _ in range(size)]
        self.pending: dict[int, tuple[int, torch.Tensor]] = {}  # rank -> (dim, tensor) waiting
        self.results: dict[int, torch.Tensor | str] = {}  # str: why the collective failed
        self.returned: list[int] = []  # ranks that returned or raised (not aborted)


class RankWorld:
    """P ranks of one world size, run as greenlets on the calling thread."""

    def __init__(self, size: int):
        self.size = size
        self._case: _Case | None = None
        self._groups = [RankGroup(self, rank) for rank in range(size)]

    def run(self, per_rank_fn, on_switch=None) -> list[RankOutcome]:
        """Run `per_rank_fn(rank)` on every rank; outcomes per rank. `on_switch(rank, state)` is
        called whenever a rank starts or stops running (state: RUNNING, WAITING, FINISHED)."""
        case = self._case = _Case(self.size)
        notify = on_switch or (lambda rank, state: None)
        ranks = [greenlet(self._rank_main) for _ in range(self.size)]
        started = [False] * self.size
        runnable = list(range(self.size))
        while runnable:
            for rank in runnable:
                notify(rank, RUNNING)
                if started[rank]:
                    ranks[rank].switch()
                else:
                    started[rank] = True
                    ranks[rank].switch(rank, per_rank_fn, case)
                notify(rank, WAITING if rank in case.pending else FINISHED)
            runnable = self._progress(case)
        self._case = None
        return case.outcomes

    def _progress(self, case: _Case) -> list[int]:
        """No rank can run: complete the collective all ranks wait in, or abort a deadlock."""
        waiting = sorted(case.pending)
        if not waiting:
            return []
        if len(waiting) == self.size:
            entries = [case.pending[rank] for rank in range(self.size)]
            # Like NCCL's all_gather_into_tensor: every rank passes the same dim, shape and dtype.
            if len({(dim, tuple(t.shape), t.dtype) for dim, t in entries}) != 1:
                failure = "shapes disagree across ranks: " + ", ".join(
                    f"rank {r}: dim {d} {tuple(t.shape)} {t.dtype}" for r, (d, t) in enumerate(entries))
                case.results = {rank: failure for rank in waiting}
            else:
                dim = entries[0][0]
                try:
                    gathered = torch.cat([t for _, t in entries], dim=dim)
                    case.results = {rank: gathered.clone() if rank else gathered for rank in waiting}
                except Exception as exc:  # noqa: BLE001 - a dim torch.cat refuses, on every rank
                    case.results = {rank: f"{type(exc).__name__}: {exc}"[:200] for rank in waiting}
        else:
            reason = f"a peer never joined it (ranks that returned or raised instead: {case.returned})"
            case.results = {rank: reason for rank in waiting}
        case.pending = {}
        return waiting

    def _rank_main(self, rank: int, per_rank_fn, case: _Case) -> None:
        outcome = case.outcomes[rank]
        aborted = False
        try:
            with bound_group(self._groups[rank]):
                outcome.value = per_rank_fn(rank)
        except CollectiveAborted:
            aborted = True  # all_gather already recorded why in the trace
        except BaseException as exc:  # noqa: BLE001 - a target may raise anything, even SystemExit
            outcome.record_error(exc)
        if not aborted:
            case.returned.append(rank)

    def trace(self, rank: int) -> list[tuple]:
        assert self._case is not None  # a rank asks from within its case
        return self._case.outcomes[rank].trace

    def all_gather(self, rank: int, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        case = self._case
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(tensor).__name__}")
        if not isinstance(dim, int):
            raise TypeError(f"all_gather takes an int dim, got {type(dim).__name__}")
        assert case is not None  # a rank calls it from within its case
        case.outcomes[rank].trace.append(("all_gather", dim, tuple(tensor.shape), str(tensor.dtype)))
        case.pending[rank] = (dim, tensor)
        greenlet.getcurrent().parent.switch()  # wait: the scheduler resumes us with a result
        result = case.results.pop(rank)
        if isinstance(result, str):
            message = f"all_gather on rank {rank} never completed: {result}"
            # The trace keeps the fact even if the target swallows the exception.
            case.outcomes[rank].trace.append((INCOMPLETE, message))
            raise CollectiveAborted(message)
        return result


class ThreadRunner:
    """A live RankWorld per world size (trusted code only: the target runs in a worker)."""

    def __init__(self):
        self._worlds: dict[int, RankWorld] = {}

    def run(self, size: int, per_rank_fn, on_switch=None) -> list[RankOutcome]:
        world = self._worlds.get(size)
        if world is None:
            world = self._worlds[size] = RankWorld(size)
        return world.run(per_rank_fn, on_switch)
