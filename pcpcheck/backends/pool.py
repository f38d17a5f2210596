"""Worker processes, from the driver's side: start, talk, time, stop, clean up.

Every worker is forked by this process's fork server (pcpcheck.backends.forkserver) into a
session of its own (Ctrl-C reaches only the driver; the whole session is killed at once), dies
with the server, which dies with the driver, and talks over two pipes. The driver is a child
subreaper, so a process a target double-forks out of its session is reparented here and killed
too. Each backend's files (capture, status) live in one temporary directory, removed when the
backend closes.
"""

from __future__ import annotations

import atexit
import mmap
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from pcpcheck.backends.forkserver import ForkServer, ForkServerError
from pcpcheck.shared import lifetime, protocol, wire
from pcpcheck.shared.defaults import MAX_RANKS
from pcpcheck.shared.protocol import MAX_OUTPUT, STATUS

_ROOT = str(Path(__file__).resolve().parents[2])  # what makes `pcpcheck` importable
_LIVE: dict[int, WorkerProcess] = {}  # pid -> worker, for the exit handler and orphan reaping
_WORKSPACES: set[str] = set()  # directories not removed yet (a backend never closed)
FORK_SERVER = ForkServer()  # this process's
SERVER_STARTUP = 120.0  # seconds for the fork server to start (import torch)


def _become_subreaper() -> None:
    lifetime.prctl(lifetime.PR_SET_CHILD_SUBREAPER, 1)


_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20  # a batch fits: the driver never waits for the worker to read it


def _widen(fd: int) -> None:
    """A pipe of PIPE_BYTES (Linux; the default 64 KiB elsewhere or above the system's limit)."""
    try:
        import fcntl
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, OSError):
        pass


class Workspace:
    """A backend's temporary directory."""

    def __init__(self, name: str):
        self.path = tempfile.mkdtemp(prefix=f"pcpcheck-{name}-")
        _WORKSPACES.add(self.path)
        self._count = 0

    def files(self, label: str) -> tuple[str, str]:
        self._count += 1
        stem = os.path.join(self.path, f"{label}-{self._count}")
        with open(stem + ".status", "wb") as handle:  # no rank running (zeros would read rank 0)
            handle.write(STATUS.pack(-1, 0.0, *[0.0] * MAX_RANKS, *[0] * MAX_RANKS))
        return stem + ".out", stem + ".status"

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        _WORKSPACES.discard(self.path)


class WorkerProcess:
    """One worker: its process, its two pipes, its status and capture files."""

    def __init__(self, workspace: Workspace, label: str, config: dict):
        _become_subreaper()
        self.label = label
        self.capture_path, status_path = workspace.files(label)
        to_worker, from_driver = os.pipe()  # the worker reads to_worker; we write from_driver
        from_worker, to_driver = os.pipe()
        for fd in (from_driver, to_driver):
            _widen(fd)
        config = dict(config, status=status_path, capture=self.capture_path)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        try:
            self.pid = FORK_SERVER.spawn(config, (to_worker, to_driver), env, SERVER_STARTUP)
        except (OSError, ForkServerError) as exc:  # no worker: its pipe reads closed, and
            self.pid, self._failure = -1, str(exc)  # exit_reason says why
        finally:
            os.close(to_worker)
            os.close(to_driver)
        _LIVE[self.pid] = self
        self._to_worker = from_driver
        os.set_blocking(from_driver, False)  # send() reads replies while the pipe is full
        self.reader = wire.Reader(from_worker)
        with open(status_path, "rb") as handle:
            self._status = mmap.mmap(handle.fileno(), STATUS.size, prot=mmap.PROT_READ)
        self.alive = True

    def send(self, header: dict, blobs=()) -> bool:
        """False if the worker is gone."""
        try:
            wire.send(self._to_worker, header, blobs, drain=self.reader)
            return True
        except (OSError, wire.ChannelClosed):
            return False

    def status(self) -> tuple[int, float, list[float], list[int]]:
        """(running rank or -1, since, seconds per rank, state per rank)."""
        return read_status(self._status)

    def overtime(self, timeout: float) -> int | None:
        """The rank that has run longer than `timeout` in this case, if any."""
        running, since, seconds, _ = self.status()
        if running >= 0 and seconds[running] + time.monotonic() - since > timeout:
            return running
        return None

    def exit_reason(self) -> str:
        """How the process ended (after EOF on its pipe)."""
        if self.pid < 0:
            return self._failure
        try:
            code = FORK_SERVER.wait(self.pid, 1.0)
        except ForkServerError:
            return "killed with pcpcheck's fork server, which is gone"
        if code is None:
            return "closed its pipe to pcpcheck"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def output_tail(self) -> str:
        try:
            with open(self.capture_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - MAX_OUTPUT))
                return handle.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """The worker's whole session and everything it left behind, now. Idempotent."""
        if not self.alive:
            return
        self.alive = False
        if self.pid > 0:
            _kill_session(self.pid)
            try:
                FORK_SERVER.wait(self.pid, 5.0)  # reaped: what it orphaned is reparented here
            except ForkServerError:
                pass  # it went with its server
        _LIVE.pop(self.pid, None)
        for fd in (self._to_worker, self.reader.fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._status.close()
        _reap_orphans()


def _kill_session(sid: int) -> None:
    try:
        os.killpg(sid, signal.SIGKILL)
    except OSError:
        pass
    for pid, _, session in _processes():
        if session == sid:
            _kill(pid)


def _processes():
    """(pid, parent pid, session id) of every process we can see."""
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            yield int(entry.name), int(fields[1]), int(fields[3])
        except (OSError, IndexError, ValueError):
            continue


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _reap_orphans() -> None:
    """Processes a target double-forked into a session of their own: reparented to this
    subreaper, they are our children but not workers nor in our session."""
    me, mine = os.getpid(), os.getsid(0)
    for pid, parent, session in _processes():
        if parent == me and pid not in _LIVE and pid not in ForkServer.pids and session != mine:
            _kill(pid)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


@atexit.register
def _kill_all() -> None:
    """A backend never closed (an exception between start and close): its workers and files."""
    for worker in list(_LIVE.values()):
        worker.kill()
    FORK_SERVER.stop()
    for path in list(_WORKSPACES):
        shutil.rmtree(path, ignore_errors=True)


def _tell_slow(workers, now: float, on_slow, told: int) -> int:
    """Tell on_slow of the longest-running rank as its running time passes each whole second
    from SLOW on (`told`: the whole seconds told last); the whole seconds told now."""
    longest = max(((seconds[running] + now - since, running) for running, since, seconds, _
                   in (worker.status() for worker in workers) if running >= 0), default=None)
    if longest is None or longest[0] < SLOW or int(longest[0]) <= told:
        return told
    on_slow(longest[1], longest[0])
    return int(longest[0])


def read_status(status) -> tuple[int, float, list[float], list[int]]:
    """A worker's status file (an mmap the worker writes at every switch), decoded."""
    data = status[:STATUS.size]
    for _ in range(3):  # a read torn by a concurrent write differs from the next one
        again = status[:STATUS.size]
        if again == data:
            break
        data = again
    values = STATUS.unpack(data)
    return values[0], values[1], list(values[2:2 + MAX_RANKS]), list(values[2 + MAX_RANKS:])


SLOW = 1.0  # seconds a rank runs on one case before wait_results tells on_slow, once a second


def wait_results(workers: list[WorkerProcess], timeout: float, grace: float, watch: bool = False,
                 on_slow=None):
    """One message per worker, or why none came: {index: ("result", header, blobs) |
    ("died", reason) | ("hung", rank) | ("late", None)}. A worker whose rank runs longer than
    `timeout` is hung; after a death or a hang the others get `grace` seconds to report.
    `watch`: a worker that has reported but runs on (a later case) is watched too: hung there,
    it is ("ahead", rank). `on_slow(rank, seconds)`: the longest-running rank of those awaited,
    once a second while one has run SLOW seconds or more."""
    import select
    outcome: dict[int, tuple] = {}
    pending = dict(enumerate(workers))
    hard_deadline = None
    tick = min(0.2, timeout / 4)
    # Told by the rank's own running time, read every tick, not on a clock of our own: a rank
    # that began before we came to wait, or just after a tell, is told before its hang is called.
    told = 0
    while pending:
        now = time.monotonic()
        buffered = any(w.reader.buffered for w in pending.values())  # read while sending
        if on_slow is not None and not buffered:  # nothing to wait for where a reply is here
            told = _tell_slow(pending.values(), now, on_slow, told)
        if hard_deadline is not None and now >= hard_deadline:
            break
        wait = 0 if buffered else tick if hard_deadline is None else min(tick, hard_deadline - now)
        ready = select.select([w.reader.fd for w in pending.values()], [], [], max(wait, 0))[0]
        for index, worker in list(pending.items()):
            if worker.reader.fd in ready or worker.reader.buffered:
                try:
                    message = worker.reader.recv(time.monotonic())
                except wire.ChannelClosed:
                    outcome[index] = ("died", worker.exit_reason())
                    message = None
                else:
                    if message is None:
                        continue
                    header, blobs = message
                    failed = protocol.failure(header)
                    if failed is not None:
                        outcome[index] = ("died", f"pcpcheck's worker failed: {failed}")
                    else:
                        outcome[index] = ("result", header, blobs)
                del pending[index]
                if outcome[index][0] == "died":
                    hard_deadline = min(hard_deadline or now + grace, now + grace)
                continue
            rank = worker.overtime(timeout)
            if rank is not None:
                if on_slow is not None:  # a loop starved past a whole second: tell it first
                    told = _tell_slow([worker], time.monotonic(), on_slow, told)
                outcome[index] = ("hung", rank)
                del pending[index]
                hard_deadline = min(hard_deadline or now + grace, now + grace)
        for index, worker in enumerate(workers) if watch else ():
            rank = None if index in pending or outcome[index][0] != "result" else worker.overtime(timeout)
            if rank is not None:
                outcome[index] = ("ahead", rank)
                hard_deadline = min(hard_deadline or now + grace, now + grace)
    for index in pending:
        outcome[index] = ("late", None)
    return outcome
