"""Backends: where the ranks of a case run. The target runs only in worker processes.

    driver (pcpcheck.engine / cli / api)          workers (forked by the driver's fork server)
    draws a case -> check.run_case:
      check.prepare(case)  ------ inputs as bytes ----->  load target (one instance per rank),
      backend.run(prepared, target)                       call it on P ranks, read outputs raw
      check.observe(...) <------ plain data (wire) ------ errors, traces, output, tensor bytes
      check.judge(...) -> verdict, exit code

Files: base.py (the Backend interface, RankResult, TargetInfo), threads.py (one worker, P ranks
as greenlets), distributed.py (gloo/nccl: P workers in a torch.distributed group), torchrun.py
(under torchrun), worker.py (where a rank runs), wire.py (where bytes cross a process boundary),
pool.py (starting, timing and stopping worker processes), forkserver.py (the process that
imports torch once and forks every worker), process_group.py (the group a rank sees on a real
process group).
"""

from __future__ import annotations

from pcpcheck.backends.base import Backend, RankResult, TargetInfo

BACKENDS = ("threads", "gloo", "nccl")
PROCESS_BACKENDS = ("gloo", "nccl")


def make_backend(name: str = "threads", *, timeout: float = 10.0, world_sizes=None,
                 device: str = "cpu") -> Backend:
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
