"""The in-process rank runner: P ranks in one process, exchanging real tensors.

Ranks are greenlets scheduled cooperatively on one runner thread per world size: a rank runs until
it enters a collective or returns, then the next rank runs; when every rank waits in the same
collective, it completes and every rank gets its own copy of the result. Switching greenlets costs
about a microsecond where handing the GIL between P OS threads cost hundreds per case, and the
schedule is deterministic, so a case replays identically.

Two things must never hang a run:
- a rank that returns or raises while its peers wait in a collective: detected at once (no rank
  can run and not all wait), the waiting ranks are released with `CollectiveAborted`;
- a rank that never returns (sleeps, loops): the driver's per-case timeout expires, the world is
  marked broken and replaced; its runner thread (a daemon) is abandoned.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from dataclasses import dataclass, field

import torch
from greenlet import greenlet

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
    output: str = ""  # what the rank printed (kept short)

    def record_error(self, exc: BaseException) -> None:
        """The target raised: keep one line for the verdict and the traceback's tail."""
        self.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if str(exc) else type(exc).__name__
        self.error_detail = traceback.format_exc(limit=-6)


class _RankOutput:
    """Stands in for sys.stdout/sys.stderr: what a rank prints (a noisy target) goes into its
    outcome, what any other thread prints passes through. Installed once, never removed, so a
    runner thread abandoned inside a hung target cannot leave the streams redirected."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        sink = getattr(_capture, "outcome", None)
        if sink is None:
            return self._stream.write(text)
        sink.output += text[: max(0, _MAX_OUTPUT - len(sink.output))]
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


_MAX_OUTPUT = 4000  # characters of a rank's printing kept for the report
_capture = threading.local()  # on a runner thread: the outcome of the rank that runs now


def _install_output_capture() -> None:
    if not isinstance(sys.stdout, _RankOutput):
        sys.stdout = _RankOutput(sys.stdout)
    if not isinstance(sys.stderr, _RankOutput):
        sys.stderr = _RankOutput(sys.stderr)


class RankGroup:
    """The vLLM-style group a rank sees: world_size, rank_in_group, all_gather(t, dim)."""

    def __init__(self, world: "RankWorld", rank: int):
        self._world = world
        self.world_size = world.size
        self.rank_in_group = rank

    def all_gather(self, input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return self._world.all_gather(self.rank_in_group, input_, dim)


class _Case:
    """Scheduler state of one case."""

    def __init__(self, size: int):
        self.outcomes = [RankOutcome() for _ in range(size)]
        self.finished = [False] * size
        self.pending: dict[int, tuple[int, torch.Tensor]] = {}  # rank -> (dim, tensor) waiting
        self.results: dict[int, torch.Tensor | str] = {}  # str: why the collective failed
        self.returned: list[int] = []  # ranks that returned or raised (not aborted)
        self.running: int | None = None


class RankWorld:
    """P ranks of one world size, run as greenlets on a persistent runner thread."""

    def __init__(self, size: int):
        self.size = size
        self.broken = False
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._case: _Case | None = None
        self._groups = [RankGroup(self, rank) for rank in range(size)]
        _install_output_capture()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=f"pcpcheck-ranks-{size}")
        self._thread.start()

    def stop(self) -> None:
        """End an idle runner thread (a broken one is stuck in a target: left to the daemon)."""
        if not self.broken:
            self._jobs.put(None)
            self._thread.join(timeout=5)

    # driver side -------------------------------------------------------------------------
    def run(self, per_rank_fn, timeout: float) -> list[RankOutcome]:
        """Run `per_rank_fn(rank)` on every rank; outcomes per rank. Never blocks past timeout."""
        done = threading.Event()
        case = _Case(self.size)
        self._jobs.put((per_rank_fn, case, done))
        if done.wait(timeout):
            return case.outcomes
        self.broken = True  # the runner thread is stuck inside a rank: retire it
        for rank, outcome in enumerate(case.outcomes):
            if case.finished[rank]:
                continue
            if rank == case.running:
                reason = f"rank {rank} did not return within {timeout:g} s"
            elif rank in case.pending:
                reason = (f"all_gather on rank {rank} never completed: rank {case.running} "
                          f"did not return within {timeout:g} s")
            else:
                reason = f"rank {rank} never ran: rank {case.running} hung first"
            outcome.trace.append((INCOMPLETE, reason))
        return case.outcomes

    # runner thread ---------------------------------------------------------------------------
    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            per_rank_fn, case, done = job
            self._case = case
            self._schedule(per_rank_fn, case)
            done.set()

    def _schedule(self, per_rank_fn, case: _Case) -> None:
        ranks = [greenlet(self._rank_main) for _ in range(self.size)]
        runnable = list(range(self.size))
        first_switch = [True] * self.size
        while runnable:
            for rank in runnable:
                case.running = rank
                _capture.outcome = case.outcomes[rank]
                if first_switch[rank]:
                    first_switch[rank] = False
                    ranks[rank].switch(rank, per_rank_fn, case)
                else:
                    ranks[rank].switch()
            case.running = None
            _capture.outcome = None
            runnable = self._progress(case)

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
                tensors = [t for _, t in entries]
                case.results = {rank: torch.cat(tensors, dim=dim) for rank in waiting}
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
        case.finished[rank] = True
        if not aborted:
            case.returned.append(rank)

    def all_gather(self, rank: int, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        case = self._case
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(tensor).__name__}")
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
    """The in-process backend (`--backend threads`): a live world per world size, replacing
    worlds that a timeout broke."""

    def __init__(self, timeout: float = 10.0):
        self.timeout = timeout
        self._worlds: dict[int, RankWorld] = {}

    def observe_case(self, case, target):
        """Run one case on its P ranks and judge it (the backend interface the engine uses)."""
        from pcpcheck.check import run_case
        return run_case(case, target, self)

    def close(self) -> None:
        """End the idle runner threads (the runner stays usable: worlds are made on demand)."""
        worlds, self._worlds = self._worlds, {}
        for world in worlds.values():
            world.stop()

    def run(self, size: int, per_rank_fn) -> list[RankOutcome]:
        world = self._worlds.get(size)
        if world is None or world.broken:
            world = self._worlds[size] = RankWorld(size)
        return world.run(per_rank_fn, self.timeout)
