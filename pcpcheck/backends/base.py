"""The Backend interface, and what crosses it: plain data only.

    backend = make_backend("threads", timeout=10.0)       # pcpcheck.backends
    target = backend.load("path/to/pcp.py", None)         # TargetInfo; LoadError if it cannot load
    results = backend.run(prepared, target)               # list[RankResult], one per rank
    backend.close()                                       # every process gone, files removed

`pcpcheck.check.run_case` is the one place that prepares a case, runs it on a backend, observes
and judges it. A backend never judges, and never imports the target: its workers do.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

from pcpcheck.backends import wire
from pcpcheck.backends.worker import MAX_AHEAD, MAX_BATCH
from pcpcheck.loader import LoadError

GRACE = 1.5  # seconds the driver waits past a death or a hang for the other ranks' reports
STARTUP_TIMEOUT = 120.0  # seconds for a worker to start (import torch, join a group)
LOAD_TIMEOUT = 10.0  # least seconds for a started worker to import the target (--timeout if longer)
# The `function` of a vLLM release (`pcpcheck vllm`): its `source` is the release's source spec as
# JSON (pcpcheck.vllm.source.Source.spec); the worker loads the release and runs
# pcpcheck.vllm.run.rank_step on every rank.
RELEASE = "<vllm release>"


class WorkerError(Exception):
    """Worker processes could not start (not the target's doing: no target is loaded yet)."""


@dataclass(frozen=True)
class TargetInfo:
    """What the driver knows of a target: sent back by the worker that loaded it."""

    source: str  # as given (a path, module:function, impl): what the workers load
    function: str | None  # --function as given
    name: str
    stand_ins: tuple[str, ...]
    accepts_shard: bool
    function_name: str


@dataclass(frozen=True)
class ReleaseInfo(TargetInfo):
    """A vLLM release as the worker that loaded it described it, in plain data: `release` holds
    release, source (spec), files (relpath -> sha256), adapted, caps (pcpcheck.vllm.release
    .Capabilities fields)."""

    release: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseStep:
    """A case for a release: its ranks build their own inputs (their managers lay the step out)."""

    case: object  # pcpcheck.cases.Case

    @property
    def size(self) -> int:
        return self.case.batch.pcp_size


@dataclass
class RankResult:
    """One rank's call, as the worker reported it (or as the driver records a lost rank)."""

    error: str | None = None
    error_detail: str | None = None
    trace: list[tuple] = field(default_factory=list)
    output: str = ""
    value: object = None  # rebuilt by the driver: tuples, lists, plain tensors, stand-ins
    inputs_after: list[bytes] | None = None  # None: unknown (the rank never reported)
    poisoned: bool = False  # its process group failed: the pool must be replaced
    input_device: str = "cpu"  # where the rank's inputs were (outputs must be there too)
    step: dict | None = None  # a release's rank: its rank_step report (layout, inputs), plain data


class Backend:
    """Runs cases on P ranks in worker processes. Subclasses implement `_load` and `run`."""

    name = "backend"

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._targets: dict[tuple, TargetInfo] = {}

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

    def run(self, prepared, target: TargetInfo) -> list[RankResult]:
        """Run one prepared case (pcpcheck.check.Prepared) on every rank."""
        raise NotImplementedError

    def run_many(self, prepareds, target: TargetInfo):
        """`run` over an iterable of cases, results in order; a backend may keep several cases in
        flight (threads: the worker runs the next case while the driver judges this one)."""
        for prepared in prepareds:
            yield self.run(prepared, target)

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
        self._stream = None

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


def load_message(target_source: str, function: str | None, copies: int) -> dict:
    return {"op": "load", "source": target_source, "function": function or "", "copies": copies}


def target_info(source: str, function: str | None, header: dict) -> TargetInfo:
    """The driver's TargetInfo from a worker's reply (LoadError if it is one)."""
    if header.get("op") == "load_error":
        raise _load_error(header.get("kind"))(str(header.get("message"))[:500])
    if header.get("op") != "loaded":
        raise LoadError(f"{source}: the worker answered {str(header.get('op'))[:50]!r} to loading")
    fields = (source, function, str(header["name"]), tuple(map(str, header["stand_ins"])),
              bool(header["accepts_shard"]), str(header["function_name"]))
    if function == RELEASE:
        return ReleaseInfo(*fields, release=json.loads(json.dumps(header["release"])))
    return TargetInfo(*fields)


def _load_error(kind) -> type:
    """The driver's class for a worker's load failure: a release's own kinds (one line each)."""
    if kind in ("InterfaceDrift", "SourceError"):
        from pcpcheck.vllm.release import InterfaceDrift
        from pcpcheck.vllm.source import SourceError
        return {"InterfaceDrift": InterfaceDrift, "SourceError": SourceError}[kind]
    return LoadError


def case_message(prepared, target: TargetInfo, ranks) -> tuple[dict, list]:
    """The case for the ranks a worker hosts: its inputs as bytes, nothing else (a release's
    step: the case as JSON; its ranks lay it out themselves)."""
    if target.function == RELEASE:
        return {"op": "case", "source": target.source, "function": RELEASE, "size": prepared.size,
                "step": prepared.case.to_json(), "ranks": list(ranks)}, []
    header = {"op": "case", "source": target.source, "function": target.function or "",
              "size": prepared.size, "shard": prepared.shard,
              "tensors": [[str(spec.torch_dtype), list(spec.trailing)] for spec in prepared.case.tensors],
              "nds": [prepared.nds[rank] for rank in ranks]}
    blobs = []
    for rank in ranks:
        blobs += [source.tobytes() for source in prepared.sources[rank]]
        blobs.append(prepared.slot_maps[rank].tobytes())
    return header, blobs


def batch_message(prepareds, target: TargetInfo, ranks=None) -> tuple[dict, list]:
    """Several cases in one message (the worker runs them in order, reporting each), for
    `ranks` (None: every rank of each case)."""
    cases, counts, blobs = [], [], []
    for prepared in prepareds:
        header, more = case_message(prepared, target, range(prepared.size) if ranks is None else ranks)
        cases.append(header)
        counts.append(len(more))
        blobs += more
    return {"op": "cases", "cases": cases, "counts": counts}, blobs


def decode_rank(result: dict, blobs: list) -> RankResult:
    """A worker's report of one rank, decoded by the driver from plain data."""
    rank = RankResult(error=_text(result.get("error")), error_detail=_text(result.get("error_detail")),
                      output=str(result.get("output") or ""), poisoned=bool(result.get("poisoned")),
                      input_device=str(result.get("input_device", "cpu"))[:40])
    if isinstance(result.get("step"), dict):
        rank.step = result["step"]
    for entry in result.get("trace") or []:
        rank.trace.append(tuple(tuple(item) if isinstance(item, list) else item for item in entry))
    try:
        after = result["inputs_after"]  # None: a release's rank that made no call
        rank.inputs_after = None if after is None else [bytes(blobs[i]) for i in after]
        if rank.error is None:
            rank.value = wire.decode_value(result.get("value"), blobs)
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
        rank.error = f"returned tensors pcpcheck cannot read: {type(exc).__name__}: {exc}"[:300]
    return rank


def lost_rank(reason: str, output: str = "") -> RankResult:
    """A rank that never reported: its call did not complete."""
    return RankResult(trace=[(wire.TRACE_INCOMPLETE, reason)], output=output)


def _text(value) -> str | None:
    return None if value is None else str(value)
