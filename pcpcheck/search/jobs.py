"""`--jobs N`: the regimes of a check searched by N driver processes at once, each with its own
backend (its own worker process hosting the target).

A regime's search depends only on its seed, so which process runs it does not change its
result. The drivers are forked before any backend exists: they are the judge's own code (the
target still runs only in their workers); they die with the parent (PR_SET_PDEATHSIG), and
hand back plain results through a pipe. The parent hands out regimes one at a time, in order,
to whichever driver is free, and relays progress.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from multiprocessing.connection import Connection, wait
from types import SimpleNamespace
from typing import cast

from pcpcheck.shared.lifetime import die_with_parent

_PROGRESS_EVERY_S = 0.25


def _stop(signum, frame):
    raise SystemExit(1)


def _driver(connection, open_backend, search_regime) -> None:
    """A forked driver: open a backend, report the target, then search the regimes it is sent
    (index, deadline) until it is sent None."""
    die_with_parent(os.getppid())  # as a worker dies with its driver
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it stops us
    signal.signal(signal.SIGTERM, _stop)  # the parent's stop: close the backend, then exit
    try:
        runner, target = open_backend()
    except BaseException as exc:  # noqa: BLE001 - LoadError, WorkerError: the parent raises it
        connection.send(("error", exc))
        os._exit(0)
    try:
        connection.send(("loaded", target))
        while (task := connection.recv()) is not None:
            index, deadline = task
            shown = [0.0]

            def on_case(result, index=index):
                now = time.monotonic()
                if now - shown[0] >= _PROGRESS_EVERY_S:
                    shown[0] = now
                    connection.send(("case", index, result.cases, dict(result.violated),
                                     result.slowest_call))

            def on_wait(rank, seconds, phase, index=index):
                connection.send(("wait", index, rank, seconds, phase))

            connection.send(("done", index, search_regime(index, target, runner, deadline, on_case,
                                                          on_wait)))
    except BaseException as exc:  # noqa: BLE001 - CheckerError or pcpcheck's own failure
        try:
            connection.send(("error", exc))
        except Exception:  # noqa: BLE001 - e.g. an exception that cannot be pickled
            connection.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        runner.close()
        os._exit(0)  # no teardown of what the parent left in this forked copy


def budget_share(deadline: float | None, regimes_left: int, drivers: int = 1) -> float | None:
    """The deadline of the next regime handed out: an equal share of the time left per regime
    still to run on each driver (None: no budget)."""
    if deadline is None:
        return None
    now = time.monotonic()
    return now + (deadline - now) / -(-regimes_left // drivers)


def search_in_parallel(count: int, jobs: int, open_backend, search_regime, *, budget_s=None,
                       on_loaded=None, on_case=None, on_wait=None, on_done=None) -> list:
    """Results of search_regime(index, target, runner, deadline, on_case, on_wait) for index in
    range(count), computed by `jobs` forked drivers; each opens its backend with
    open_backend() -> (runner, target). on_loaded(target) once, on_case(index, progress) (an
    object with .cases, .violated and .slowest_call), on_wait(index, rank, seconds, phase) and
    on_done(index, result) as they come. The budget
    (seconds from the first driver's target loaded, as in a sequential run) is shared out like a
    sequential run's: each regime, when handed out, gets an equal share of what is left per
    driver."""
    context = multiprocessing.get_context("fork")
    drivers = []
    for _ in range(min(jobs, count)):
        parent_end, child_end = context.Pipe()
        process = context.Process(target=_driver, args=(child_end, open_backend, search_regime),
                                  daemon=True)
        process.start()
        child_end.close()
        drivers.append((process, parent_end))
    results: list = [None] * count
    next_index, loaded, complete, deadline = 0, False, False, None
    busy = {id(conn): False for _, conn in drivers}
    active = [conn for _, conn in drivers]  # not yet told to end
    try:
        while any(r is None for r in results):
            ready = cast("list[Connection]", wait(active))  # it returns what it was given
            for conn in ready:
                try:
                    message = conn.recv()
                except EOFError:
                    raise RuntimeError("a search process ended without its result") from None
                kind = message[0]
                if kind == "error":
                    raise message[1]
                if kind == "loaded" and not loaded:
                    loaded = True
                    if budget_s is not None:
                        deadline = time.monotonic() + budget_s
                    if on_loaded is not None:
                        on_loaded(message[1])
                elif kind == "case" and on_case is not None:
                    on_case(message[1], SimpleNamespace(cases=message[2], violated=Counter(message[3]),
                                                        slowest_call=message[4]))
                elif kind == "wait" and on_wait is not None:
                    on_wait(*message[1:])
                elif kind == "done":
                    results[message[1]] = message[2]
                    busy[id(conn)] = False
                    if on_done is not None:
                        on_done(message[1], message[2])
                if kind in ("loaded", "done") and not busy[id(conn)]:
                    if next_index < count:
                        conn.send((next_index, budget_share(deadline, count - next_index, len(drivers))))
                        busy[id(conn)] = True
                        next_index += 1
                    else:
                        conn.send(None)
                        active.remove(conn)
        complete = True
        return results
    finally:  # done: the drivers were told to end; else (an error, Ctrl-C) they are stopped
        for process, _ in drivers:
            if not complete:
                process.terminate()
        for process, _ in drivers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
