"""Under torchrun (`python -m pcpcheck.faces.torchrun ...`, or `torchrun ... -m
pcpcheck.faces.torchrun_rank`): the transport of every torchrun process.

Every torchrun process is a supervisor that never imports the target: it starts one worker
(pcpcheck.worker.main) that joins torchrun's process group (env://) as its rank. The
supervisors talk through torchrun's own store (keys under `pcpcheck/`): rank 0's supervisor is
the driver (search, judging, report); for message n it stores each rank's part under
`pcpcheck/in/n/r`, every supervisor hands its part to its worker and stores the reply (or why
none came: a hung or dead rank) under `pcpcheck/out/n/r`. A rank that hangs or dies breaks
torchrun's group for good (it cannot be rebuilt): that case gets its verdict and every later
case the same one. At the end the driver stores the exit code; every supervisor stops its worker
and exits quietly with that code (os._exit: no torch traceback, no ChildFailedError for a
violation); only rank 0 prints.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from typing import TYPE_CHECKING

from pcpcheck.backends import pool
from pcpcheck.backends.base import GRACE, STARTUP_TIMEOUT, Backend
from pcpcheck.shared import protocol, wire
from pcpcheck.shared.errors import WorkerError
from pcpcheck.shared.protocol import RankResult, TargetInfo

if TYPE_CHECKING:  # annotations only: torch.distributed is imported where a store starts
    from torch.distributed import TCPStore

_FOREVER = datetime.timedelta(days=1)


def _store():
    import torch.distributed as dist
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                         datetime.timedelta(seconds=STARTUP_TIMEOUT))


def _start_worker(workspace, backend: str, timeout: float) -> pool.WorkerProcess:
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    worker = pool.WorkerProcess(workspace, "torchrun", {
        "mode": backend, "timeout": timeout, "startup_timeout": STARTUP_TIMEOUT,
        "device": f"cuda:{local}" if backend == "nccl" else "cpu"})
    message = worker.reader.recv(time.monotonic() + STARTUP_TIMEOUT)
    if message is None or not protocol.is_ready(message[0]):
        raise WorkerError(f"rank {os.environ.get('RANK')}: the worker did not join the "
                               f"{backend} group: {worker.output_tail().strip()[-200:]}")
    return worker


def _exchange(worker: pool.WorkerProcess, data: bytes, timeout: float) -> bytes:
    """Hand one message to this rank's worker; its reply, or a `lost` message saying why not."""
    header, blobs = wire.unpack(data)
    worker.send(header, blobs)
    seconds = timeout if protocol.carries_cases(header) else STARTUP_TIMEOUT
    outcome = pool.wait_results([worker], seconds, GRACE)[0]
    if outcome[0] == "result":
        return wire.pack(outcome[1], outcome[2])
    rank = int(os.environ.get("RANK", "0"))
    reason = {"died": f"rank {rank} died ({outcome[1]}) before returning",
              "hung": f"rank {rank} did not return within {timeout:g} s"}.get(
        outcome[0], f"rank {rank} did not return within {timeout:g} s")
    return wire.pack(protocol.lost_reply(reason, worker.output_tail(),
                                         "died" if outcome[0] == "died" else "hung"))


class TorchrunBackend(Backend):
    """Rank 0's backend: this rank through its own worker, the others through the store."""

    name = "torchrun"

    def __init__(self, store, worker, size: int, timeout: float):
        super().__init__(timeout)
        self.store, self.worker, self.size = store, worker, size
        self._count = 0
        self.broken: list[RankResult] | None = None

    def _round(self, parts: list[bytes], seconds: float) -> list[tuple]:
        """Message n to every rank (rank 0 here); every rank's reply, in rank order."""
        n, self._count = self._count, self._count + 1
        for rank in range(1, self.size):
            self.store.set(f"pcpcheck/in/{n}/{rank}", parts[rank])
        replies = [wire.unpack(_exchange(self.worker, parts[0], seconds))]
        deadline = time.monotonic() + seconds + 2 * GRACE
        for rank in range(1, self.size):
            key = f"pcpcheck/out/{n}/{rank}"
            while not self.store.check([key]) and time.monotonic() < deadline:
                time.sleep(0.001)
            if self.store.check([key]):
                replies.append(wire.unpack(self.store.get(key)))
            else:
                replies.append((protocol.lost_reply(f"rank {rank} never reported within "
                                                    f"{seconds:g} s"), []))
        return replies

    def _load(self, source: str, function: str | None) -> TargetInfo:
        part = wire.pack(protocol.load_request(source, function, 1))
        replies = self._round([part] * self.size, STARTUP_TIMEOUT)
        infos = [protocol.target_info(source, function, header) for header, _ in replies]
        return infos[0]

    def run(self, prepared, target: TargetInfo) -> list[RankResult]:
        if prepared.size != self.size:
            raise WorkerError(f"case has P={prepared.size}; torchrun started {self.size} ranks")
        if self.broken is not None:
            return self.broken
        parts = [wire.pack(*protocol.case_request(prepared, target, [rank])) for rank in range(self.size)]
        results = []
        for rank, (header, blobs) in enumerate(self._round(parts, self.timeout)):
            if not protocol.is_result(header):
                results.append(protocol.read_lost(header))
                continue
            try:
                results.append(protocol.read_result(header, blobs, 1)[0])
            except ValueError as exc:  # written by the code under check: its report is lost
                results.append(protocol.lost_rank(f"rank {rank} sent {exc}", lost="died"))
        if any(header_lost for header_lost in (r.inputs_after is None for r in results)):
            self.broken = results  # torchrun's group cannot be rebuilt
        return results

    def finish(self, code: int) -> None:
        """The final broadcast: every supervisor exits with `code`."""
        n = self._count
        for rank in range(1, self.size):
            self.store.set(f"pcpcheck/in/{n}/{rank}", b"exit %d" % code)


def _serve(store, worker, rank: int, timeout: float) -> int:
    """Ranks 1..P-1: hand every message to the worker until the driver sends the exit code."""
    broken: bytes | None = None
    for n in range(1 << 62):
        key = f"pcpcheck/in/{n}/{rank}"
        store.wait([key], _FOREVER)
        data = store.get(key)
        if data.startswith(b"exit "):
            return int(data[5:])
        if broken is None:
            reply = _exchange(worker, data, timeout)
            if protocol.is_lost(wire.unpack(reply)[0]):
                broken = reply
        store.set(f"pcpcheck/out/{n}/{rank}", broken or reply)
    return 2


class Session:
    """This torchrun process's part of a check: its worker (joined to torchrun's group) and, on
    rank 0, the backend that drives every rank. Ranks 1..P-1 `serve` until rank 0 `finish`es
    with the exit code; leaving the `with` stops the worker and removes its files."""

    def __init__(self, backend: str, timeout: float):
        self.backend, self.timeout = backend, timeout
        self.rank = int(os.environ.get("RANK", "0"))
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.runner: TorchrunBackend | None = None
        self._workspace: pool.Workspace | None
        self._store: TCPStore | None
        self._worker: pool.WorkerProcess | None
        self._workspace = self._store = self._worker = None

    def __enter__(self) -> Session:
        self._workspace = pool.Workspace("torchrun")
        self._store = _store()
        self._worker = _start_worker(self._workspace, self.backend, self.timeout)
        if self.rank == 0:
            self.runner = TorchrunBackend(self._store, self._worker, self.size, self.timeout)
        return self

    def serve(self) -> int:
        """Ranks 1..P-1: hand every message to the worker; the exit code rank 0 sends."""
        return _serve(self._store, self._worker, self.rank, self.timeout)

    def finish(self, code: int) -> None:
        """Rank 0, last: every supervisor exits with `code`. Once a peer exits non-zero,
        torchrun's agent SIGTERMs the rest, so rank 0 cleans up before it releases them."""
        self.close()
        if self.runner is not None:
            sys.stdout.flush()
            self.runner.finish(code)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
        if self._workspace is not None:
            self._workspace.remove()
            self._workspace = None

    def __exit__(self, *exc) -> None:
        self.close()
