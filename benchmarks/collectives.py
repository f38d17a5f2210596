"""Collectives per call, bytes moved and time per call: the bundled impl beside vLLM 0.33.0's
gather, on real gloo ranks. Printed, never asserted.

    python benchmarks/collectives.py [--wheel PATH] [--sizes 2,4] [--rows 1,64,1024,8192]

MLA row shapes: kv_c_normed (L, 512) and k_pe (L, 1, 64), bf16, through each side's gather with
the tensors MLA passes, `(kv_c_normed, k_pe.reshape(L, -1))`. Two calls are timed: sharded
decodes (branch B, every row gathered) and a replicated mixed batch (branch E, nd = L // 2; D when L = 1).
vLLM's gather is read from its wheel at run time (fetched with pip into pip's cache when no
--wheel is given) and executed with a stand-in `vllm.distributed.parallel_state`; nothing of it
is stored. Each rank's group counts its all_gather calls and the bytes each rank sends.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import subprocess
import sys
import tempfile
import time
import types
import zipfile

import torch

GATHER_FILE = "vllm/v1/attention/ops/pcp.py"
NATIVE = {torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int32,
          torch.int64}


class CountingGroup:
    """vLLM-style group over the default gloo group that counts what crosses it."""

    def __init__(self):
        import torch.distributed as dist
        self.world_size = dist.get_world_size()
        self.rank_in_group = dist.get_rank()
        self.calls = 0
        self.bytes_sent = 0

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        import torch.distributed as dist
        self.calls += 1
        self.bytes_sent += t.numel() * t.element_size()
        x = t.contiguous()
        wire = x if x.dtype in NATIVE else x.view(torch.uint8)
        parts = [torch.empty_like(wire) for _ in range(self.world_size)]
        dist.all_gather(parts, wire)
        out = torch.cat(parts, dim=dim)
        return out if out.dtype == x.dtype else out.view(x.dtype)


def vllm_gather(source: str, group: CountingGroup):
    """0.33.0's `_gather_prefill_cache_inputs`, its vllm imports answered by this group."""
    state = types.ModuleType("vllm.distributed.parallel_state")
    state.get_pcp_group = lambda: group
    state.get_tp_group = lambda: group
    saved = {name: sys.modules.get(name) for name in ("vllm", "vllm.distributed", state.__name__)}
    sys.modules.update({"vllm": types.ModuleType("vllm"),
                        "vllm.distributed": types.ModuleType("vllm.distributed"),
                        state.__name__: state})
    try:
        namespace: dict = {"__name__": "vllm_pcp_benchmark"}
        exec(compile(source, GATHER_FILE, "exec"), namespace)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return namespace["_gather_prefill_cache_inputs"]


def impl_gather(group: CountingGroup):
    from impl import gather_prefill_cache_inputs

    def call(tensors, slots, nd, shard):
        return gather_prefill_cache_inputs(tensors, slots, nd, shard, group=group)
    return call


def mla_inputs(rows: int, size: int):
    kv_c = torch.randn(rows, 512).to(torch.bfloat16)
    k_pe = torch.randn(rows, 1, 64).to(torch.bfloat16)
    slots = torch.arange(size * rows, dtype=torch.int64)
    return (kv_c, k_pe.reshape(rows, -1)), slots


def time_call(call, group, args, budget_s: float = 0.5, max_calls: int = 200):
    """Median seconds per call, and collectives and bytes per call (every rank runs the same
    number of calls: rank 0 decides and broadcasts)."""
    import torch.distributed as dist
    call(*args)  # warm up
    group.calls = group.bytes_sent = 0
    times = []
    started = time.perf_counter()
    while True:
        dist.barrier()
        t0 = time.perf_counter()
        call(*args)
        times.append(time.perf_counter() - t0)
        go = torch.tensor([int(time.perf_counter() - started < budget_s and len(times) < max_calls)])
        dist.broadcast(go, src=0)
        if not go.item():
            break
    times.sort()
    return times[len(times) // 2], group.calls / len(times), group.bytes_sent / len(times)


def rank_main(rank: int, size: int, port: int, source: str, rows_list, out_path: str) -> None:
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    torch.manual_seed(rank)
    group = CountingGroup()
    sides = {"impl": impl_gather(group), "vllm-0.33.0": vllm_gather(source, group)}
    lines = []
    for rows in rows_list:
        tensors, slots = mla_inputs(rows, size)
        mixed = rows // 2
        for branch, nd, shard in (("B", 0, True), ("E" if mixed else "D", mixed, False)):
            for name, call in sides.items():
                seconds, calls, sent = time_call(call, group, (tensors, slots, nd, shard))
                lines.append(f"  P={size} L={rows:<5} {branch}  {name:<12} {calls:4.1f} "
                             f"{sent / 1024:10.1f} {seconds * 1e3:10.3f}")
    if rank == 0:
        with open(out_path, "w") as handle:
            handle.write("\n".join(lines) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def gather_source(wheel: str | None) -> str:
    if wheel is None:
        cache = os.path.join(tempfile.gettempdir(), "pcpcheck-bench-wheel")
        found = glob.glob(os.path.join(cache, "vllm-0.33.0-*.whl"))
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "vllm==0.33.0", "--no-deps",
                            "--only-binary=:all:", "-q", "-d", cache], check=True)
            found = glob.glob(os.path.join(cache, "vllm-0.33.0-*.whl"))
        wheel = found[0]
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(GATHER_FILE).decode()


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", help="vLLM 0.33.0 wheel (default: pip download into a cache)")
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--rows", default="1,64,1024,8192")
    args = parser.parse_args()
    import torch.multiprocessing as mp
    source = gather_source(args.wheel)
    rows_list = [int(r) for r in args.rows.split(",")]
    print("MLA rows (512 + 64 bf16), gloo; per call on each rank: collectives, KiB sent, "
          "median ms")
    print("  world  rows    br side         coll   KiB sent    ms/call")
    with tempfile.TemporaryDirectory() as scratch:
        for size in (int(s) for s in args.sizes.split(",")):
            out_path = os.path.join(scratch, f"p{size}.txt")
            mp.spawn(rank_main, args=(size, free_port(), source, rows_list, out_path),
                     nprocs=size, join=True)
            with open(out_path) as handle:
                print(handle.read(), end="")


if __name__ == "__main__":
    main()
