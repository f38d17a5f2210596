"""The fork server: one process per driver that imports torch and the worker's modules once, then
forks every worker from that state. A fresh interpreter costs a worker about a second of CPU
(importing torch); a fork costs milliseconds.

    python -m pcpcheck.backends.forkserver SOCKET_FD        (started by the driver, ForkServer)

The server never loads a target; each forked worker does, in a process of its own that starts
as the worker always has: a session of its own, fd 0 on /dev/null, fd 1 and 2 on its capture
file, only its two pipes open, killed by the kernel when the server dies (PR_SET_PDEATHSIG).
The server in turn ends, killing its workers' sessions, when the driver's end of its socket
closes, even when the driver was SIGKILLed. It runs in a session of its own (Ctrl-C is the
driver's). The `pcpcheck` command forks it from itself at its start (ForkServer.prefork); any
other driver starts it as a fresh interpreter, since a driver may run threads, and a child
forked after its parent ran a parallel torch op hangs in its first one (GNU OpenMP).

Requests and replies (pcpcheck.shared.protocol: spawn, wait) are JSON datagrams on a
SOCK_SEQPACKET pair; a worker's two pipe ends travel with its request (SCM_RIGHTS).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from pcpcheck.shared import lifetime, protocol

_MESSAGE_BYTES = 1 << 20  # a request carries the driver's environment


def _send(sock: socket.socket, message: dict, fds=()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


# --- the server -------------------------------------------------------------------------------
class _Server:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.workers: set[int] = set()  # forked and not yet reaped
        self.exit_codes: dict[int, int] = {}  # reaped: pid -> exit code (-N: killed by signal N)

    def serve(self) -> None:
        while True:
            self._reap()
            if not select.select([self.sock], [], [], 0.2)[0]:
                continue
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, _MESSAGE_BYTES, 2)
            except OSError:
                data, fds = b"", []
            if not data:  # the driver is gone
                break
            kind, request = protocol.read_fork_request(json.loads(data))
            reply: dict[str, int | None]  # wait: None, the driver went first
            if kind == protocol.SPAWN:
                reply = {"pid": self._spawn(request, fds)}
            else:
                reply = {"code": self._wait(request["pid"], request["seconds"])}
            try:
                _send(self.sock, reply)
            except OSError:  # the driver went while it waited for this reply
                break
        for pid in self.workers:
            _kill_group(pid)
        os._exit(0)

    def _reap(self) -> None:
        while self.workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.workers.discard(pid)
            self.exit_codes[pid] = os.waitstatus_to_exitcode(status)

    def _wait(self, pid: int, seconds: float) -> int | None:
        """The worker's exit code once it exits within `seconds`; None at once if the driver
        goes meanwhile (it sends nothing while it waits: its end readable is its end closed), so
        a killed driver's server does not outlive it by the rest of the wait."""
        deadline = time.monotonic() + seconds
        while pid not in self.exit_codes and pid in self.workers:
            self._reap()
            if time.monotonic() >= deadline or select.select([self.sock], [], [], 0.005)[0]:
                break
        return self.exit_codes.get(pid)

    def _spawn(self, request: dict, fds: list[int]) -> int:
        config = dict(request["config"], parent=os.getpid(), **{"in": fds[0], "out": fds[1]})
        pid = os.fork()
        if pid == 0:
            try:
                _become_worker(config, fds, request["env"], request["cwd"])
            finally:
                os._exit(3)
        for fd in fds:
            os.close(fd)
        self.exit_codes.pop(pid, None)  # a pid reused
        self.workers.add(pid)
        return pid


def _name_process(name: bytes) -> None:
    """What `ps -o comm`, top and /proc/PID/comm show."""
    lifetime.prctl(lifetime.PR_SET_NAME, name)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _become_worker(config: dict, keep: list[int], env: dict, cwd: str) -> None:
    """In the forked child: what a worker started as a fresh process by the driver had (its
    environment and directory, a new session, the std streams, no other fd), then the worker
    itself (it never returns)."""
    import random

    from pcpcheck.worker import main as worker
    os.setsid()
    _name_process(b"pcpcheck-worker")
    _enter(env, cwd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    capture = os.open(config["capture"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(capture, 1)
    os.dup2(capture, 2)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    random.seed()  # not the server's sequence, shared by every worker
    worker.main(config)


def _enter(env: dict, cwd: str) -> None:
    """The driver's environment and directory now, and the sys.path a fresh `python -m` would
    build from them: cwd, then PYTHONPATH's entries, then the rest (stdlib, site-packages)."""
    def head(directory: str, environ) -> list[str]:
        entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        return list(dict.fromkeys([directory, *(os.path.join(directory, p) for p in entries)]))
    ours = set(head(os.getcwd(), os.environ))  # what the server's own start put first
    skip = 0
    while skip < len(sys.path) and sys.path[skip] in ours:
        skip += 1
    rest = sys.path[skip:]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[:] = [*head(cwd, env), *rest]


def _preload() -> None:
    """Everything a worker imports before it loads a target."""
    import torch.distributed  # noqa: F401 - gloo and nccl workers join a group

    import pcpcheck.worker.loader  # the worker's load path
    import pcpcheck.worker.main  # noqa: F401 - the worker itself


def _run(sock: socket.socket) -> None:
    """The server, once its socket is its only descriptor besides 0-2; never returns."""
    _name_process(b"pcpcheck-server")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _preload()
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which names it
        _send(sock, protocol.fail_reply(exc, 300))
        os._exit(3)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)  # the driver reads our stderr only to say why we failed to start
    os.close(null)
    _send(sock, protocol.ready_reply())
    _Server(sock).serve()


def main() -> None:
    _run(socket.socket(fileno=int(sys.argv[1])))


# --- the driver's side ------------------------------------------------------------------------
class ForkServerError(RuntimeError):
    pass


class ForkServer:
    """This process's fork server, started on first use (or by prefork); a process forked from
    this one (a `--jobs` driver) starts its own."""

    pids: set[int] = set()  # every running server of this process (none is an orphan to reap)

    def __init__(self):
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen | None = None  # started as a fresh interpreter
        self.pid: int | None = None
        self._ready = False
        os.register_at_fork(after_in_child=self._forget)

    def prefork(self) -> None:
        """Start the server now, as a fork of this process: it saves the server's interpreter
        start (about a second), and is safe only while this process runs no thread of its own
        and has run no torch op (GNU OpenMP): the command line, at its start."""
        with self._lock:
            if self._sock is not None:
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            pid = os.fork()
            if pid == 0:
                try:
                    os.setsid()
                    null = os.open(os.devnull, os.O_RDWR)
                    for fd in (0, 1, 2):
                        os.dup2(null, fd)
                    keep = theirs.fileno()
                    os.closerange(3, keep)
                    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
                    _run(theirs)
                finally:
                    os._exit(3)
            theirs.close()
            self._sock, self.pid, self._ready = ours, pid, False
            ForkServer.pids.add(pid)

    def spawn(self, config: dict, fds: tuple[int, int], env: dict, timeout: float) -> int:
        """A worker running `config` with pipe ends `fds` (its "in", "out"); its pid. `env`:
        the worker's environment (and a fresh server's); `timeout`: for a server to start."""
        request = protocol.spawn_request(config, env, os.getcwd())
        with self._lock:
            reply = self._started(env, timeout) and self._request(request, fds)
            if not reply:  # the server died (killed from outside): once more, on a new one
                self._stop()
                reply = self._started(env, timeout) and self._request(request, fds)
            if not reply:
                raise ForkServerError("pcpcheck's fork server ended while starting a worker")
            return reply["pid"]

    def wait(self, pid: int, seconds: float) -> int | None:
        """The exit code of a worker (-N: killed by signal N) once it exits within `seconds`;
        ForkServerError if the server is gone (its workers went with it)."""
        with self._lock:
            reply = self._request(protocol.wait_request(pid, seconds)) if self._ready else None
        if reply is None:
            raise ForkServerError("pcpcheck's fork server is gone")
        return reply["code"]

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _request(self, message: dict, fds=()) -> dict | None:
        assert self._sock is not None  # the server was started (_started, or _ready)
        try:
            _send(self._sock, message, fds)
            data = self._sock.recv(_MESSAGE_BYTES)
        except OSError:
            return None
        return json.loads(data) if data else None

    def _started(self, env: dict, timeout: float) -> bool:
        """The server started (a fresh interpreter, unless preforked) and ready; else
        ForkServerError saying why not."""
        if self._sock is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "pcpcheck.backends.forkserver", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    env=env, pass_fds=(theirs.fileno(),), start_new_session=True, close_fds=True)
            finally:
                theirs.close()
            self._sock, self.pid, self._ready = ours, self._process.pid, False
            ForkServer.pids.add(self.pid)
        if not self._ready:
            ready = select.select([self._sock], [], [], timeout)[0]
            data = self._sock.recv(_MESSAGE_BYTES) if ready else None
            message = json.loads(data) if data else {}
            stderr = self._process.stderr if self._process else None
            if not protocol.is_ready(message):
                told = stderr.read().decode("utf-8", "replace").strip().splitlines() if (
                    stderr and data is not None) else []  # it ended: its stderr is complete
                code = self._stop()
                why = (f"not ready within {timeout:g} s" if data is None
                       else protocol.failure(message) or (told[-1][:300] if told else f"exit code {code}"))
                raise ForkServerError(f"pcpcheck's fork server did not start ({why})")
            if stderr:
                stderr.close()
            self._ready = True
        return True

    def _stop(self) -> int | None:
        """Close our end (the server kills its workers and exits) and reap it; its exit code."""
        if self._sock is None:
            return None
        self._sock.close()
        pid, self._sock, self._ready, self.pid = self.pid, None, False, None
        assert pid is not None  # set with the socket
        ForkServer.pids.discard(pid)
        process, self._process = self._process, None
        deadline = time.monotonic() + 5.0
        while True:  # not Popen.wait: a preforked server is no Popen
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return process.returncode if process else None
            if done:
                if process:
                    process.returncode = os.waitstatus_to_exitcode(status)
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                _kill_group(pid)
                deadline = float("inf")
            time.sleep(0.005)

    def _forget(self) -> None:
        """In a forked child: the parent's server is not ours to use or stop."""
        self._lock = threading.Lock()
        if self._sock is not None:
            self._sock.close()
        self._sock, self._process, self.pid, self._ready = None, None, None, False
        ForkServer.pids.clear()


if __name__ == "__main__":
    main()
