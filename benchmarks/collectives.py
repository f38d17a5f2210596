"""Collectives per call, bytes moved and time per call: the bundled impl beside vLLM 0.33.0's
gather, on real gloo ranks. Printed, never asserted.

    python benchmarks/collectives.py [--wheel PATH] [--sizes 2,4] [--rows 1,64,1024,8192]

MLA row shapes: kv_c_normed (L, 512) and k_pe (L, 1, 64), bf16, through each side's gather with
the tensors MLA passes, `(kv_c_normed, k_pe.reshape(L, -1))`. Two calls are timed: sharded
decodes (branch B, every row gathered) and a replicated mixed batch (branch E, nd = L // 2; D when L = 1).
vLLM's gather is read from its wheel at run time (fetched with pip into pip's cache when no
--wheel is given) and executed with a stand-in `vllm.distributed.parallel_state`; nothing of it
is stored. Each rank's group counts its all_gather calls and the bytes each rank sends.
The two sides' outputs are compared bit for bit first (the benchmark stops if they differ), then
timed alternately, call by call, so that both see the same machine load (it prints the load
average before and after: on a shared machine the milliseconds move, the counts do not).
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
    from pcpcheck_impl import gather_prefill_cache_inputs

    def call(tensors, slots, nd, shard):
        return gather_prefill_cache_inputs(tensors, slots, nd, shard, group=group)
    return call


def mla_inputs(rows: int, size: int):
    kv_c = torch.randn(rows, 512).to(torch.bfloat16)
    k_pe = torch.randn(rows, 1, 64).to(torch.bfloat16)
    slots = torch.arange(size * rows, dtype=torch.int64)
    return (kv_c, k_pe.reshape(rows, -1)), slots


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def check_same_outputs(sides, args, where: str) -> None:
    """Both sides return the same rows and slots, bit for bit (else the timing compares nothing)."""
    (impl_rows, impl_slots), (vllm_rows, vllm_slots) = (call(*args) for call in sides.values())
    if not (len(impl_rows) == len(vllm_rows) and torch.equal(impl_slots, vllm_slots)
            and all(same_bits(a, b) for a, b in zip(impl_rows, vllm_rows))):
        raise SystemExit(f"{where}: impl and vLLM 0.33.0 return different outputs")


def time_sides(sides, group, args, budget_s: float = 1.0, min_calls: int = 5,
               max_calls: int = 200):
    """Per side: median seconds per call, collectives and bytes sent per call. The sides take
    turns call by call (same load for both); every rank runs the same number of calls (rank 0
    decides and broadcasts)."""
    import torch.distributed as dist
    stats = {name: {"times": [], "calls": 0, "sent": 0} for name in sides}
    started = time.perf_counter()
    while True:
        for name, call in sides.items():
            group.calls = group.bytes_sent = 0
            dist.barrier()
            t0 = time.perf_counter()
            call(*args)
            stats[name]["times"].append(time.perf_counter() - t0)
            stats[name]["calls"] += group.calls
            stats[name]["sent"] += group.bytes_sent
        done = len(stats[name]["times"])  # every side has run as often
        go = done < min_calls or (time.perf_counter() - started < budget_s and done < max_calls)
        flag = torch.tensor([int(go)])
        dist.broadcast(flag, src=0)
        if not flag.item():
            break
    result = {}
    for name, st in stats.items():
        times = sorted(st["times"])
        result[name] = (times[len(times) // 2], st["calls"] / len(times), st["sent"] / len(times),
                        len(times))
    return result


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
            args = (tensors, slots, nd, shard)
            check_same_outputs(sides, args, f"P={size} L={rows} branch {branch}")  # and warm up
            timed = time_sides(sides, group, args)
            for name, (seconds, calls, sent, runs) in timed.items():
                lines.append(f"  P={size} L={rows:<5} {branch}  {name:<12} {calls:4.1f} "
                             f"{sent / 1024:10.1f} {seconds * 1e3:10.3f} {runs:6d}")
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
          "median ms (over `calls` timed calls per side, sides alternating)")
    one, five, fifteen = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {one:.2f} {five:.2f} {fifteen:.2f}, "
          f"cores: {os.cpu_count()}")
    print("  world  rows    br side         coll   KiB sent    ms/call  calls")
    with tempfile.TemporaryDirectory() as scratch:
        for size in (int(s) for s in args.sizes.split(",")):
            out_path = os.path.join(scratch, f"p{size}.txt")
            mp.spawn(rank_main, args=(size, free_port(), source, rows_list, out_path),
                     nprocs=size, join=True)
            with open(out_path) as handle:
                print(handle.read(), end="", flush=True)
    one, five, fifteen = os.getloadavg()
    print(f"load average (1, 5, 15 min) after: {one:.2f} {five:.2f} {fifteen:.2f}")


if __name__ == "__main__":
    main()
