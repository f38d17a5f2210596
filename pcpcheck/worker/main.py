"""Where a rank runs: the worker process, the only process that imports and calls the target.
Each is forked by the driver's fork server (pcpcheck.backends.forkserver).

A worker hosts either every rank of a world as greenlets (`threads`: pcpcheck.worker.runner
schedules them) or one rank of a torch.distributed group (`gloo`, `nccl`, `torchrun`). It loads its own
instance of the target per rank it hosts (the file executed once per rank, under distinct module
names: module globals are never shared between ranks), builds each rank's inputs from the bytes
the driver sent, calls the target, and sends back plain data (pcpcheck.shared.messages): errors,
collective traces, what each rank printed, and the raw bytes of the returned and input tensors.
It never judges. The driver decodes, judges, and stops a worker whose rank runs out of time:
the worker publishes which rank runs, and for how long, in a small shared status file.

File descriptors 1 and 2 go to a capture file: what a rank prints, even at the fd level, is
attributed to the rank that was running and reported with it, truncated.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import sys
import time

import torch

from pcpcheck.shared import wire
from pcpcheck.shared.errors import LoadError
from pcpcheck.shared.lifetime import die_with_parent
from pcpcheck.shared.messages import (FINISHED, MAX_AHEAD, MAX_OUTPUT, MAX_RANKS, RELEASE, RUNNING,
                                      STATUS, STEP_FIELDS, WAITING, encode_rank, rank_inputs,
                                      trace_entry)
from pcpcheck.worker.process_group import finish
from pcpcheck.worker.runner import CollectiveAborted, RankOutcome, ThreadRunner

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
    """fd 1 and 2 of this process, in a file: byte ranges of it are attributed to ranks."""

    def __init__(self, path: str):
        self._write_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._read_fd = os.open(path, os.O_RDONLY)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._write_fd, 1)
        os.dup2(self._write_fd, 2)

    def mark(self) -> int:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a target may close or replace the streams
                pass
        return os.fstat(self._read_fd).st_size

    def reset(self) -> None:
        self.mark()
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
    def __init__(self, config: dict):
        self.config = config
        self.reader = wire.Reader(config["in"])
        self.out = config["out"]
        self.device = torch.device(config.get("device", "cpu"))
        self.status = Status(config["status"])
        self.capture = Capture(config["capture"])
        self.targets: dict[tuple, list] = {}
        self.threads = ThreadRunner()
        self.adapter = None
        self.count = 0  # cases begun: on a process group, every rank numbers them alike
        self.poisoned = False  # the process group failed: every later collective aborts

    # --- loading ----------------------------------------------------------------------------
    def load(self, header: dict) -> None:
        from pcpcheck.worker.loader import load_target
        if header["function"] == RELEASE:
            self.load_release(header)
            return
        key = (header["source"], header["function"])
        try:
            copies = [load_target(header["source"], header["function"] or None)
                      for _ in range(header["copies"])]
        except LoadError as exc:
            wire.send(self.out, {"op": "load_error", "message": str(exc)})
            return
        except BaseException as exc:  # noqa: BLE001
            wire.send(self.out, {"op": "load_error",
                                 "message": f"{header['source']}: loading failed: {type(exc).__name__}: {exc}"[:300]})
            return
        self.targets[key] = copies
        first = copies[0]
        wire.send(self.out, {"op": "loaded", "name": first.name, "stand_ins": list(first.stand_ins),
                             "accepts_shard": first.accepts_shard, "accepts_group": first.accepts_group,
                             "source": first.source, "function_name": first.function_name})

    def load_release(self, header: dict) -> None:
        """A vLLM release (`pcpcheck vllm`): its manager and gather executed here, its
        capabilities read from its code; the reply describes it in plain data."""
        from dataclasses import asdict
        from pcpcheck.vllm.release import release_from_spec
        try:
            release = release_from_spec(json.loads(header["source"]))
        except BaseException as exc:  # noqa: BLE001 - SourceError, InterfaceDrift, anything else
            kind = type(exc).__name__
            text = str(exc).splitlines()[0] if str(exc) else kind
            if kind not in ("InterfaceDrift", "SourceError", "LoadError"):
                text = f"loading the release failed: {kind}: {text}"
            wire.send(self.out, {"op": "load_error", "kind": kind, "message": text[:500]})
            return
        self.targets[(header["source"], header["function"])] = [release]
        wire.send(self.out, {
            "op": "loaded", "name": release.name, "stand_ins": list(release.stand_ins),
            "accepts_shard": release.caps.gather_shard,
            "function_name": release.gather.function_name,
            "release": {"release": release.source.release, "source": release.source.spec(),
                        "files": release.files, "adapted": list(release.adapted),
                        "caps": asdict(release.caps), "paths": release.paths}})

    # --- cases ------------------------------------------------------------------------------
    def cases(self, header: dict, blobs: list):
        """A batch: its cases one after another, a result message as each one ends. On a process
        group, ranks do not wait for each other between the cases of a batch (the headers of
        CheckedGroup carry the case number), only before this worker goes idle (`finish`: a
        peer may be waiting in a collective this rank skipped); with the next batch already
        here, its cases' header rounds release such a peer instead. The next message, if any
        came: it is served next."""
        offset = 0
        for case, count in zip(header["cases"], header["counts"]):
            self.case(case, blobs[offset:offset + count])
            offset += count
        if self.adapter is None or self.poisoned:
            return None
        try:
            following = self.reader.recv(time.monotonic())  # only what is here already
        except wire.ChannelClosed:
            following = None
        if following is None or following[0].get("op") != "cases":
            self.poisoned = finish(self.adapter, self.device, self.count)
        return following

    def case(self, header: dict, blobs: list) -> None:
        targets = self.targets[(header["source"], header["function"])]
        self.count += 1
        self.capture.reset()
        self.status.begin()
        if "step" in header:
            results, out_blobs = self._release_case(header)
        elif self.adapter is None:
            results, out_blobs = self._threads_case(header, blobs, targets)
        else:
            results, out_blobs = self._rank_case(header, blobs, targets[0])
        for result in results:  # each rank's own running time in this case (the status file's)
            result["seconds"] = self.status.seconds(result["rank"])
        wire.send(self.out, {"op": "result", "ranks": results}, out_blobs)

    def _on_switch(self, ranges: list):
        """The greenlet scheduler's hook: what each rank prints, and the status file."""
        began = [0]

        def on_switch(rank: int, state: int) -> None:
            position = self.capture.mark()
            if state == RUNNING:
                began[0] = position
            elif position > began[0]:
                ranges[rank].append((began[0], position))
            self.status.switch(rank, state)
        return on_switch

    def _release_case(self, header):
        """A release's step on every rank as greenlets: rank_step lays it out with the rank's
        own PCPManager and calls the release's entry; the layout goes back as plain data."""
        from pcpcheck.vllm.step import rank_step
        size, case_json, spec = header["size"], header["step"], json.loads(header["source"])
        ranges = [[] for _ in range(size)]
        outcomes = self.threads.run(size, lambda rank: rank_step(case_json, spec, rank),
                                    self._on_switch(ranges))
        out_blobs: list = []
        results = []
        for rank, outcome in enumerate(outcomes):
            step = outcome.value if isinstance(outcome.value, dict) else None
            text = self.capture.text(ranges[rank])
            if step is not None and step.get("inputs") is not None:
                second = step.get("group1")
                split = second["trace_from"] if second else len(outcome.trace)
                call = RankOutcome(value=step["value"], error=step["error"],
                                   error_detail=step["error_detail"], trace=outcome.trace[:split])
                result = encode_rank(rank, call, step["inputs"], text, out_blobs)
                if second:  # the replicated KV group's call: its own outputs and collectives
                    call = RankOutcome(value=second["value"], error=second["error"],
                                       error_detail=second["error_detail"],
                                       trace=outcome.trace[split:])
                    result["group1"] = encode_rank(rank, call, second["inputs"], "", out_blobs)
            else:  # no call: the manager raised (in the step), or rank_step itself did
                result = {"rank": rank, "error": outcome.error, "error_detail": outcome.error_detail,
                          "trace": [trace_entry(e) for e in outcome.trace], "output": text,
                          "value": None, "inputs_after": None}
            result["step"] = None if step is None else {key: step.get(key) for key in STEP_FIELDS}
            results.append(result)
        return results, out_blobs

    def _threads_case(self, header, blobs, targets):
        from pcpcheck.worker.rankctx import current_group
        size, shard = header["size"], header["shard"]
        inputs = [rank_inputs(header, blobs, rank, self.device) for rank in range(size)]
        ranges = [[] for _ in range(size)]
        on_switch = self._on_switch(ranges)

        def call(rank: int):
            tensors, slots, nd, _ = inputs[rank]
            return targets[rank].call(tensors, slots, nd, shard, group=current_group())

        outcomes = self.threads.run(size, call, on_switch)
        out_blobs: list = []
        results = [encode_rank(rank, outcomes[rank], inputs[rank], self.capture.text(ranges[rank]),
                               out_blobs, sent=inputs[rank][3]) for rank in range(size)]
        return results, out_blobs

    def _rank_case(self, header, blobs, target):
        from pcpcheck.worker.process_group import CheckedGroup
        rank = self.adapter.rank_in_group
        inputs = rank_inputs(header, blobs, 0, self.device)
        outcome = RankOutcome()

        def on_wait(waiting: bool) -> None:
            self.status.switch(rank, WAITING if waiting else RUNNING)

        group = CheckedGroup(self.adapter, self.device, outcome.trace, on_wait, self.count,
                             self.poisoned)
        self.status.switch(rank, RUNNING)
        try:
            outcome.value = target.call(inputs[0], inputs[1], inputs[2], header["shard"], group=group)
        except CollectiveAborted:
            pass  # recorded in the trace
        except BaseException as exc:  # noqa: BLE001 - a target may raise anything, even SystemExit
            outcome.record_error(exc)
        self.status.switch(rank, FINISHED)
        self.poisoned = group.poisoned
        end = self.capture.mark()
        out_blobs: list = []
        result = encode_rank(rank, outcome, inputs, self.capture.text([(0, end)]), out_blobs,
                             sent=inputs[3])
        result["poisoned"] = group.poisoned
        return [result], out_blobs

    # --- process group ----------------------------------------------------------------------
    def join_group(self) -> None:
        import datetime
        import torch.distributed as dist
        from pcpcheck.worker.process_group import GroupAdapter
        config = self.config
        backend = config["mode"]
        startup = datetime.timedelta(seconds=config["startup_timeout"])
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        kwargs = {"device_id": self.device} if backend == "nccl" else {}
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

    def serve(self) -> None:
        if self.config["mode"] != "threads":
            self.join_group()
        wire.send(self.out, {"op": "ready", "pid": os.getpid()})
        following = None
        while True:
            try:
                header, blobs = following or self.reader.recv()
            except wire.ChannelClosed:
                break
            following = None
            if header["op"] == "load":
                self.load(header)
            elif header["op"] == "cases":
                following = self.cases(header, blobs)
            elif header["op"] == "case":  # torchrun: one case a message
                following = self.cases({"cases": [header], "counts": [len(blobs)]}, blobs)
            else:
                break
        os._exit(0)  # no interpreter teardown: a target's atexit handlers and threads do not run


def main(config: dict) -> None:
    """The worker, in a process pcpcheck.backends.forkserver forked for it; never returns."""
    die_with_parent(config["parent"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it stops us
    try:
        Worker(config).serve()
    except BaseException as exc:  # noqa: BLE001 - pcpcheck's own failure (or a target's doing)
        try:
            wire.send(config["out"], {"op": "fail", "message": f"{type(exc).__name__}: {exc}"[:500]})
        finally:
            os._exit(3)

