"""pcpcheck's vLLM plugin (entry point group `vllm.general_plugins`): records each PCP step of a
live server in the schema of pcpcheck.shared.recording (docs/record.md), for
`pcpcheck vllm RELEASE --steps DIR` to replay.

Off unless PCPCHECK_RECORD=DIR. vLLM calls `register()` in every process, possibly more than
once: the patches are installed once per class and function. It wraps the release's own code at
the PCP boundary: PCPManager's constructor (its parallel sizes and ranks), `_build_batch_layout`
(the step as the model runner hands it), `partition_batch` (each request's scheduled draft
tokens, from the global batch), `get_draft_input_buffers` (a later draft step's positions: its
requests are read back from the unexpanded map the MLA wrapper gets),
`_convert_to_gathered_slot_mappings` (the global slot maps, hence each request's blocks) and the
MLA wrapper (the slot map and num_decode_tokens the gather gets, and the sha256 of its inputs).
One line per rank and recorded step, written before the gather runs, so that a step whose
collective hangs or crashes is on disk; once the wrapped gather returns, a second, small line
(kind "outputs") carries the sha256 of its outputs.
Never an exception into vLLM: a recorder failure is logged once and recording stops.
Runs inside vLLM: it imports nothing of pcpcheck's judge or driver.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import logging
import os
import sys
from typing import TextIO

import numpy as np

from pcpcheck.shared.recording import DRAFT_STEP, TARGET, outputs_line, step_line
from pcpcheck.shared.wire import tensor_bytes

ENV_DIR = "PCPCHECK_RECORD"
ENV_EVERY = "PCPCHECK_RECORD_EVERY"  # record one step in N (per rank, the same steps everywhere)
ENV_MAX_STEPS = "PCPCHECK_RECORD_MAX_STEPS"  # then recording stops
ENV_BLOCK_SIZE = "PCPCHECK_RECORD_BLOCK_SIZE"  # the KV-cache block size (vllm serve --block-size)
DEFAULT_MAX_STEPS = 10_000
MANAGER_MODULE = "vllm.v1.worker.gpu.pcp_manager"
GATHER_MODULE = "vllm.v1.attention.ops.pcp"
MLA_WRAPPER = "maybe_gather_mla_latent_cache_inputs"
# Its caller binds the name at import (`from vllm.v1.attention.ops.pcp import ...`): if that module
# was imported before the plugin loaded, its binding is patched too.
MLA_CALLER = "vllm.model_executor.layers.attention.mla_attention"
_MARK = "__pcpcheck_recorder__"

logger = logging.getLogger("pcpcheck.record")


class Recorder:
    """One process's recording: its file, its counters, and whether it stopped."""

    def __init__(self, directory: str, every: int, max_steps: int, block_size: int):
        self.directory, self.every, self.max_steps = directory, every, max_steps
        self.block_size = block_size
        self.written, self.stopped = 0, False
        self.handles: dict[str, TextIO] = {}  # by file name
        self.counts: dict[int, int] = {}  # PCP rank -> its last step
        # The step being recorded, by PCP rank: the manager and the wrapper may run on different
        # threads of a rank's process (asynchronous scheduling), so the key is the rank.
        self.pending: dict[int, dict] = {}

    def safely(self, hook) -> None:
        """Run a recording hook; its failure is logged once and ends the recording."""
        if self.stopped:
            return
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - never an exception into vLLM
            self.stop(f"pcpcheck recorder stopped: {type(exc).__name__}: {exc}")

    def stop(self, why: str) -> None:
        self.stopped = True
        self.pending.clear()
        logger.warning(why)
        for handle in self.handles.values():
            handle.close()

    # --- the hooks ---------------------------------------------------------------------------

    def on_layout(self, manager, arguments: dict) -> None:
        counted = self._count(manager)
        if counted is None:
            return
        q = [int(v) for v in np.asarray(arguments["num_scheduled_tokens"]).tolist()]
        self.pending[counted[0]] = {
            **self._configuration(*counted), "kind": TARGET,
            "graph_size": int(arguments.get("padded_num_tokens") or 0),
            "scheduled": q,
            "computed": [int(v) for v in np.asarray(arguments["num_computed_tokens"]).tolist()],
            "prefilling": [bool(v) for v in np.asarray(arguments["is_prefilling"]).tolist()],
        }

    def _count(self, manager) -> tuple[int, dict, int] | None:
        """The rank's next step number (target and later draft steps share it): (rank, its
        manager's configuration, step), or None when the step is not sampled."""
        config = manager.__dict__.get(_MARK, {})
        key = int(config.get("pcp_rank", 0))  # one manager per process: its steps, from 0
        step = self.counts[key] = self.counts.get(key, -1) + 1
        self.pending.pop(key, None)
        return None if step % self.every else (key, config, step)

    def _configuration(self, key: int, config: dict, step: int) -> dict:
        return {"step": step, "rank": key,
                "pcp_size": int(config.get("pcp_world_size", 1)),
                "dcp_size": int(config.get("dcp_world_size", 1)),
                "dcp_rank": int(config.get("dcp_rank", 0)),
                "interleave": int(config.get("cp_interleave", 1)),
                "shard_decode_requests": bool(config.get("shard_decode_requests", False))}

    def on_draft_buffers(self, manager, input_buffers, num_tokens: int) -> None:
        """A later draft step (the manager hands the draft model the global buffers: no draft
        prefill batch): its positions, for the step line its first MLA layer writes."""
        if manager.__dict__.get("draft_prefill_batch") is not None:
            return  # the first draft pass: the target step's PCP-local batch and expanded map
        counted = self._count(manager)
        if counted is not None:
            self.pending[counted[0]] = {**self._configuration(*counted), "kind": DRAFT_STEP,
                                        "positions": _plain(input_buffers.positions[:num_tokens])}

    def on_partition(self, manager, input_batch) -> None:
        """Each request's scheduled draft tokens, from the global batch `partition_batch` got
        (its `_build_batch_layout` call made the step pending)."""
        step = self.pending.get(int(manager.__dict__.get(_MARK, {}).get("pcp_rank", 0)))
        drafts = getattr(input_batch, "num_draft_tokens_per_req", None)
        if step is not None and drafts is not None:
            step["draft_tokens"] = [int(v) for v in np.asarray(drafts).tolist()]

    def on_slot_maps(self, manager, global_maps) -> None:
        """Each request's blocks per KV group, read back from the global slot maps: the block of
        each virtual block this step writes (None where this DCP rank owns no token of it)."""
        step = self.pending.get(int(manager.__dict__.get(_MARK, {}).get("pcp_rank", 0)))
        if step is None:
            return
        q = np.asarray(step["scheduled"], dtype=np.int64)
        computed = np.asarray(step["computed"], dtype=np.int64)
        maps = np.asarray(_plain(global_maps), dtype=np.int64)
        maps = maps.reshape(-1, maps.shape[-1])[:, :int(q.sum())]  # (groups, tokens), unpadded
        span = self.block_size * step["dcp_size"]
        first = computed // span
        counts = np.where(q > 0, (computed + q - 1) // span - first + 1, 0)
        # per token: its request, and its virtual block's index in the request's list
        request = np.repeat(np.arange(len(q)), q)
        offset = np.arange(int(q.sum())) - np.repeat(np.cumsum(q) - q, q)
        where = np.repeat(np.cumsum(counts) - counts, q) + (computed[request] + offset) // span \
            - first[request]
        groups = []
        for group in maps:
            blocks = np.full(int(counts.sum()), -1, dtype=np.int64)
            owned = group >= 0
            blocks[where[owned]] = group[owned] // self.block_size
            groups.append([None if b < 0 else b for b in blocks.tolist()])
        bounds = np.cumsum(counts).tolist()
        drafts = step.get("draft_tokens") or [0] * len(q)  # None: no request has any
        requests = [{"scheduled": n, "computed": c, "prefilling": p, "draft_tokens": d,
                     "first_block": f, "block_ids": [g[end - k:end] for g in groups]}
                    for n, c, p, d, f, k, end in zip(step["scheduled"], step["computed"],
                                                     step["prefilling"], drafts, first.tolist(),
                                                     counts.tolist(), bounds)]
        step["requests"] = requests

    def on_gather(self, rank: int, arguments: dict) -> tuple | None:
        """Write the step's line (its first MLA layer is its record); the line's identity, for
        its outputs line, or None when this call records nothing."""
        step = self.pending.pop(rank, None)
        if step is not None and step["kind"] == DRAFT_STEP:
            self.on_draft_gather(step, arguments)
        if step is None or "requests" not in step:
            return None
        if self.written >= self.max_steps:
            self.stop(f"pcpcheck recorder: {self.max_steps} steps recorded "
                      f"({ENV_MAX_STEPS}); recording stops")
            return None
        fields = {key: step[key] for key in ("step", "rank", "pcp_size", "dcp_size", "dcp_rank",
                                             "interleave", "shard_decode_requests", "kind",
                                             "requests")}
        slots = _plain(arguments["slot_mapping"])
        line = step_line(self.written == 0, **fields, block_size=self.block_size,
                         graph_size=step.get("graph_size", 0), dp_pad=step.get("dp_pad", 0),
                         release={"slot_mapping": [int(s) for s in slots],
                                  "num_decode_tokens": int(arguments["num_decode_tokens"]),
                                  "sha256": {"inputs": _digest(
                                      arguments["kv_c_normed"], arguments["k_pe"],
                                      arguments["slot_mapping"])}})
        self._write(fields["rank"], fields["dcp_rank"], line)
        self.written += 1
        return fields["step"], fields["rank"], fields["dcp_rank"]

    def on_draft_gather(self, step: dict, arguments: dict) -> None:
        """A later draft step's requests, from its unexpanded map (D = 1): one query token per
        request, all of them decode rows (0.33.0 classifies every real row of a later draft step
        decode: num_decode_tokens is the real count); the rows past it are DP padding."""
        rows, slots = int(arguments["kv_c_normed"].shape[0]), _plain(arguments["slot_mapping"])
        if step["dcp_size"] != 1 or len(slots) > rows:
            # D > 1: the layout model's draft steps have D = 1; an expanded map: a first draft
            # pass on the target step's layout (a speculator without a draft prefill batch)
            return
        real = int(arguments["num_decode_tokens"])
        slots = slots[:real]
        positions = [int(p) for p in step["positions"][:real]]
        step["dp_pad"] = rows - real
        step["requests"] = [
            {"scheduled": 1, "computed": p, "prefilling": False, "draft_tokens": 0,
             "first_block": p // self.block_size,
             "block_ids": [[int(s) // self.block_size if s >= 0 else None]]}
            for p, s in zip(positions, slots)]

    def on_outputs(self, written: tuple, outputs) -> None:
        """The line after the step's gather returned: the sha256 of its outputs."""
        step, rank, dcp_rank = written
        self._write(rank, dcp_rank, outputs_line(step, rank, dcp_rank, _digest(*outputs)))

    def _write(self, rank: int, dcp_rank: int, line: str) -> None:
        name = f"pcp{rank}-dcp{dcp_rank}-{os.getpid()}.jsonl"
        if name not in self.handles:
            os.makedirs(self.directory, exist_ok=True)
            self.handles[name] = open(os.path.join(self.directory, name), "a", encoding="utf-8")
        self.handles[name].write(line + "\n")
        self.handles[name].flush()


def _plain(value):
    return value.detach().cpu().tolist() if hasattr(value, "detach") else np.asarray(value).tolist()


def _digest(*tensors) -> str:
    # wire.tensor_bytes reads any strides (a one-row view with stride 2 counts as contiguous, and
    # a byte view of it fails: the recorder would stop on a correct step)
    digest = hashlib.sha256()
    for tensor in tensors:
        if hasattr(tensor, "detach"):
            dtype, shape, content = tensor_bytes(tensor)
            digest.update(str((tuple(shape), dtype)).encode())
            digest.update(content)
    return digest.hexdigest()


# --- installing the patches ----------------------------------------------------------------------

def _wrap_method(cls, name: str, after) -> None:
    original = getattr(cls, name)
    if getattr(original, _MARK, False):
        return  # loaded twice: already wrapped
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        after(self, signature, args, kwargs)
        return result

    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


def _bound(signature, self, args, kwargs) -> dict:
    bound = signature.bind(self, *args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def install(recorder: Recorder, manager_module, gather_module) -> None:
    """Wrap the release's manager and MLA wrapper (once: a second call changes nothing)."""
    manager = manager_module.PCPManager
    # Each hook binds its arguments inside `safely`: nothing it does can raise into vLLM.
    _wrap_method(manager, "__init__", lambda self, sig, a, k: recorder.safely(
        lambda: self.__dict__.__setitem__(_MARK, _bound(sig, self, a, k))))
    _wrap_method(manager, "_build_batch_layout", lambda self, sig, a, k: recorder.safely(
        lambda: recorder.on_layout(self, _bound(sig, self, a, k))))
    if hasattr(manager, "get_draft_input_buffers"):  # 0.30+: each draft pass's inputs
        _wrap_method(manager, "get_draft_input_buffers", lambda self, sig, a, k: recorder.safely(
            lambda: recorder.on_draft_buffers(self, *list(_bound(sig, self, a, k).values())[1:])))
    if hasattr(manager, "partition_batch"):  # the step entry, with the global batch
        _wrap_method(manager, "partition_batch", lambda self, sig, a, k: recorder.safely(
            lambda: recorder.on_partition(self, _bound(sig, self, a, k)["input_batch"])))
    _wrap_method(manager, "_convert_to_gathered_slot_mappings",
                 lambda self, sig, a, k: recorder.safely(
                     lambda: recorder.on_slot_maps(self, _bound(sig, self, a, k).popitem()[1])))
    original = getattr(gather_module, MLA_WRAPPER)
    if getattr(original, _MARK, False):
        return
    signature = inspect.signature(original)

    def record(args, kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if bound.arguments.get("use_pcp") and bound.arguments.get("num_decode_tokens") is not None:
            return recorder.on_gather(_pcp_rank(gather_module), dict(bound.arguments))
        return None

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        # the step's line before the gather runs: a step whose collective hangs or crashes is on
        # disk; its outputs line only once the gather returned (none if it raised)
        written = []
        recorder.safely(lambda: written.append(record(args, kwargs)))
        result = original(*args, **kwargs)
        if written and written[0] is not None:
            recorder.safely(lambda: recorder.on_outputs(written[0], result))
        return result

    setattr(wrapper, _MARK, True)
    setattr(gather_module, MLA_WRAPPER, wrapper)
    caller = sys.modules.get(MLA_CALLER)
    if caller is not None and getattr(caller, MLA_WRAPPER, None) is original:
        setattr(caller, MLA_WRAPPER, wrapper)


def _pcp_rank(gather_module) -> int:
    """The calling rank's PCP rank, from the group the release's gather uses (one rank per
    process in vLLM: 0 when the module has no group to ask)."""
    group_of = getattr(gather_module, "get_pcp_group", None)
    return int(group_of().rank_in_group) if group_of is not None else 0


_RECORDER: Recorder | None = None


def register() -> None:
    """vLLM's general-plugin entry: install the recorder when PCPCHECK_RECORD is set."""
    global _RECORDER
    directory = os.environ.get(ENV_DIR)
    if not directory:
        return
    try:
        if _RECORDER is None:
            _RECORDER = Recorder(directory, max(1, int(os.environ.get(ENV_EVERY, "1"))),
                                 int(os.environ.get(ENV_MAX_STEPS, DEFAULT_MAX_STEPS)),
                                 int(os.environ.get(ENV_BLOCK_SIZE, "16")))
        install(_RECORDER, importlib.import_module(MANAGER_MODULE),
                importlib.import_module(GATHER_MODULE))
    except Exception as exc:  # noqa: BLE001 - never an exception into vLLM
        logger.warning("pcpcheck recorder not installed: %s: %s", type(exc).__name__, exc)
