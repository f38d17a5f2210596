"""Real ranks: the target runs in P torch.distributed processes (gloo on CPU, NCCL on GPUs).

Two ways to run, one rank-side code path (`_run_rank`) and one case format (`Case.to_json()`):

- **spawn** (`pcpcheck check --backend gloo|nccl`, `ProcessRunner`): the driver (hypothesis,
  judging, report) stays in the main process, outside the process group. Per world size P a pool
  of P worker processes is spawned once (torch.multiprocessing, spawn context) and joins a group
  through a TCPStore the driver hosts on a free loopback port (no port race). The driver sends
  each case to the workers over pipes and collects their `RankView`s with a deadline.
  Why not rank 0 driving with broadcast_object_list, as under torchrun: a driver that is itself
  a rank can be stuck in the very collective that hangs (or in the target), and a hung process
  group cannot be aborted or rebuilt from inside it. A driver outside the group is never in a
  collective: it waits on pipes with a timeout, kills a broken pool and spawns a fresh one, so a
  hung or dead rank costs one case, not the run, and hypothesis keeps searching and shrinking.
- **torchrun** (`torchrun --standalone --nproc-per-node P -m pcpcheck.procs [check args]`,
  `TorchrunRunner`): every process joins the env:// group torchrun set up; rank 0 runs the
  normal `pcpcheck check` and broadcasts each case (`broadcast_object_list`), every rank runs
  it, rank 0 collects the views (`gather_object`) and judges; at the end it broadcasts stop.
  A rank that never returns (gloo timeout on rank 0's gather) breaks the group for good: that
  case is reported as a COLLECTIVE violation and every later case of the run returns the same
  observation (a group made by torchrun cannot be rebuilt); rank 0 then exits without waiting.

Collectives. Each rank's group is a vLLM-style view of the real process group
(`impl.ProcessGroupAdapter(dist.group.WORLD)`) wrapped by `_RankGroup`, which records every
all_gather into the rank's trace as `("all_gather", dim, shape, dtype)` (what runner.ThreadWorld
records) and, before the real collective, exchanges a fixed-size header (16 int64) on every rank:
- headers disagree (dim, shape, dtype): every rank raises `CollectiveAborted` instead of handing
  gloo/NCCL unequal shapes (which can crash or hang the backend);
- a rank that returned or raised joins the header rounds with a FINISHED header until every rank
  has finished: a rank waiting in a collective that a peer skipped sees FINISHED and aborts at
  once (trace entry `(INCOMPLETE, "... a peer never joined it ...")`), exactly the deadlock
  detection of the thread runner, without waiting for a timeout. Every rank issues the same
  number of gloo operations, so the group stays usable for the next case.
Only a rank that never returns (sleeps, loops) or dies needs the timeout: gloo's own timeout
(`--timeout`) fails its peers' collectives, the driver waits `--timeout` plus a short grace, marks
the missing ranks `(INCOMPLETE, "rank r did not return within T s")`, kills the pool (terminate,
then kill; no orphans) and starts a fresh one for the next case. Worker stderr goes to a file per
rank; its tail is attached to the report of a rank that died or hung.

Judging is the in-process code: `check.prepare` builds the inputs on each rank, `check.observe`
(with the torch cache-write op `impl.write_kv_cache`, on the rank's device) builds its RankView,
the driver calls `check.judge`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import tempfile
import time
import traceback
import types
import zlib
from multiprocessing.connection import wait as wait_connections

import torch

from pcpcheck.check import Observation, RankView, judge, observe, prepare
from pcpcheck.engine import CheckerError
from pcpcheck.runner import CollectiveAborted, RankOutcome, ThreadRunner
from spec.invariants import INCOMPLETE

BACKENDS = ("threads", "gloo", "nccl")
PROCESS_BACKENDS = ("gloo", "nccl")
STARTUP_TIMEOUT = 120.0  # seconds for a pool to spawn, import torch and join the group
GRACE = 1.5  # seconds the driver waits past --timeout for the survivors' own reports

# header of a collective: [kind, dim, ndim, dtype code, shape (12, -1 padded)]
_HEADER = 16
_GATHER, _FINISHED = 1, 2
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]
_DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else 1000 + zlib.crc32(str(dtype).encode()) % 10**6


def _dtype_name(code: int) -> str:
    return str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else f"dtype#{code}"


def _shape_text(header: list[int]) -> str:
    ndim = header[2]
    shape = header[4:4 + ndim] if ndim <= _HEADER - 4 else ["..."]
    return f"dim {header[1]} ({', '.join(map(str, shape))}{',' if ndim == 1 else ''}) {_dtype_name(header[3])}"


# --- rank side (spawn workers and torchrun ranks) ---------------------------------------------

class _RankGroup:
    """The vLLM-style group a rank sees (world_size, rank_in_group, all_gather), over the real
    process group; records the trace and keeps the ranks' collective sequences aligned."""

    def __init__(self, adapter, device: torch.device, trace: list, notify=None):
        self._adapter = adapter
        self._device = device
        self._trace = trace
        self._notify = notify or (lambda entry: None)
        self.world_size = adapter.world_size
        self.rank_in_group = adapter.rank_in_group
        self.poisoned = False  # the backend itself failed: the group cannot be trusted any more

    def _record(self, entry) -> None:
        self._trace.append(entry)
        self._notify(entry)

    def _abort(self, reason: str) -> CollectiveAborted:
        message = f"all_gather on rank {self.rank_in_group} never completed: {reason}"
        self._record((INCOMPLETE, message))
        return CollectiveAborted(message)

    def _exchange(self, header: list[int]) -> list[list[int]]:
        import torch.distributed as dist
        mine = torch.tensor(header + [-1] * (_HEADER - len(header)), dtype=torch.int64,
                            device=self._device)
        parts = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(parts, mine, group=self._adapter.process_group)
        return [p.cpu().tolist() for p in parts]

    def all_gather(self, input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
        if not isinstance(input_, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(input_).__name__}")
        self._record(("all_gather", dim, tuple(input_.shape), str(input_.dtype)))
        if self.poisoned:
            raise self._abort("the process group already failed on this rank")
        shape = list(input_.shape)
        header = [_GATHER, dim, len(shape), _dtype_code(input_.dtype)]
        header += shape if len(shape) <= _HEADER - 4 else [zlib.crc32(str(shape).encode())]
        try:
            headers = self._exchange(header)
        except Exception as exc:  # noqa: BLE001 - gloo/NCCL timeout or a dead peer
            self.poisoned = True
            raise self._abort(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
        finished = [r for r, h in enumerate(headers) if h[0] == _FINISHED]
        if finished:
            raise self._abort("a peer never joined it (ranks that returned or raised instead: "
                              f"{finished})")
        if any(h != headers[0] for h in headers):
            raise self._abort("shapes disagree across ranks: " + ", ".join(
                f"rank {r}: {_shape_text(h)}" for r, h in enumerate(headers)))
        if not -input_.dim() <= dim < max(input_.dim(), 1):  # like torch.cat, on every rank alike
            raise IndexError(f"all_gather: dim {dim} out of range for a {input_.dim()}-d tensor")
        try:
            return self._adapter.all_gather(input_, dim)
        except (TypeError, ValueError):
            raise  # the adapter's own argument checks: identical on every rank, nothing was sent
        except Exception as exc:  # noqa: BLE001
            self.poisoned = True
            raise self._abort(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None

    def finish(self) -> None:
        """After the call: FINISHED header rounds until every rank has finished."""
        while not self.poisoned:
            try:
                headers = self._exchange([_FINISHED])
            except Exception:  # noqa: BLE001
                self.poisoned = True
                return
            if all(h[0] == _FINISHED for h in headers):
                return


def _device_kernel(device: torch.device):
    """impl.write_kv_cache with the cache on `device`, copied back for reading (check.observe
    allocates its blank caches on the CPU)."""
    from impl import write_kv_cache
    if device.type == "cpu":
        return write_kv_cache

    def kernel(cache, rows, slots):
        on_device = cache.to(device)
        write_kv_cache(on_device, rows.to(device), slots.to(device))
        cache.copy_(on_device.cpu())
    return kernel


def _observe(prepared, rank, inputs, outcome, device) -> RankView:
    """check.observe with the torch kernel; if the kernel refuses the outputs (fewer rows than
    slots: an out-of-bounds read on a GPU), the label-level rule, as in the thread runner."""
    try:
        return observe(prepared, rank, inputs, outcome, kernel=_device_kernel(device))
    except Exception:  # noqa: BLE001
        return observe(prepared, rank, inputs, outcome)


def _run_rank(case_json: str, target, rank: int, adapter, device: torch.device,
              notify=None) -> tuple[RankView, bool]:
    """One rank's part of one case: inputs, the call, the FINISHED rounds, the view.
    Returns (view, poisoned)."""
    from pcpcheck.cases import Case
    prepared = prepare(Case.from_json(case_json))
    tensors, slots, nd = prepared.inputs(rank)
    if device.type != "cpu":
        tensors = tuple(t.to(device) for t in tensors)
        slots = slots.to(device)
    outcome = RankOutcome()
    group = _RankGroup(adapter, device, outcome.trace, notify)
    try:
        outcome.value = target.call(tensors, slots, nd, prepared.shard, group=group)
    except CollectiveAborted:
        pass  # recorded in the trace
    except BaseException as exc:  # noqa: BLE001 - a target may raise anything, even SystemExit
        outcome.record_error(exc)
    group.finish()
    view = _observe(prepared, rank, (tensors, slots.cpu(), nd), outcome, device)
    return view, group.poisoned


class _Targets:
    """Targets loaded in this process, by (source, function name)."""

    def __init__(self):
        self._loaded = {}

    def get(self, source: str, function_name: str):
        key = (source, function_name)
        if key not in self._loaded:
            from pcpcheck.loader import load_target
            self._loaded[key] = load_target(source, function_name or None)
        return self._loaded[key]


def _init_device(backend: str, rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _worker(rank: int, size: int, backend: str, port: int, timeout: float, conn,
            stderr_path: str) -> None:
    """A spawned rank: join the group, then serve cases from the driver's pipe until None."""
    with open(stderr_path, "ab", buffering=0) as err:
        os.dup2(err.fileno(), 2)
    _die_with_parent()
    try:
        import torch.distributed as dist
        import impl
        device = _init_device(backend, rank)
        store = dist.TCPStore("127.0.0.1", port, None, False,
                              datetime.timedelta(seconds=STARTUP_TIMEOUT))
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT), **kwargs)
        _set_timeout(timeout)
        adapter = impl.ProcessGroupAdapter(dist.group.WORLD)
        targets = _Targets()
        conn.send(("ready", os.getpid()))
    except BaseException as exc:  # noqa: BLE001
        traceback.print_exc()
        conn.send(("fail", f"rank {rank} could not join the {backend} group: {type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break  # the driver went away
        if message is None:
            break
        case_json, source, function_name = message
        try:
            target = targets.get(source, function_name)
            view, poisoned = _run_rank(case_json, target, rank, adapter, device,
                                       notify=lambda entry: conn.send(("trace", entry)))
        except BaseException as exc:  # noqa: BLE001 - pcpcheck's own failure on this rank
            traceback.print_exc()
            conn.send(("fail", f"rank {rank}: {type(exc).__name__}: {exc}"))
            continue
        conn.send(("view", view, poisoned))
    sys.stderr.flush()
    os._exit(0)  # no destroy_process_group: peers may be gone already; nothing else to release


def _die_with_parent() -> None:
    """Linux: the kernel kills this rank if the driver dies (even by SIGKILL): no orphans."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the pipe's EOF still ends an idle rank
        pass


def _set_timeout(timeout: float) -> None:
    """The per-collective timeout of the default group (startup used a generous one)."""
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout
        _set_pg_timeout(datetime.timedelta(seconds=timeout))
    except Exception:  # noqa: BLE001 - older torch: the startup timeout stays
        pass


def _tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 8192))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


# --- driver side (spawn) ---------------------------------------------------------------------

@contextlib.contextmanager
def _bare_main():
    """While spawning: an empty __main__, so that the workers (whose code lives in this module)
    do not re-run the driver's main script (pytest, a console script, `python -`) on start."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class WorkerError(CheckerError):
    """A pool could not start, or pcpcheck's own code failed on a rank (not the target)."""


class Pool:
    """P spawned ranks in one process group, each with a pipe to the driver."""

    def __init__(self, size: int, backend: str, timeout: float, wait: bool = True):
        import torch.distributed as dist
        import torch.multiprocessing as mp
        self.size, self.backend, self.timeout = size, backend, timeout
        self.broken = False
        context = mp.get_context("spawn")
        self._store = dist.TCPStore("127.0.0.1", 0, None, True,
                                    datetime.timedelta(seconds=STARTUP_TIMEOUT),
                                    wait_for_workers=False)
        self._dir = tempfile.mkdtemp(prefix=f"pcpcheck-{backend}{size}-")
        self.stderr_paths = [os.path.join(self._dir, f"rank{r}.err") for r in range(size)]
        self.conns, self.processes = [], []
        with _bare_main():
            self._spawn(context)
        if wait:
            self.await_ready()

    def _spawn(self, context) -> None:
        size, backend, timeout = self.size, self.backend, self.timeout
        for rank in range(size):
            parent, child = context.Pipe()
            process = context.Process(
                target=_worker, name=f"pcpcheck-{backend}-rank{rank}-of-{size}", daemon=True,
                args=(rank, size, backend, self._store.port, timeout, child, self.stderr_paths[rank]))
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def await_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        waiting = set(range(self.size))
        while waiting:
            left = deadline - time.monotonic()
            ready = wait_connections([self.conns[r] for r in waiting], max(left, 0)) if left > 0 else []
            if not ready:
                self.close()
                raise WorkerError(f"{self.backend} pool of {self.size} ranks did not start within "
                                  f"{STARTUP_TIMEOUT:g} s")
            for conn in ready:
                rank = self.conns.index(conn)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    self.processes[rank].join(2.0)
                    message = ("fail", f"rank {rank} exited with code {self.processes[rank].exitcode} "
                                       "while starting")
                if message[0] != "ready":
                    detail = _tail(self.stderr_paths[rank], 6)
                    self.close()
                    raise WorkerError(message[1] + (f"\n{detail}" if detail else ""))
                waiting.discard(rank)

    def run(self, case_json: str, source: str, function_name: str, prepared) -> list[RankView]:
        """One case on every rank; a view per rank, never blocking past timeout + grace."""
        for conn in self.conns:
            conn.send((case_json, source, function_name))
        views: list[RankView | None] = [None] * self.size
        traces: list[list] = [[] for _ in range(self.size)]
        died: dict[int, str] = {}
        failures: list[str] = []
        deadline = time.monotonic() + self.timeout + GRACE
        pending = set(range(self.size))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for conn in wait_connections([self.conns[r] for r in pending], left):
                rank = self.conns.index(conn)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    self.processes[rank].join(0.5)
                    died[rank] = f"exit code {self.processes[rank].exitcode}"
                    pending.discard(rank)
                    self.broken = True
                    deadline = min(deadline, time.monotonic() + GRACE)  # peers fail fast now
                    continue
                if message[0] == "trace":
                    traces[rank].append(message[1])
                elif message[0] == "view":
                    views[rank] = message[1]
                    self.broken |= message[2]
                    pending.discard(rank)
                else:  # "fail": pcpcheck itself failed on that rank
                    failures.append(message[1])
                    pending.discard(rank)
        if failures:
            self.close()
            raise WorkerError(failures[0] + "\n" + _tail(self.stderr_paths[0], 6))
        if pending or died:
            self.broken = True
            self.close()  # read the tails after the processes are gone
        for rank in range(self.size):
            if views[rank] is not None:
                continue
            tail = _tail(self.stderr_paths[rank])
            last = tail.splitlines()[-1] if tail else ""
            if rank in died:
                reason = f"rank {rank} died ({died[rank]}) before returning"
            else:
                reason = f"rank {rank} did not return within {self.timeout:g} s"
            if last:
                reason += f"; stderr: {last[:200]}"
            outcome = RankOutcome(trace=traces[rank] + [(INCOMPLETE, reason)])
            outcome.error_detail = tail or None
            views[rank] = observe(prepared, rank, prepared.inputs(rank), outcome)
            views[rank].error_detail = tail or None
        return views

    def close(self) -> None:
        """Stop every rank: ask politely, then terminate, then kill. Idempotent."""
        self.broken = True
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 1.0
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(2.0)
            if process.is_alive():
                process.kill()
                process.join(2.0)
        for conn in self.conns:
            conn.close()
        self.conns = []


class ProcessRunner:
    """Backend with the ThreadRunner interface: a pool of real ranks per world size."""

    def __init__(self, backend: str = "gloo", timeout: float = 10.0):
        if backend not in PROCESS_BACKENDS:
            raise ValueError(f"backend must be one of {PROCESS_BACKENDS}, got {backend!r}")
        self.backend, self.timeout = backend, timeout
        self._pools: dict[int, Pool] = {}
        self.retired_pids: list[int] = []  # processes of pools torn down (must all be gone)

    def start(self, sizes) -> None:
        """Start the pools up front, all spawning at once (a startup failure surfaces before
        the search)."""
        new = [size for size in dict.fromkeys(sizes) if size not in self._pools]
        for size in new:
            self._pools[size] = Pool(size, self.backend, self.timeout, wait=False)
        try:
            for size in new:
                self._pools[size].await_ready()
        except BaseException:
            self.close()
            raise

    def _pool(self, size: int) -> Pool:
        pool = self._pools.get(size)
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()
                self.retired_pids += pool.pids
            pool = self._pools[size] = Pool(size, self.backend, self.timeout)
        return pool

    def pids(self) -> list[int]:
        return [pid for pool in self._pools.values() for pid in pool.pids]

    def observe_case(self, case, target) -> Observation:
        prepared = prepare(case)
        pool = self._pool(case.batch.pcp_size)
        views = pool.run(case.to_json(), target.source, target.function_name, prepared)
        if pool.broken:  # retire it now: no process outlives the case that broke it
            pool.close()
            self.retired_pids += pool.pids
            del self._pools[case.batch.pcp_size]
        violations, checked = judge(prepared, views)
        return Observation(prepared, views, violations, checked)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
            self.retired_pids += pool.pids
        self._pools.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- in-process runner on one device (scripts/gpu_check.sh with one GPU) ----------------------

class DeviceThreadRunner(ThreadRunner):
    """The thread runner with every input tensor, collective and cache write on `device`."""

    def __init__(self, timeout: float = 10.0, device: str = "cuda"):
        super().__init__(timeout)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")

    def observe_case(self, case, target) -> Observation:
        from pcpcheck.rankctx import current_group
        prepared = prepare(case)
        inputs = []
        for rank in range(prepared.size):
            tensors, slots, nd = prepared.inputs(rank)
            inputs.append((tuple(t.to(self.device) for t in tensors), slots.to(self.device), nd))

        def call(rank: int):
            tensors, slots, nd = inputs[rank]
            return target.call(tensors, slots, nd, prepared.shard, group=current_group())

        outcomes = self.run(prepared.size, call)
        views = [_observe(prepared, rank, (t, s.cpu(), nd), outcome, self.device)
                 for rank, ((t, s, nd), outcome) in enumerate(zip(inputs, outcomes))]
        violations, checked = judge(prepared, views)
        return Observation(prepared, views, violations, checked)


# --- torchrun ----------------------------------------------------------------------------------

class TorchrunRunner:
    """Rank 0's backend under torchrun: broadcast the case, run it here too, gather the views."""

    def __init__(self, adapter, device: torch.device, timeout: float):
        self.adapter, self.device, self.timeout = adapter, device, timeout
        self.size = adapter.world_size
        self._targets = _Targets()
        self.broken: Observation | None = None

    def observe_case(self, case, target) -> Observation:
        import torch.distributed as dist
        if case.batch.pcp_size != self.size:
            raise WorkerError(f"case has P={case.batch.pcp_size}; torchrun started {self.size} ranks")
        if self.broken is not None:
            return self.broken
        prepared = prepare(case)
        message = [("case", case.to_json(), target.source, target.function_name)]
        views: list = [None] * self.size
        view = None
        try:
            dist.broadcast_object_list(message, src=0)
            view, _ = _run_rank(message[0][1], target, 0, self.adapter, self.device)
            dist.gather_object(view, views, dst=0)
        except Exception as exc:  # noqa: BLE001 - a peer hung or died: gloo timed out
            views = [view] + [None] * (self.size - 1)
            for rank in range(self.size):
                if views[rank] is None:
                    reason = (f"rank {rank} did not return within {self.timeout:g} s "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})")
                    views[rank] = observe(prepared, rank, prepared.inputs(rank),
                                          RankOutcome(trace=[(INCOMPLETE, reason)]))
            violations, checked = judge(prepared, views)
            self.broken = Observation(prepared, views, violations, checked)
            return self.broken
        violations, checked = judge(prepared, views)
        return Observation(prepared, views, violations, checked)

    def stop(self) -> None:
        import torch.distributed as dist
        dist.broadcast_object_list([("stop",)], src=0)

    def close(self) -> None:
        """Nothing per search: the group lives as long as the torchrun job."""


def _serve_torchrun(adapter, device: torch.device) -> None:
    """Ranks 1..P-1 under torchrun: run every case rank 0 broadcasts until it says stop."""
    import torch.distributed as dist
    targets = _Targets()
    while True:
        message = [None]
        dist.broadcast_object_list(message, src=0)
        if message[0][0] == "stop":
            return
        _, case_json, source, function_name = message[0]
        view, _ = _run_rank(case_json, targets.get(source, function_name), adapter.rank_in_group,
                            adapter, device)
        dist.gather_object(view, None, dst=0)


def torchrun_main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: `torchrun --standalone --nproc-per-node P -m pcpcheck.procs
    [pcpcheck check arguments]`. Rank 0 prints the report and its exit code is the job's."""
    import torch.distributed as dist
    import impl
    from pcpcheck import cli
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "check":
        argv = argv[1:]
    rank = int(os.environ.get("RANK", "0"))
    try:
        args = cli.parse(["check", *argv])
    except cli.UsageError as exc:
        if rank == 0:
            print(f"pcpcheck: usage error: {exc}", file=sys.stderr)
        return cli.EXIT_USAGE
    backend = args.backend if args.backend in PROCESS_BACKENDS else \
        ("nccl" if torch.cuda.is_available() else "gloo")
    device = _init_device(backend, int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT))
    _set_timeout(args.timeout)
    adapter = impl.ProcessGroupAdapter(dist.group.WORLD)
    size = adapter.world_size
    if rank != 0:
        _serve_torchrun(adapter, device)
        _exit(0)
    runner = TorchrunRunner(adapter, device, args.timeout)
    code = cli.EXIT_USAGE
    try:
        if args.world_sizes and tuple(args.world_sizes) != (size,):
            raise cli.UsageError(f"--world-sizes {','.join(map(str, args.world_sizes))} but "
                                 f"torchrun started {size} ranks")
        args.world_sizes = (size,)
        print(f"pcpcheck: torchrun, {size} ranks, {backend}")
        code = cli.run_check(args, runner)
    except (cli.UsageError, cli.LoadError, cli.CheckerError, WorkerError) as exc:
        print(f"pcpcheck: {exc}", file=sys.stderr)
        code = cli.EXIT_USAGE
    finally:
        if runner.broken is None:
            runner.stop()
        # A broken group: peers are stuck, torchrun tears them down when rank 0 exits non-zero.
        _exit(code)


def _exit(code: int) -> None:
    """Leave without tearing down the process group or the interpreter: a gloo group torn
    down while a peer exits too can abort the process (SIGABRT), which would hide the code."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(torchrun_main())
