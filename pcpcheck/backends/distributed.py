"""`--backend gloo|nccl`: real ranks, one worker process per rank in a torch.distributed group.

Per world size P a pool of P workers is started once; they meet through a TCPStore the driver
hosts on a free loopback port (no port race) and run each case together (the worker's
`CheckedGroup` keeps their collectives aligned, process_group.py). The driver stays outside the
group: it waits on pipes, never in a collective, so a hung or dead rank costs one case, not the
run. A rank that runs past `timeout` (waiting in a collective does not count), or whose process
dies, gets a verdict; the survivors get GRACE seconds (their own collectives time out after
`timeout`) to report; then the pool is killed and a fresh one serves the next case.
"""

from __future__ import annotations

import datetime
import time

from pcpcheck.backends import base, pool, wire
from pcpcheck.backends.base import GRACE, LOAD_TIMEOUT, STARTUP_TIMEOUT, Backend, RankResult, TargetInfo
from pcpcheck.backends.base import WorkerError
from pcpcheck.loader import LoadError


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


class DistributedBackend(Backend):
    def __init__(self, backend: str = "gloo", timeout: float = 10.0, load_timeout: float | None = None):
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
            worker.send(base.load_message(source, function, 1))
        try:
            replies = target_pool.expect_all(self.load_timeout, "loaded")
            infos = [base.target_info(source, function, reply) for reply in replies]
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

    def run(self, prepared, target: TargetInfo) -> list[RankResult]:
        ranks_pool = self._pool(prepared.size)
        for rank, worker in enumerate(ranks_pool.workers):
            header, blobs = base.case_message(prepared, target, [rank])
            worker.send(header, blobs)
        outcomes = pool.wait_results(ranks_pool.workers, self.timeout, GRACE)
        hung = [o[1] for o in outcomes.values() if o[0] == "hung"]
        results = []
        for rank in range(prepared.size):
            outcome = outcomes[rank]
            if outcome[0] == "result":
                result = base.decode_rank(outcome[1]["ranks"][0], outcome[2])
                ranks_pool.broken |= result.poisoned
                results.append(result)
                continue
            ranks_pool.broken = True
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
            results.append(base.lost_rank(reason, output))
        if ranks_pool.broken:  # no process outlives the case that broke it
            self._retire(ranks_pool)
        return results

    def _retire(self, old: Pool) -> None:
        old.close()
        self.retired_pids += old.pids
        for size, existing in list(self._pools.items()):
            if existing is old:
                del self._pools[size]

    def close(self) -> None:
        for existing in list(self._pools.values()):
            self._retire(existing)
        self._workspace.remove()
