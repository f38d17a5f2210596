"""Where a rank runs: the worker process, the only process that imports and calls the target.
Each is forked by the driver's fork server (pcpcheck.backends.forkserver).

A worker hosts either every rank of a world as greenlets (`threads`: pcpcheck.worker.runner
schedules them) or one rank of a torch.distributed group (`gloo`, `nccl`, `torchrun`), and runs
what it loaded on them (pcpcheck.worker.hosts). It loads its own
instance of the target per rank it hosts (the file executed once per rank, under distinct module
names: module globals are never shared between ranks), builds each rank's inputs from the bytes
the driver sent, calls the target, and sends back plain data (pcpcheck.shared.protocol): errors,
collective traces, what each rank printed, and the raw bytes of the returned and input tensors.
It never judges. The driver decodes, judges, and stops a worker whose rank runs out of time:
the worker publishes which rank runs, and for how long, in a small shared status file.

File descriptors 1 and 2 go to a capture file: what a rank prints, even at the fd level, is
attributed to the rank that was running and reported with it, truncated.
"""

from __future__ import annotations

import gc
import io
import mmap
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from pcpcheck.shared import protocol, wire
from pcpcheck.shared.defaults import MAX_RANKS
from pcpcheck.shared.lifetime import die_with_parent
from pcpcheck.shared.protocol import MAX_AHEAD, MAX_OUTPUT, RUNNING, STATUS
from pcpcheck.worker import hosts
from pcpcheck.worker.process_group import finish
from pcpcheck.worker.runner import ThreadRunner
from pcpcheck.worker.standins import take_refused

if TYPE_CHECKING:  # imported where the worker joins a group
    from pcpcheck.worker.process_group import GroupAdapter


class Status:
    """The shared status file: which rank runs since when, each rank's time so far, its state.
    Written here at every switch, read by the driver (pcpcheck.backends.pool.Worker.status)."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(fd, STATUS.size)
        os.close(fd)
        self._running, self._since = -1, 0.0
        self._seconds = [0.0] * MAX_RANKS
        self._states = [0] * MAX_RANKS
        self._write()

    def begin(self) -> None:
        self._running, self._since = -1, time.monotonic()
        self._seconds = [0.0] * MAX_RANKS
        self._states = [0] * MAX_RANKS
        self._write()

    def switch(self, rank: int, state: int) -> None:
        now = time.monotonic()
        if self._running >= 0:
            self._seconds[self._running] += now - self._since
        self._running = rank if state == RUNNING else -1
        self._since = now
        self._states[rank] = state
        self._write()

    def seconds(self, rank: int) -> float:
        """How long `rank` has run in this case."""
        return self._seconds[rank]

    def _write(self) -> None:
        # Packed aside, then copied in: struct.pack_into zeroes its target before filling it,
        # and a driver reading in between saw "rank 0 running since time 0": a false hang.
        self._map[:STATUS.size] = STATUS.pack(self._running, self._since, *self._seconds,
                                              *self._states)


class Capture:
    """fd 1 and 2 of this process, in a file: byte ranges of it are attributed to ranks.
    sys.stdout and sys.stderr become unbuffered text streams on fds 1 and 2, so a mark (taken
    at every greenlet switch) is one lseek unless a target replaced them (then they are flushed
    first, as a buffered stream would need)."""

    def __init__(self, path: str):
        self._write_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._read_fd = os.open(path, os.O_RDONLY)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._write_fd, 1)
        os.dup2(self._write_fd, 2)
        self._stdout, self._stderr = (
            io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                             errors="backslashreplace", write_through=True) for fd in (1, 2))
        sys.stdout, sys.stderr = self._stdout, self._stderr

    def mark(self) -> int:
        if sys.stdout is not self._stdout or sys.stderr is not self._stderr:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a target may close or replace the streams
                    pass
        return os.lseek(self._read_fd, 0, os.SEEK_END)

    def reset(self) -> None:
        if self.mark():  # most cases print nothing: no truncation to make
            os.ftruncate(self._write_fd, 0)

    def text(self, ranges) -> str:
        chunks, left = [], MAX_OUTPUT
        for start, end in ranges:
            if left <= 0:
                break
            chunk = os.pread(self._read_fd, min(end - start, left), start)
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")


class Worker:
    """One worker process: it reads the driver's messages in order and answers each (the
    protocol: pcpcheck.shared.protocol). A load loads a host (pcpcheck.worker.hosts: a gather
    target's ranks, or a vLLM release); a message of cases runs each on its host, a result
    message as each one ends. What the hosts share lives here: the device, the greenlet
    scheduler, the process group (None for `threads`), the status and capture files."""

    def __init__(self, config: dict):
        self.config = config
        self.reader = wire.Reader(config["in"])
        self.out = config["out"]
        self.device = torch.device(config.get("device", "cpu"))
        self.status = Status(config["status"])
        self.capture = Capture(config["capture"])
        # LoadRequest.key -> its host
        self.hosts: dict[tuple, hosts.GatherHost | hosts.ReleaseHost] = {}
        self.threads = ThreadRunner()
        self.adapter: GroupAdapter | None = None
        self.count = 0  # cases begun: on a process group, every rank numbers them alike
        self.poisoned = False  # the process group failed: every later collective aborts

    def serve(self) -> None:
        if self.config["mode"] != "threads":
            self.join_group()
        wire.send(self.out, protocol.ready_reply(os.getpid()))
        following = None
        while True:
            try:
                header, blobs = following or self.reader.recv()
            except wire.ChannelClosed:
                break
            following = None
            if protocol.operation(header) == protocol.LOAD:
                self.load(protocol.read_load(header))
            elif protocol.carries_cases(header):
                following = self.run_cases(protocol.read_cases(header, blobs))
            else:
                break
        os._exit(0)  # no interpreter teardown: a target's atexit handlers and threads do not run

    def load(self, request: protocol.LoadRequest) -> None:
        host, reply = hosts.load(request, self)
        if host is not None:
            self.hosts[request.key] = host
            gc.freeze()  # what the load made (modules, a release's files): out of collections
        wire.send(self.out, reply)

    def run_cases(self, cases: list[protocol.CaseRequest]):
        """A batch: its cases one after another, a result message as each one ends. On a process
        group, ranks do not wait for each other between the cases of a batch (the headers of
        CheckedGroup carry the case number), only before this worker goes idle (`finish`: a
        peer may be waiting in a collective this rank skipped); with the next batch already
        here, its cases' header rounds release such a peer instead. The next message, if any
        came: it is served next."""
        for case in cases:
            self.count += 1
            self.capture.reset()
            self.status.begin()
            host = self.hosts[case.key]
            results, blobs = host.run(case)
            for result in results:  # each rank's own running time in this case (the status file's)
                result["seconds"] = self.status.seconds(result["rank"])
            wire.send(self.out, protocol.result_reply(results, take_refused(), host.lines_run()),
                      blobs)
        if self.adapter is None or self.poisoned:
            return None
        try:
            following = self.reader.recv(time.monotonic())  # only what is here already
        except wire.ChannelClosed:
            following = None
        if following is None or not protocol.carries_cases(following[0]):
            self.poisoned = finish(self.adapter, self.device, self.count)
        return following

    def on_switch(self, ranges: list):
        """The greenlet scheduler's hook: what each rank prints (byte ranges of the capture file,
        per rank), and the status file."""
        began = [0]

        def on_switch(rank: int, state: int) -> None:
            position = self.capture.mark()
            if state == RUNNING:
                began[0] = position
            elif position > began[0]:
                ranges[rank].append((began[0], position))
            self.status.switch(rank, state)
        return on_switch

    def join_group(self) -> None:
        import datetime

        import torch.distributed as dist

        from pcpcheck.worker.process_group import GroupAdapter
        config = self.config
        backend = config["mode"]
        startup = datetime.timedelta(seconds=config["startup_timeout"])
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        kwargs: dict[str, Any] = {"device_id": self.device} if backend == "nccl" else {}
        if "port" in config:
            store = dist.TCPStore("127.0.0.1", config["port"], None, False, startup)
            dist.init_process_group(backend, store=store, rank=config["rank"],
                                    world_size=config["size"], timeout=startup, **kwargs)
        else:  # torchrun: env://
            dist.init_process_group(backend, timeout=startup, **kwargs)
        try:
            from torch.distributed.distributed_c10d import _set_pg_timeout
            # A rank may wait in a header round while a peer runs cases (each within timeout).
            _set_pg_timeout(datetime.timedelta(seconds=config["timeout"] * (MAX_AHEAD + 1)))
        except Exception:  # noqa: BLE001 - older torch: the startup timeout stays
            pass
        self.adapter = GroupAdapter(dist.group.WORLD, backend)


def main(config: dict) -> None:
    """The worker, in a process pcpcheck.backends.forkserver forked for it; never returns."""
    die_with_parent(config["parent"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it stops us
    try:
        Worker(config).serve()
    except BaseException as exc:  # noqa: BLE001 - pcpcheck's own failure (or a target's doing)
        try:
            wire.send(config["out"], protocol.fail_reply(exc))
        finally:
            os._exit(3)

