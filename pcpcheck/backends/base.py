"""The Backend interface, and what crosses it: plain data only.

    backend = make_backend("threads", timeout=10.0)      # pcpcheck.backends
    target = backend.load("path/to/pcp.py", None)         # TargetInfo; LoadError if it cannot load
    results = backend.run(prepared, target)               # list[RankResult], one per rank
    backend.close()                                       # every process gone, files removed

`pcpcheck.judge.run.run_cases` is the one place that prepares a case, runs it on a backend, observes
and judges it. A backend never judges, and never imports the target: its workers do.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

from pcpcheck.shared.errors import LoadError
from pcpcheck.shared.protocol import (
    MAX_AHEAD,
    MAX_BATCH,
    RELEASE,
    LinesRun,
    RankResult,
    TargetInfo,
)

GRACE = 1.5  # seconds the driver waits past a death or a hang for the other ranks' reports
STARTUP_TIMEOUT = 120.0  # seconds for a worker to start (import torch, join a group)
LOAD_TIMEOUT = 10.0  # least seconds for a started worker to import the target (--timeout if longer)
# A release's load imports triton, executes its files and probes its manager: 2 s idle here,
# past 10 s on a slow machine under load, so it is bounded like a start, not like a file's import.
RELEASE_LOAD_TIMEOUT = STARTUP_TIMEOUT


def _in_vllm_tree(source: str) -> bool:
    """A file inside a `vllm/` tree: its vllm.* imports run the tree's own modules, a release's
    load (pcpcheck.worker.loader)."""
    path = Path(source)
    return path.suffix == ".py" and "vllm" in path.parent.parts


class Backend:
    """Runs cases on P ranks in worker processes. Subclasses implement `_load` and `run`."""

    name = "backend"
    on_slow = None  # on_slow(rank, seconds): told while a rank has run a second or more
    load_timeout = LOAD_TIMEOUT

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._targets: dict[tuple, TargetInfo] = {}
        self.lines_run = LinesRun()  # a release's path lines its workers' steps ran, merged

    def load(self, source: str, function: str | None = None) -> TargetInfo:
        """Load the target in the workers (bounded); its metadata. Idempotent."""
        key = (source, function)
        if key not in self._targets:
            try:
                self._targets[key] = self._load(source, function)
            except LoadError as exc:  # every load failure names what was being loaded
                if function == RELEASE or str(exc).startswith(source):  # a release's names itself
                    raise
                raise LoadError(f"{source}: {exc}") from None
        return self._targets[key]

    def load_seconds(self, function: str | None, source: str) -> float:
        """How long a started worker may take to load the target: a hang at import is a
        LoadError after this, never a wait without end."""
        if function == RELEASE or _in_vllm_tree(source):
            return max(self.load_timeout, RELEASE_LOAD_TIMEOUT)
        return self.load_timeout

    def run(self, prepared, target: TargetInfo) -> list[RankResult]:
        """Run one prepared case (pcpcheck.judge.prepare.Prepared) on every rank."""
        raise NotImplementedError

    def run_many(self, prepareds, target: TargetInfo):
        """`run` over an iterable of cases, results in order; a backend may keep several cases in
        flight (threads: the worker runs the next case while the driver judges this one)."""
        for prepared in prepareds:
            yield self.run(prepared, target)

    def abandon(self) -> None:
        """Results the last stream left owed are not waited for (a slow target's cases in flight
        would each cost seconds): whatever owes them is retired; the next case starts afresh."""

    def twin(self) -> Backend | None:
        """Another backend like this one, with workers of its own and this one's targets
        loaded, to run cases beside it (a replay in the same wait as the run); None where
        there can be none. The caller closes it."""
        return None

    def close(self) -> None:
        """Stop every worker (and whatever it started); remove temporary files. Idempotent."""

    def _load(self, source: str, function: str | None) -> TargetInfo:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Entry:
    """A case of a stream, and where it runs (its channel)."""

    __slots__ = ("prepared", "key")

    def __init__(self, prepared, key):
        self.prepared, self.key = prepared, key


class BatchedBackend(Backend):
    """A backend whose cases go to channels (a worker, a pool of workers) in batches: one
    message carries up to `max_batch` cases, the workers run them one after another and report
    each as it ends, and `depth` batches per channel are in flight (the workers run while the
    driver judges). The batch size starts at 1 and doubles after each batch, so the first
    results come at once and a stream stopped early leaves little to drain.

    Subclasses implement `_channel(prepared) -> key`, `_send(key, prepareds, target)` and
    `_receive(key, size, careful) -> (status, results)`: the head case's (P = size) "result", "lost"
    (the head case's verdict: its channel died or hung, and was retired) or "retry" (the channel
    failed where the head case cannot be blamed, and was retired: the head case and those after
    it run again on a fresh channel, each alone). A rank that hangs or dies before reporting the
    head case did so in it. `careful`: the head case is alone in flight on its channel, so
    whatever fails is its doing.

    A stream abandoned by its consumer (a deadline, a violation) leaves results owed
    (`_owed`): the next stream drains them first, or retires a channel that fails meanwhile."""

    depth = MAX_AHEAD // MAX_BATCH  # a peer waits for at most this many batches of cases
    max_batch = MAX_BATCH

    def __init__(self, timeout: float):
        super().__init__(timeout)
        self._owed: dict = {}  # channel -> results sent for and not received
        self._stream: object = None  # the run_many stream that owns the backend

    def load(self, source: str, function: str | None = None) -> TargetInfo:
        self._settle()  # a worker answers in order: owed results come before "loaded"
        return super().load(source, function)

    def run(self, prepared, target: TargetInfo) -> list[RankResult]:
        return next(self.run_many([prepared], target))

    def run_many(self, prepareds, target: TargetInfo):
        stream = self._stream = object()
        self._settle()
        cases, more = iter(prepareds), True
        order: deque = deque()  # cases not yielded yet, in stream order
        unsent: dict = {}  # channel -> deque of cases to send, in order
        flights: dict = {}  # channel -> deque of batches in flight (lists of cases)
        careful: dict = {}  # channel -> cases still to send alone
        batch = 1
        while True:
            if self._stream is not stream:
                raise RuntimeError("a later run_many took this backend over")
            while more and len(order) < self.depth * batch:
                prepared = next(cases, None)
                if prepared is None:
                    more = False
                    break
                entry = _Entry(prepared, self._channel(prepared))
                order.append(entry)
                unsent.setdefault(entry.key, deque()).append(entry)
            if not order:
                return
            for key, queue in unsent.items():
                sent = flights.setdefault(key, deque())
                while queue and len(sent) < (1 if careful.get(key) else self.depth):
                    size = 1 if careful.get(key) else batch
                    chunk = [queue.popleft() for _ in range(min(size, len(queue)))]
                    careful[key] = max(0, careful.get(key, 0) - len(chunk))
                    self._send(key, [entry.prepared for entry in chunk], target)
                    self._owed[key] = self._owed.get(key, 0) + len(chunk)
                    sent.append(chunk)
            head = order[0]
            alone = len(flights[head.key][0]) == 1 == len(flights[head.key])  # nothing runs after it
            status, results = self._receive(head.key, head.prepared.size, alone)
            if status == "retry":  # every case in flight on this channel again, alone
                again = [entry for chunk in flights.pop(head.key) for entry in chunk]
                careful[head.key] = len(again)
                batch = 1
            else:
                order.popleft()
                flights[head.key][0].pop(0)
                if not flights[head.key][0]:
                    flights[head.key].popleft()
                    batch = min(self.max_batch, batch * 2)
                again = []
                if status == "lost":  # the rest in flight went down with the channel
                    again = [entry for chunk in flights.pop(head.key) for entry in chunk]
            unsent[head.key] = deque(again + list(unsent.get(head.key, ())))
            if status != "retry":
                yield results

    def abandon(self) -> None:
        for key in [key for key, owed in self._owed.items() if owed]:
            self._retire_channel(key)

    def _retire_channel(self, key) -> None:
        raise NotImplementedError

    def _settle(self) -> None:
        """Results an abandoned stream left owed: drained (a failing channel is retired)."""
        for key in list(self._owed):
            while self._owed.get(key):
                if self._receive(key, 0, False)[0] != "result":
                    break

    def _received(self, key) -> None:
        self._owed[key] -= 1

    def _channel(self, prepared):
        raise NotImplementedError

    def _send(self, key, prepareds, target: TargetInfo) -> None:
        raise NotImplementedError

    def _receive(self, key, size: int, careful: bool) -> tuple[str, list[RankResult] | None]:
        raise NotImplementedError
