"""Backends: where the ranks of a case run, seen from the driver. The target runs only in worker
processes (pcpcheck.worker), never here.

    driver (pcpcheck.api, search, judge)           workers (forked by the driver's fork server)
    draws a case -> judge.run.run_cases:
      prepare(case)  ------------ inputs as bytes ----->  load target (one instance per rank),
      backend.run_many(prepareds, target)                 call it on P ranks, read outputs raw
      observe(...) <------------- plain data ------------- errors, traces, output, tensor bytes
      judge(...) -> verdict, exit code

Files: base.py (the Backend interface), threads.py (one worker, P ranks as greenlets),
distributed.py (gloo/nccl: P workers in a torch.distributed group), torchrun_store.py (under
torchrun), pool.py (starting, timing and stopping worker processes), forkserver.py (the process
that imports torch once and forks every worker). What crosses to a worker and back:
pcpcheck.shared.protocol; the bytes: pcpcheck.shared.wire.
"""

from __future__ import annotations

from pcpcheck.backends.base import Backend
from pcpcheck.shared.defaults import DEFAULT_BACKEND, DEFAULT_DEVICE, DEFAULT_TIMEOUT
from pcpcheck.shared.protocol import RankResult, TargetInfo

BACKENDS = ("threads", "gloo", "nccl")
PROCESS_BACKENDS = ("gloo", "nccl")


def make_backend(name: str = DEFAULT_BACKEND, *, timeout: float = DEFAULT_TIMEOUT, world_sizes=None,
                 device: str = DEFAULT_DEVICE) -> Backend:
    """A started backend: `threads` (on `device`), or a `gloo`/`nccl` pool per world size."""
    if name == "threads":
        from pcpcheck.backends.threads import ThreadsBackend
        return ThreadsBackend(timeout=timeout, device=device)
    if name in PROCESS_BACKENDS:
        from pcpcheck.backends.distributed import DistributedBackend
        backend = DistributedBackend(name, timeout=timeout)
        if world_sizes:
            backend.start(world_sizes)
        return backend
    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")


__all__ = ["BACKENDS", "PROCESS_BACKENDS", "Backend", "RankResult", "TargetInfo", "make_backend"]
