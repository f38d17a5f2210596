"""`--backend gloo|nccl`: real ranks, one worker process per rank in a torch.distributed group.

Per world size P a pool of P workers is started once; they meet through a TCPStore the driver
hosts on a free loopback port (no port race) and run each case together (the worker's
`CheckedGroup` keeps their collectives aligned, process_group.py). The driver stays outside the
group: it waits on pipes, never in a collective, so a hung or dead rank costs one case, not the
run. Cases go to a pool in batches (base.BatchedBackend); its ranks do not wait for each other
between the cases of a batch. A rank that runs past `timeout` (waiting in a collective does not
count), or whose process dies, costs the pool: killed, a fresh one runs again, each case alone,
the cases whose results had not all come (the rank that failed may have been ahead of its peers,
in a later case). A case that fails alone in flight gets the verdict: the failing rank named, the
survivors given GRACE seconds to report.
"""

from __future__ import annotations

import datetime
import time

from pcpcheck.backends import pool
from pcpcheck.backends.base import GRACE, LOAD_TIMEOUT, STARTUP_TIMEOUT, BatchedBackend
from pcpcheck.shared import protocol, wire
from pcpcheck.shared.defaults import DEFAULT_TIMEOUT
from pcpcheck.shared.errors import LoadError, WorkerError
from pcpcheck.shared.protocol import RankResult, TargetInfo


class Pool:
    """P workers, ranks 0..P-1 of one process group."""

    def __init__(self, workspace: pool.Workspace, size: int, backend: str, timeout: float):
        import torch.distributed as dist
        self.size, self.backend = size, backend
        self.broken = False
        self._store = dist.TCPStore("127.0.0.1", 0, None, True,
                                    datetime.timedelta(seconds=STARTUP_TIMEOUT), wait_for_workers=False)
        self.workers = [pool.WorkerProcess(workspace, f"{backend}{size}-rank{rank}", {
            "mode": backend, "rank": rank, "size": size, "port": self._store.port,
            "timeout": timeout, "startup_timeout": STARTUP_TIMEOUT,
            "device": f"cuda:{rank}" if backend == "nccl" else "cpu"}) for rank in range(size)]

    @property
    def pids(self) -> list[int]:
        return [worker.pid for worker in self.workers]

    def expect_all(self, seconds: float, what: str) -> list[dict]:
        """One message from every rank within `seconds`; WorkerError/LoadError otherwise."""
        deadline = time.monotonic() + seconds
        replies = []
        for rank, worker in enumerate(self.workers):
            try:
                message = worker.reader.recv(deadline)
            except wire.ChannelClosed:
                tail = worker.output_tail().strip().splitlines()
                error = (f"{self.backend} rank {rank} ended ({worker.exit_reason()}) before it was {what}"
                         + (f": {tail[-1][:200]}" if tail else ""))
                self.close()
                raise (LoadError if what == "loaded" else WorkerError)(error) from None
            if message is None:
                self.close()
                raise (LoadError if what == "loaded" else WorkerError)(
                    f"{self.backend} rank {rank} was not {what} within {seconds:g} s")
            replies.append(message[0])
        return replies

    def close(self) -> None:
        self.broken = True
        for worker in self.workers:
            worker.kill()


class DistributedBackend(BatchedBackend):
    def __init__(self, backend: str = "gloo", timeout: float = DEFAULT_TIMEOUT,
                 load_timeout: float | None = None):
        super().__init__(timeout)
        self.name = backend
        self.load_timeout = load_timeout or max(LOAD_TIMEOUT, timeout)
        self._workspace = pool.Workspace(backend)
        self._pools: dict[int, Pool] = {}
        self.retired_pids: list[int] = []

    def start(self, sizes) -> None:
        """Start the pools up front, all at once (a startup failure surfaces before the search)."""
        new = [size for size in dict.fromkeys(sizes) if size not in self._pools]
        try:
            for size in new:
                self._pools[size] = Pool(self._workspace, size, self.name, self.timeout)
            for size in new:
                self._ready(self._pools[size])
        except BaseException:
            self.close()
            raise

    def _ready(self, started: Pool) -> None:
        started.expect_all(STARTUP_TIMEOUT, "ready")
        for source, function in self._targets:
            self._load_on(started, source, function)

    def _load_on(self, target_pool: Pool, source: str, function: str | None) -> TargetInfo:
        for worker in target_pool.workers:
            worker.send(protocol.load_request(source, function, 1))
        try:
            replies = target_pool.expect_all(self.load_seconds(function, source), "loaded")
            infos = [protocol.target_info(source, function, reply) for reply in replies]
        except LoadError:
            self._retire(target_pool)
            raise
        return infos[0]

    def _load(self, source: str, function: str | None) -> TargetInfo:
        if not self._pools:
            self.start([2])
        infos = [self._load_on(p, source, function) for p in list(self._pools.values())]
        return infos[0]

    @property
    def pids(self) -> list[int]:
        return [pid for p in self._pools.values() for pid in p.pids]

    def _pool(self, size: int) -> Pool:
        existing = self._pools.get(size)
        if existing is None:
            self.start([size])
        return self._pools[size]

    def _channel(self, prepared) -> int:
        return prepared.size

    def _send(self, size: int, prepareds, target: TargetInfo) -> None:
        ranks_pool = self._pool(size)
        for rank, worker in enumerate(ranks_pool.workers):
            worker.send(*protocol.cases_request(prepareds, target, [rank]))

    def _receive(self, key: int, size: int, careful: bool):
        # a pool's key is its world size: `size` (0 when draining owed results) is not read
        ranks_pool = self._pools[key]
        # Alone in flight, no rank can be in a later case: one that looks so is not watched
        # (a status a target forged would otherwise have this case run again and again).
        outcomes = pool.wait_results(ranks_pool.workers, self.timeout, GRACE, watch=not careful,
                                     on_slow=self.on_slow)
        outcomes = [outcomes[rank] for rank in range(key)]  # arrival order -> rank order
        results: list[RankResult | None] = []
        for rank, outcome in enumerate(outcomes):
            try:
                results.append(protocol.read_result(outcome[1], outcome[2], 1)[0]
                               if outcome[0] == "result" else None)
            except LoadError:  # the run stops: what the ranks still owe must not reach another
                self._retire(ranks_pool)
                raise
            except ValueError as exc:  # written by the code under check: the worker is not ours
                outcomes[rank] = ("died", f"it sent {exc}")
                results.append(None)
        if all(result is not None and not result.poisoned for result in results):
            self._received(key)
            return "result", results
        # A rank that hung in a later case, or a group that failed (a peer may have died in a
        # later case) while other cases were in flight: not this case's doing.
        ahead = any(outcome[0] == "ahead" for outcome in outcomes)
        if ahead or (not careful and None not in results):
            self._retire(ranks_pool)
            return "retry", None
        hung = [o[1] for o in outcomes if o[0] == "hung"]
        for rank in range(key):
            if results[rank] is not None:
                continue
            outcome = outcomes[rank]
            output = ranks_pool.workers[rank].output_tail()
            last = output.strip().splitlines()[-1][:200] if output.strip() else ""
            if outcome[0] == "died":
                reason = f"rank {rank} died ({outcome[1]}) before returning"
                reason += f"; stderr: {last}" if last else ""
            elif outcome[0] == "hung":
                reason = f"rank {rank} did not return within {self.timeout:g} s"
            else:
                reason = (f"all_gather on rank {rank} never completed: rank "
                          f"{hung[0] if hung else '?'} did not return within {self.timeout:g} s")
            results[rank] = protocol.lost_rank(reason, output,
                                               "died" if outcome[0] == "died" else "hung")
        self._retire(ranks_pool)  # no process outlives the case that broke it
        return "lost", results

    def _retire_channel(self, key) -> None:
        if key in self._pools:
            self._retire(self._pools[key])
        self._owed.pop(key, None)

    def _retire(self, old: Pool) -> None:
        old.close()
        self.retired_pids += old.pids
        for size, existing in list(self._pools.items()):
            if existing is old:
                del self._pools[size]
                self._owed.pop(size, None)  # what the pool owed is lost with it

    def close(self) -> None:
        for existing in list(self._pools.values()):
            self._retire(existing)
        self._workspace.remove()
