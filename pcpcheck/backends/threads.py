"""`--backend threads`: one worker process hosts the P ranks of a case as greenlets.

Fast (several cases per round trip, base.BatchedBackend) and isolated: the target lives in the
worker, one module instance per rank. A rank that runs longer than `timeout` (its own running
time, not its peers'), or a worker that dies, costs the worker: it is killed with its session,
the case gets a verdict (the cases before it in its batch keep theirs), and a fresh worker
(targets reloaded) runs the cases after it again.
"""

from __future__ import annotations

from pcpcheck.backends import pool
from pcpcheck.backends.base import GRACE, LOAD_TIMEOUT, STARTUP_TIMEOUT, BatchedBackend
from pcpcheck.shared import protocol, wire
from pcpcheck.shared.defaults import DEFAULT_DEVICE, DEFAULT_TIMEOUT, MAX_RANKS
from pcpcheck.shared.errors import LoadError
from pcpcheck.shared.protocol import NOT_STARTED, WAITING, RankResult, TargetInfo


class ThreadsBackend(BatchedBackend):
    name = "threads"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, device: str = DEFAULT_DEVICE,
                 load_timeout: float | None = None):
        super().__init__(timeout)
        self.device = device
        self.load_timeout = load_timeout or max(LOAD_TIMEOUT, timeout)
        self._workspace = pool.Workspace("threads")
        self._worker: pool.WorkerProcess | None = None
        self.retired_pids: list[int] = []

    @property
    def pids(self) -> list[int]:
        return [self._worker.pid] if self._worker is not None else []

    def _start(self) -> pool.WorkerProcess:
        if self._worker is None:
            worker = pool.WorkerProcess(self._workspace, "threads",
                                        {"mode": "threads", "device": self.device})
            self._worker = worker
            self._expect(worker, STARTUP_TIMEOUT, "ready")
            for source, function in self._targets:  # a fresh worker after a broken one
                worker.send(protocol.load_request(source, function, MAX_RANKS))
                self._expect(worker, self.load_seconds(function, source), "loaded")
        return self._worker

    def _expect(self, worker, seconds: float, what: str) -> dict:
        import time
        try:
            message = worker.reader.recv(time.monotonic() + seconds)
        except wire.ChannelClosed:
            reason = worker.exit_reason()
            tail = worker.output_tail().strip().splitlines()
            self._retire()
            raise LoadError(f"the worker process ended ({reason}) before it was {what}"
                            + (f": {tail[-1][:200]}" if tail else "")) from None
        if message is None:
            self._retire()
            raise LoadError(f"the worker was not {what} within {seconds:g} s")
        return message[0]

    def _load(self, source: str, function: str | None) -> TargetInfo:
        worker = self._start()
        if not worker.send(protocol.load_request(source, function, MAX_RANKS)):
            self._retire()
            raise LoadError(f"{source}: the worker process is gone")
        try:
            reply = self._expect(worker, self.load_seconds(function, source), "loaded")
            return protocol.target_info(source, function, reply)
        except LoadError:
            self._retire()  # a target that failed to load may have left anything behind
            raise

    def twin(self) -> ThreadsBackend:
        other = ThreadsBackend(self.timeout, self.device, self.load_timeout)
        other.lines_run = self.lines_run  # its steps are the run's too
        for source, function in self._targets:
            other.load(source, function)
        return other

    def _channel(self, prepared) -> int:
        return 0  # one worker hosts every world size

    def _send(self, key, prepareds, target: TargetInfo) -> None:
        worker = self._start()
        header, blobs = protocol.cases_request(prepareds, target)
        worker.send(header, blobs)  # a dead worker shows as such when its result is awaited

    def _receive(self, key, size: int, careful: bool):
        """The next case's results, or its verdict if the worker hung or died in it (the worker
        runs the cases of a batch in order: the one not reported is the one that ran)."""
        worker = self._worker
        assert worker is not None  # _send started it; _retire drops what it owed
        outcome = pool.wait_results([worker], self.timeout, GRACE, on_slow=self.on_slow)[0]
        if outcome[0] == "result":
            self._received(key)
            try:
                results = protocol.read_result(outcome[1], outcome[2], size or None)
                self.lines_run.add(outcome[1])
                return "result", results
            except LoadError:  # the run stops: what the worker still owes must not reach another
                self._retire()
                raise
            except ValueError as exc:  # written by the code under check: the worker is not ours
                outcome = ("died", f"it sent {exc}")
        return "lost", self._lost(worker, outcome, size)

    def _lost(self, worker, outcome, size: int) -> list[RankResult]:
        """The worker hung or died mid-case: every rank gets a reason, blame on the running one."""
        running, _, _, states = worker.status()
        output = worker.output_tail()
        self._retire()
        lost = "hung" if outcome[0] == "hung" else "died"
        if outcome[0] == "hung":
            culprit, what = outcome[1], f"did not return within {self.timeout:g} s"
        else:
            last = output.strip().splitlines()[-1][:200] if output.strip() else ""
            culprit, what = running, f"died ({outcome[1]}) before returning"
            what += f"; stderr: {last}" if last else ""
        if culprit < 0:
            return [protocol.lost_rank(f"the worker process hosting every rank ended ({outcome[1]}) "
                                       "outside any rank's call", output, lost) for _ in range(size)]
        results = []
        for rank in range(size):
            if rank == culprit:
                reason = f"rank {rank} {what}"
            elif states[rank] == WAITING:
                reason = f"all_gather on rank {rank} never completed: rank {culprit} {what}"
            elif states[rank] == NOT_STARTED:
                reason = f"rank {rank} never ran: rank {culprit} {what} first"
            else:  # FINISHED: its report went down with the worker
                reason = f"rank {rank}'s result was lost: rank {culprit} {what}"
            results.append(protocol.lost_rank(reason, output if rank == culprit else "", lost))
        return results

    def _retire_channel(self, key) -> None:
        self._retire()

    def _retire(self) -> None:
        self._owed.pop(0, None)  # what the worker owed is lost with it
        if self._worker is not None:
            self._worker.kill()
            self.retired_pids.append(self._worker.pid)
            self._worker = None

    def close(self) -> None:
        self._retire()
        self._workspace.remove()
