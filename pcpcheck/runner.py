"""The in-process rank runner: P ranks as threads, exchanging real tensors.

Each world keeps its P threads alive across cases (building a world per case is the slow part).
Ranks meet in `all_gather` through a condition variable. Two things must never hang a run:
- a rank that returns or raises while its peers wait in a collective: detected at once (every
  rank is either finished or waiting, and not all wait in the same collective), the waiting
  ranks are released with `CollectiveAborted`;
- a rank that never returns (sleeps, loops): the driver's per-case timeout expires, the world is
  marked broken and replaced; the stuck daemon thread is abandoned.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from pcpcheck.rankctx import bound_group
from spec.invariants import INCOMPLETE


class CollectiveAborted(RuntimeError):
    """Raised inside a rank whose collective can never complete (a peer left or disagreed)."""


@dataclass
class RankOutcome:
    """What one rank's call produced: a value or an error, and the collectives it issued."""

    value: object = None
    error: str | None = None  # the target's own exception, as one line
    error_detail: str | None = None  # its traceback, for reports
    trace: list[tuple] = field(default_factory=list)  # (op, dim, shape, dtype) per collective


class RankGroup:
    """The vLLM-style group a rank sees: world_size, rank_in_group, all_gather(t, dim)."""

    def __init__(self, world: "ThreadWorld", rank: int):
        self._world = world
        self.world_size = world.size
        self.rank_in_group = rank

    def all_gather(self, input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return self._world.all_gather(self.rank_in_group, input_, dim)


class ThreadWorld:
    """P persistent rank threads and the collective state they share."""

    def __init__(self, size: int):
        self.size = size
        self.broken = False
        self._cond = threading.Condition()
        self._jobs = [queue.SimpleQueue() for _ in range(size)]
        self._outcomes: list[RankOutcome | None] = [None] * size
        self._finished = 0
        self._waiting = 0
        self._aborted = False
        self._pending: list[tuple | None] = [None] * size  # (dim, tensor) of ranks in a gather
        self._round = 0  # completed collectives; waiters wait for it to move
        self._results: list[torch.Tensor | str | None] = [None] * size  # str: why it failed
        self._traces: list[list[tuple]] = [[] for _ in range(size)]
        self._groups = [RankGroup(self, rank) for rank in range(size)]
        for rank in range(size):
            threading.Thread(target=self._serve, args=(rank,), daemon=True,
                             name=f"pcpcheck-rank{rank}-of-{size}").start()

    # driver side -------------------------------------------------------------------------
    def run(self, per_rank_fn, timeout: float) -> list[RankOutcome]:
        """Run `per_rank_fn(rank)` on every rank; outcomes per rank. Never blocks past timeout."""
        with self._cond:
            self._outcomes = [None] * self.size
            self._finished = self._waiting = 0
            self._aborted = False
            self._returned: list[int] = []
            self._pending = [None] * self.size
        for jobs in self._jobs:
            jobs.put(per_rank_fn)
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._finished < self.size:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._give_up(timeout)
                self._cond.wait(left)
            return list(self._outcomes)

    def _give_up(self, timeout: float) -> list[RankOutcome]:
        """Timeout: release waiting ranks, report the stuck ones, and retire this world."""
        self._aborted = True
        self._cond.notify_all()
        grace = time.monotonic() + 0.2  # ranks released from a collective record their outcome
        while self._finished < self.size and time.monotonic() < grace:
            self._cond.wait(0.02)
        self.broken = True
        outcomes = []
        for rank, outcome in enumerate(self._outcomes):
            if outcome is None:
                trace = self._traces[rank] + [(INCOMPLETE, f"rank {rank} did not return within {timeout:g} s")]
                outcome = RankOutcome(trace=trace)
            outcomes.append(outcome)
        return outcomes

    # rank side ---------------------------------------------------------------------------
    def _serve(self, rank: int) -> None:
        group = self._groups[rank]
        while True:
            per_rank_fn = self._jobs[rank].get()
            outcome = RankOutcome()
            self._traces[rank] = outcome.trace
            aborted = False
            try:
                with bound_group(group):
                    outcome.value = per_rank_fn(rank)
            except CollectiveAborted:
                aborted = True  # all_gather already recorded why in the trace
            except BaseException as exc:  # noqa: BLE001 - a target may raise anything, even SystemExit
                outcome.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                outcome.error_detail = traceback.format_exc(limit=-6)
            with self._cond:
                if self.broken:
                    return  # a timed-out world: the driver has moved on
                self._outcomes[rank] = outcome
                self._finished += 1
                if not aborted:
                    self._returned.append(rank)
                self._detect_deadlock()
                self._cond.notify_all()

    def _detect_deadlock(self) -> None:
        """Called under the lock: if no rank can make progress, abort the waiting ones."""
        if self._waiting and self._waiting + self._finished == self.size:
            self._aborted = True

    def all_gather(self, rank: int, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(tensor).__name__}")
        self._traces[rank].append(("all_gather", dim, tuple(tensor.shape), str(tensor.dtype)))
        with self._cond:
            if self._aborted:
                raise self._abort(rank, "a peer rank already left the collective sequence")
            self._pending[rank] = (dim, tensor)
            self._waiting += 1
            entered = self._round
            if self._waiting == self.size:
                self._complete_round()
            else:
                self._detect_deadlock()
                self._cond.notify_all()
                while self._round == entered and not self._aborted:
                    self._cond.wait()
                if self._round == entered:
                    self._waiting -= 1
                    self._pending[rank] = None
                    raise self._abort(rank, "a peer never joined it (ranks that returned or "
                                            f"raised instead: {sorted(self._returned)})")
            result = self._results[rank]
            self._results[rank] = None
            if isinstance(result, str):
                raise self._abort(rank, result)
        return result

    def _abort(self, rank: int, reason: str) -> CollectiveAborted:
        """Record in the rank's trace that its collective failed (a target may swallow the
        exception, the trace keeps the fact) and build the exception to raise."""
        message = f"all_gather on rank {rank} never completed: {reason}"
        self._traces[rank].append((INCOMPLETE, message))
        return CollectiveAborted(message)

    def _complete_round(self) -> None:
        """Called under the lock by the last rank to arrive: every rank gets its own result."""
        # Like NCCL's all_gather_into_tensor: every rank passes the same dim, shape and dtype.
        if len({(dim, tuple(t.shape), t.dtype) for dim, t in self._pending}) != 1:
            failure = "shapes disagree across ranks: " + ", ".join(
                f"rank {r}: dim {d} {tuple(t.shape)} {t.dtype}" for r, (d, t) in enumerate(self._pending))
            self._results = [failure] * self.size
        else:
            dim = self._pending[0][0]
            tensors = [t for _, t in self._pending]
            self._results = [torch.cat(tensors, dim=dim) for _ in range(self.size)]
        self._pending = [None] * self.size
        self._waiting = 0
        self._round += 1
        self._cond.notify_all()


class ThreadRunner:
    """Hands out a live world per world size, replacing worlds that a timeout broke."""

    def __init__(self, timeout: float = 10.0):
        self.timeout = timeout
        self._worlds: dict[int, ThreadWorld] = {}

    def observe_case(self, case, target):
        """Run one case on its P ranks and judge it (the backend interface the engine uses)."""
        from pcpcheck.check import run_case
        return run_case(case, target, self)

    def close(self) -> None:
        """Nothing to release: rank threads are daemons and idle between cases."""

    def run(self, size: int, per_rank_fn) -> list[RankOutcome]:
        world = self._worlds.get(size)
        if world is None or world.broken:
            world = self._worlds[size] = ThreadWorld(size)
        return world.run(per_rank_fn, self.timeout)
