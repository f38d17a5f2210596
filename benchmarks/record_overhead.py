"""What the recorder plugin (pcpcheck.vllm_plugin) adds to one PCP step on one rank, on CPU:
its hooks on the manager's step entry and slot maps and on the MLA wrapper (reading the step's
arrays, reading blocks back from the global slot maps, the sha256 of the wrapper's inputs and
outputs, one JSON line written), around a wrapper that does nothing. On a GPU the sha256 also
copies the tensors to the host (not measured here).

    python benchmarks/record_overhead.py [--steps 200]

Prints microseconds per recorded step by the step's token count (decodes of 1 token, MLA rows:
kv_c_normed 512 and k_pe 64 bfloat16 per token, as DeepSeek-style MLA layers carry)."""

from __future__ import annotations

import argparse
import tempfile
import time
import types

import numpy as np
import torch

from pcpcheck import vllm_plugin as record


class Manager:
    def __init__(self, pcp_world_size, pcp_rank, shard_decode_requests=False):
        pass

    def _build_batch_layout(self, num_scheduled_tokens, num_computed_tokens, is_prefilling,
                            query_start_loc, padded_num_tokens=None):
        return None

    def _convert_to_gathered_slot_mappings(self, global_batch_slot_mappings):
        return global_batch_slot_mappings


def mla_wrapper(kv_c_normed, k_pe, slot_mapping, num_decode_tokens, use_pcp):
    return kv_c_normed, k_pe, slot_mapping


def per_step(tokens: int, steps: int, recording: bool) -> float:
    manager_module = types.SimpleNamespace(PCPManager=type("PCPManager", (Manager,), {}))
    gather = types.SimpleNamespace(maybe_gather_mla_latent_cache_inputs=mla_wrapper)
    with tempfile.TemporaryDirectory() as directory:
        if recording:
            record.install(record.Recorder(directory, 1, steps + 1, 16), manager_module, gather)
        manager = manager_module.PCPManager(2, 0)
        q = np.ones(tokens, dtype=np.int32)
        computed = np.arange(tokens, dtype=np.int32) * 40
        prefilling = np.zeros(tokens, dtype=bool)
        starts = np.arange(tokens + 1, dtype=np.int32)
        maps = torch.arange(tokens, dtype=torch.int64)[None, :] * 16 + 7
        kv_c = torch.zeros(tokens, 512, dtype=torch.bfloat16)
        k_pe = torch.zeros(tokens, 64, dtype=torch.bfloat16)
        slots = torch.cat((maps[0], torch.full((tokens,), -1)))
        start = time.perf_counter()
        for _ in range(steps):
            manager._build_batch_layout(q, computed, prefilling, starts)
            manager._convert_to_gathered_slot_mappings(maps)
            gather.maybe_gather_mla_latent_cache_inputs(kv_c, k_pe, slots, tokens, True)
        return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print("tokens  without (us)  with recorder (us)  added (us)")
    for tokens in (16, 256, 2048):
        off, on = per_step(tokens, args.steps, False), per_step(tokens, args.steps, True)
        print(f"{tokens:>6}  {off:>12.1f}  {on:>18.1f}  {on - off:>10.1f}")


if __name__ == "__main__":
    main()
