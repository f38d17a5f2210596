"""Load a vLLM release's PCP path (manager, gather, wrappers) and read its capabilities from its
own code. It runs in the worker (pcpcheck.worker.main, release mode), never in the driver.

`load_release(source) -> Release`. The manager file (`pcp_manager.py`) and the gather file
(`pcp.py`) are executed in the release's space (pcpcheck.worker.standins StandInSpace(source)):
the `vllm.*` modules they import run from the release's own tree where they can run here, and
are stood in for, with the reason, where they cannot; `FALLBACKS` serve names the layout methods
use only where their module is a stand-in, `PLATFORM` and `CPU_TORCH` are what the platform and
torch answer on CPU. Capabilities come from the release's code: its constructor's parameters,
its `_build_batch_layout` signature, its `validate_config` run on a synthetic config (with the
release's own speculator config), its gather's and wrappers' signatures; how its
partition_batch is fed, where it runs (`Release.partition`: pcpcheck.worker.release_batch). An
internal pcpcheck needs that the release lacks is `InterfaceDrift`: one line naming it (exit 2).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

import pcpcheck_reference as reference
from pcpcheck.shared.errors import InterfaceDrift, LoadError
from pcpcheck.shared.protocol import Capabilities
from pcpcheck.shared.results import NOT_EVALUATED
from pcpcheck.shared.source import GATHERS, MANAGER, Source, from_spec, resolve
from pcpcheck.shared.step_inputs import dummy_tokens, global_maps, positions, step_arrays
from pcpcheck.worker import deployment, rankctx
from pcpcheck.worker.loader import Target, exec_release_file, make_target
from pcpcheck.worker.release_batch import (
    LocalBatch,
    PartitionPath,
    StandInInputBatch,
    StandInInputBuffers,
    from_segments,
    partition,
    partition_path,
)
from pcpcheck.worker.release_builder import BUILDER, ManagerBuilder, manager_builder
from pcpcheck.worker.release_calls import CALLER_FILES, WrapperCall, wrapper_calls
from pcpcheck.worker.release_config import MODEL_CONFIG, PARALLEL, regime_configs
from pcpcheck.worker.release_draft import COMPUTE, draft_call_sites
from pcpcheck.worker.release_excerpts import (
    BACKEND_UTILS,
    MODEL_RUNNER,
    SORT,
    SPLIT,
    check_sort,
    interleave_rule,
    load_function,
)
from pcpcheck.worker.release_kernels import (
    BlockTablesPath,
    UnpinnedTorch,
    import_triton,
    load_block_tables,
    provide_kernels,
)
from pcpcheck.worker.release_paths import path_table
from pcpcheck.worker.standins import StandInSpace
from pcpcheck_reference import ERA_CURRENT, ERA_V026
from pcpcheck_spec.names import (
    DCP,
    DRAFT,
    DRAFT_MIXED,
    DRAFT_REGIMES,
    REPLICATED,
    SHARDED,
    Batch,
    Request,
)

MLA_WRAPPER = "maybe_gather_mla_latent_cache_inputs"
INDEXER_WRAPPER = "maybe_gather_indexer_k"
GATHER = "_gather_prefill_cache_inputs"
SPECULATOR_CONFIG = "vllm.v1.worker.gpu.spec_decode.speculator_config"  # 0.34 on
SHARD = "shard_decode_requests"
# The data each wrapper's callers pass it (its K/V tensors, the slot map, num_decode_tokens):
# the rest of its arguments are read from their configuration (pcpcheck.worker.release_calls).
WRAPPER_DATA = {MLA_WRAPPER: 4, INDEXER_WRAPPER: 3}


# ---------------------------------------------------------------------------------------------
# Working stand-ins for what the layout methods use (everything else stays inert)


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (2, 0)
    FULL_AND_PIECEWISE = (2, 1)

    def has_full_cudagraphs(self) -> bool:
        return self in (CUDAGraphMode.FULL, CUDAGraphMode.FULL_DECODE_ONLY,
                        CUDAGraphMode.FULL_AND_PIECEWISE)

    def separate_routine(self) -> bool:
        return isinstance(self.value, tuple)


def _host_to_device(data, *args, device=None, dtype=None, out=None, **kwargs):
    """async_tensor_h2d / async_copy_to_gpu on CPU: a copy (into `out` when given)."""
    tensor = torch.from_numpy(np.array(data)) if not isinstance(data, torch.Tensor) else data
    if dtype is not None:
        tensor = tensor.to(dtype)
    if out is not None:
        return out.copy_(tensor)
    return tensor.clone()


def _annotated(name: str) -> type:
    """A real class for a type the manager file annotates with (annotations are evaluated);
    constructed with any arguments."""
    return type(name, (), {"__module__": "pcpcheck.vllm.standin",
                           "__init__": lambda self, *args, **kwargs: None})


# Working stand-ins for names the layout methods use, each taking effect only where its module
# cannot run here (a tree without it; CUDAGraphMode is defined beside pydantic configs): a
# release's own module, where it runs, always wins.
FALLBACKS: dict[str, dict[str, object]] = {
    "vllm.config": {"CUDAGraphMode": CUDAGraphMode, "VllmConfig": _annotated("VllmConfig")},
    "vllm.config.compilation": {"CUDAGraphMode": CUDAGraphMode},
    "vllm.utils.torch_utils": {"async_tensor_h2d": _host_to_device},
    "vllm.v1.worker.gpu.buffer_utils": {"async_copy_to_gpu": _host_to_device},
    "vllm.v1.worker.gpu.block_table": {"BlockTables": _annotated("BlockTables")},
    "vllm.v1.worker.gpu.input_batch": {"InputBatch": StandInInputBatch,
                                       "InputBuffers": StandInInputBuffers},
    "vllm.v1.worker.gpu.states": {"RequestState": _annotated("RequestState")},
}
# What the platform answers on CPU, whatever the release's module says: no pinned memory
# (pinning moves no value).
PLATFORM: dict[str, dict[str, object]] = {
    "vllm.utils.platform_utils": {"is_pin_memory_available": lambda: False},
    "vllm.v1.worker.gpu.buffer_utils": {"torch": UnpinnedTorch()},
}


# ---------------------------------------------------------------------------------------------
# The release


@dataclass(kw_only=True)
class Release:
    source: Source
    manager: type[Any]  # PCPManager
    gather_module: object
    gather: Target  # the release's gather
    caps: Capabilities
    stand_ins: list[str]  # the modules stood in for, one line per reason
    adapted: list[str]  # working stand-ins provided, and how pcpcheck adapted to the release
    kernels: BlockTablesPath  # the release's BlockTables, or why slot maps stay modeled
    sort: object = None  # the release's sort_batch_req_ids, or None (the order stays 0.33's key)
    split: object = None  # its split_decodes_and_prefills, or None (nd: the leading decode rows)
    # how its partition_batch builds each rank's local batch, or why it is not run
    partition: PartitionPath = dataclasses.field(default_factory=PartitionPath)
    paths: list[dict] | None = None  # the path table (path_table): which stage runs the release's code
    calls: dict[str, WrapperCall] = dataclasses.field(default_factory=dict)  # by wrapper
    space: StandInSpace | None = None  # its modules: its configuration classes are built per step
    builder: ManagerBuilder | None = None  # how its model runner builds the manager, where it does

    @property
    def name(self) -> str:
        return f"vLLM {self.source.release}"

    @functools.cached_property
    def manager_params(self) -> set[str]:  # read on every step: its signature once
        return set(_params(self.manager.__init__))

    @functools.cached_property
    def step_dummies(self) -> Callable[[Batch], int]:
        """dummy_tokens(batch, caps): a reference layout, asked several times per rank and
        step, made once per step."""
        return functools.lru_cache(maxsize=16)(functools.partial(dummy_tokens, caps=self.caps))

    @functools.cached_property
    def step_global_maps(self) -> Callable[[Batch, int], np.ndarray]:
        """global_maps(batch, dcp_rank) with the release's KV groups: the reference formula's
        global slot maps where its kernels do not run, one per step and DCP rank (every rank of
        a D = 1 step asks for the same)."""
        return functools.lru_cache(maxsize=16)(functools.partial(
            global_maps, second_replicated=self.caps.replicated_kv_group))

    @property
    def files(self) -> dict[str, str]:
        return dict(self.source.hashes)


CPU_TORCH = ["Tensor.pin_memory(): the tensor itself (no accelerator here; pinning moves no "
             "value)", "torch.compiler.allow_in_graph(f): f (nothing is compiled here; it "
             "would import torch._dynamo, 5 s, for a mark only torch.compile reads)"]


def _torch_on_cpu() -> None:
    """torch as the release's modules meet it here (CPU_TORCH): `Tensor.pin_memory()` (0.29's
    async_copy_to_gpu pins its input) raises without an accelerator, and pinning moves no
    value (on a GPU too: the deployment's torch.cuda answers that one is there, so the machine's
    own accelerator is not asked); `torch.compiler.allow_in_graph`
    (vllm/utils/gpu_sync_debug.py, at import) marks a function for torch.compile, which never
    runs here."""
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.compiler.allow_in_graph = lambda fn: fn


def _space(source: Source) -> tuple[StandInSpace, bool]:
    """The release's space (its own modules first), with pcpcheck's stand-ins and, where triton
    is installed, what its kernels need; and whether triton is."""
    space = StandInSpace(source)
    deployment.furnish(space)
    _torch_on_cpu()
    for module, names in FALLBACKS.items():
        for name, value in names.items():
            space.fallback(module, name, value)
    for module, names in PLATFORM.items():
        for name, value in names.items():
            space.provide(module, name, value)
    triton = import_triton()
    if triton is not None:
        provide_kernels(space, *triton)
    return space, triton is not None


def _params(function) -> dict:
    try:
        return dict(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return {}


def _require(owner: str, obj, name: str):
    value = getattr(obj, name, None)
    if value is None:
        raise InterfaceDrift(f"{owner} has no {name} (renamed or removed in this release)")
    return value


def _draft_config(space: StandInSpace) -> SimpleNamespace:
    """A speculative_config for single-module MTP drafts; its `speculator_config` the release's
    own (`get_speculator_config_class(spec)(spec)`, 0.34 on), where the tree has one."""
    spec = SimpleNamespace(method="mtp", custom_method=None, num_speculative_tokens=1,
                           use_dspark=lambda: False, use_multi_module_mtp=lambda: False,
                           draft_model_config=SimpleNamespace(use_mla=True,
                                                              speculator_config_class=None))
    if space.tree is not None and space.tree.module_file(SPECULATOR_CONFIG) is not None:
        module = space.module(SPECULATOR_CONFIG)
        spec.speculator_config = module.get_speculator_config_class(spec)(spec)
    return spec


def _synthetic_config(regime: str, pcp: int, dcp: int, speculative: bool, space: StandInSpace,
                      interleave: int = 1, block_size: int = 16, sizes: tuple[int, int] | None = None):
    """A vllm_config for validate_config and the manager's builder: the regime's own parallel,
    cache and scheduler configuration (release_config: the release's classes where they run
    here), sparse MLA (DeepSeek-V3.2: `MODEL_CONFIG`), no CUDA graphs, with single-module MTP
    drafts when `speculative`. `sizes`, a step's (max_num_seqs, max_num_batched_tokens): the
    scheduler configuration gives them, and the parallel one is pcpcheck's model where it
    contradicts the regime's decode sharding (a regime no configuration of the release makes,
    said under adapted: `_configured`)."""
    configs = regime_configs(space, regime, pcp, dcp, interleave, block_size)
    parallel, scheduler = configs.parallel, configs.scheduler
    if sizes is not None:
        shards = getattr(parallel, "pcp_shard_decode_requests", regime == SHARDED)
        if bool(shards) != (regime == SHARDED):
            parallel = configs.modelled_parallel
        scheduler = copy.copy(scheduler)  # the regime's, with the step's sizes (not validated)
        for name, value in zip(("max_num_seqs", "max_num_batched_tokens"), sizes):
            object.__setattr__(scheduler, name, value)
    return SimpleNamespace(
        parallel_config=parallel, cache_config=configs.cache,
        scheduler_config=scheduler,
        model_config=SimpleNamespace(
            use_mla=True, is_encoder_decoder=False,
            hf_text_config=SimpleNamespace(index_topk=2048, model_type="deepseek_v32")),
        lora_config=None, speculative_config=_draft_config(space) if speculative else None,
        # the release's own enum where vllm.config runs (validate_config compares its members)
        compilation_config=SimpleNamespace(cudagraph_mode=getattr(
            space.module("vllm.config"), "CUDAGraphMode", CUDAGraphMode).NONE))


def _configured(calls: dict[str, WrapperCall], space: StandInSpace, adapted: list[str]) -> None:
    """A regime no configuration of the release makes, said under "adapted": where its own
    ParallelConfig is built, what its layers pass the wrappers as the gather's shard flag (with
    DCP = 1) may contradict the regime. Such a regime is still checked as the release's code
    allows (a fork may configure it), the wrappers given the regime's flag (`_call_entry`)."""
    for regime in (SHARDED, REPLICATED):
        configs = regime_configs(space, regime, 2, 1, 1, 16)
        for call in calls.values():
            if PARALLEL in configs.unbuilt or call.shard not in call.config:
                continue
            value = call.evaluate(configs.parallel)[call.shard]
            if bool(value) != (regime == SHARDED):
                adapted.append(
                    f"{regime}: no configuration of this release makes it (its ParallelConfig "
                    f"gives {call.config[call.shard]} = {value} with DCP = 1, which its layers "
                    f"pass the wrappers as {call.shard}); checked as its code allows, the "
                    f"wrappers given {call.shard} = {regime == SHARDED} (pcpcheck's answer)")
                break


def _rejects(manager, space: StandInSpace, regime: str, pcp: int, dcp: int, speculative: bool
             ) -> tuple[str | None, str | None]:
    """(validate_config's NotImplementedError message for this configuration, else None;
    why it could not be evaluated, else None): the release's own code decides, or nothing does."""
    validate = getattr(manager, "validate_config", None)
    if validate is None:
        return None, None  # a release without validate_config rejects nothing
    try:
        with space.active():  # the release's code may import its modules by name
            validate(_synthetic_config(regime, pcp, dcp, speculative, space), False)
    except NotImplementedError as exc:
        return (str(exc).splitlines()[0] if str(exc) else "NotImplementedError"), None
    except Exception as exc:  # noqa: BLE001 - it reads what pcpcheck cannot give: no verdict on a guess
        text = " ".join(str(exc).split())[:300]
        return None, (f"{NOT_EVALUATED}its validate_config(PCP={pcp}, DCP={dcp}, drafts="
                      f"{speculative}) raised {type(exc).__name__}: {text}")
    return None, None


def _capabilities(manager, gather, calls: dict[str, WrapperCall], space: StandInSpace,
                  adapted: list[str], built: bool) -> Capabilities:
    """`built`: the release's own builder makes its managers (the constructor's keywords are
    its business); else pcpcheck calls the constructor, by the keywords it must have."""
    init = _params(manager.__init__)
    for name in () if built else ("pcp_world_size", "pcp_rank", "device", "dcp_world_size",
                                  "dcp_rank"):
        if name not in init:
            raise InterfaceDrift(f"PCPManager.__init__ has no parameter {name!r}")
    layout = _params(_require("PCPManager", manager, "_build_batch_layout"))
    if len(layout) < 5:
        raise InterfaceDrift("PCPManager._build_batch_layout takes fewer than its four inputs "
                             "(num_scheduled_tokens, num_computed_tokens, is_prefilling, "
                             "query_start_loc_np)")
    _require("PCPManager", manager, "_convert_to_gathered_slot_mappings")
    shards = sorted({call.shard for call in calls.values()
                     if call.shard in (*call.positional, *call.keywords)})
    caps = Capabilities(
        era=ERA_CURRENT if hasattr(manager, "replicated_requests") else ERA_V026,
        manager_shards=SHARD in init,
        gather_shard=gather.accepts_shard,
        wrapper_shard_keyword=", ".join(shards) or None,
        graph_padding="padded_num_tokens" in layout,
        replicated_method=hasattr(manager, "replicated_requests"),
        wrappers=tuple(calls))
    if not caps.manager_shards:
        caps.not_applicable[SHARDED] = ("its PCPManager has no shard_decode_requests: decodes "
                                        "are never sharded")
    if not hasattr(manager, "validate_config"):
        adapted.append("PCPManager has no validate_config: the release rejects no configuration")
    probes = ((2, 2, False, (DCP,), "PCP+DCP"), (2, 1, True, (DRAFT, DRAFT_MIXED), "drafts"),
              (2, 1, False, (REPLICATED,), "PCP itself"))
    _configured(calls, space, adapted)
    for pcp, dcp, speculative, regimes, what in probes:
        rejected, unevaluated = _rejects(manager, space, regimes[0], pcp, dcp, speculative)
        for regime in regimes:
            if rejected:
                caps.not_applicable[regime] = f"its validate_config rejects {what}: {rejected}"
            elif unevaluated:
                caps.not_applicable[regime] = unevaluated
    return caps


def load_release(source: Source | str) -> Release:
    """Load SOURCE's PCP path. SourceError / LoadError / InterfaceDrift: one line each."""
    if not isinstance(source, Source):
        source = resolve(source)
    if not source.has(MANAGER):
        raise InterfaceDrift(f"{source.describe()} has no {MANAGER}")
    gather_path = next((p for p in GATHERS if source.has(p)), None)
    if gather_path is None:
        raise InterfaceDrift(f"{source.describe()} has none of {', '.join(GATHERS)}")
    space, triton = _space(source)
    kernels = load_block_tables(source, space, triton)
    manager_module = exec_release_file(source, MANAGER, space)
    manager = _require(MANAGER, manager_module, "PCPManager")
    gather_module = exec_release_file(source, gather_path, space)
    try:
        gather = make_target(gather_module, GATHER, source.filename(gather_path),
                              source.filename(gather_path), space, gather_path.rpartition("/")[2])
    except LoadError as exc:
        raise InterfaceDrift(str(exc)) from None
    adapted = [*space.provided, *CPU_TORCH]
    wrappers = {}
    for name in (MLA_WRAPPER, INDEXER_WRAPPER):
        function = getattr(gather_module, name, None)
        if function is None:
            adapted.append(f"{gather_path} has no {name}: its cases call the gather directly")
        else:
            wrappers[name] = function
    calls = wrapper_calls(source, gather_path, wrappers,
                          {name: WRAPPER_DATA[name] for name in wrappers}, GATHER, SHARD)
    adapted += [f"{name}: no call of it in {' or '.join(CALLER_FILES)}: no step enters through "
                "it" for name in wrappers if name not in calls]
    adapted += [f"{call.wrapper} called as its layers call it ({', '.join(call.sites)}): "
                + ", ".join([*call.positional, *(f"{k}=" for k in call.keywords)])
                + "".join(f"; {parameter} = {expression}" for parameter, expression
                          in call.config.items()) for call in calls.values()]
    adapted += [*regime_configs(space, REPLICATED, 2, 1, 1, 16).lines(), MODEL_CONFIG]
    local_batches = partition_path(manager_module, manager)
    builder = manager_builder(source, manager_module, MODEL_RUNNER, local_batches.real)
    caps = _capabilities(manager, gather, calls, space, adapted, builder is not None)
    if caps.era == ERA_V026:
        adapted.append("no PCPManager.replicated_requests: judged by the 0.26 layout model")
    if not caps.graph_padding:
        adapted.append("_build_batch_layout has no padded_num_tokens: no graph padding drawn")
    kernels = _check_block_tables(kernels, manager, adapted)
    adapted.append(builder.note() if builder is not None else
                   f"PCPManager(...) called by pcpcheck: no {BUILDER} its model runner calls")
    adapted.append(local_batches.note if local_batches.real else
                   f"PCPManager.partition_batch not run: {local_batches.reason}; each rank's "
                   "gather gets the rows its layout's segments give, the split their boundaries")
    if kernels.real and "dcp_sharded" in _params(kernels.block_tables.__init__):
        caps.replicated_kv_group = True
        adapted.append("BlockTables(dcp_sharded=[True, False]): the second KV group replicated "
                       "under DCP (compared by LAYOUT; its gather call, with that group's map, "
                       "judged by REPLICA, the first group's by SHARD)")
    draft_sites = draft_call_sites(source) if kernels.real else []
    if draft_sites and not all(regime in caps.not_applicable for regime in DRAFT_REGIMES):
        caps.draft_path = True
        adapted.append(f"draft steps: the speculators' own call of BlockTables.{COMPUTE} "
                       f"({', '.join(draft_sites)}) on the global batch; the token count "
                       "passed: the map's length (the rows where it is padded to its DP "
                       "padding, the real tokens where not)")
    if kernels.real and kernels.dummies:
        caps.dummy_requests = True
        adapted.append("dummy requests: a step's graph padding rows reach the slot kernel as one "
                       "request with idx_mapping -1 after the real ones (positions 0, 1, ...); "
                       "its slots must all be -1 (LAYOUT's dummy_slots)")
    caps.interleave_default, caps.interleave_divisors, note = interleave_rule(source)
    adapted.append(f"interleave sizes drawn (dcp): the strategy's (1, 2; --scope interleaves=) "
                   f"that this release accepts, else its default: {note}")
    sort, unsorted = load_function(source, MODEL_RUNNER, SORT)
    if sort is not None:
        check_sort(sort)
    split, unsplit = load_function(source, BACKEND_UTILS, SPLIT)
    release = Release(source=source, manager=manager, gather_module=gather_module, gather=gather,
                      caps=caps, stand_ins=space.stood_in_by_reason(), adapted=adapted,
                      kernels=kernels, sort=sort, split=split, partition=local_batches,
                      calls=calls, space=space, builder=builder)
    _probe(release)
    release.paths = path_table(source, gather_path, kernels.reason if not kernels.real else "",
                               bool(calls), unsorted, unsplit, caps.dummy_requests,
                               local_batches.reason, draft_sites if caps.draft_path else [],
                               builder.sites if builder is not None else ())
    return release


def _check_block_tables(kernels: BlockTablesPath, manager, adapted: list[str]) -> BlockTablesPath:
    """The release's BlockTables feeding its manager's own prepare_slot_mappings, where the
    manager takes them; else the slot maps stay the reference formula's, and the reason says so."""
    if not kernels.real:
        return kernels
    init = _params(manager.__init__)
    missing = [p for p in ("block_tables", "max_num_reqs", "max_num_tokens") if p not in init]
    if missing or not hasattr(manager, "prepare_slot_mappings"):
        why = (f"its PCPManager.__init__ has no {missing[0]!r}" if missing
               else "its PCPManager has no prepare_slot_mappings")
        return BlockTablesPath(reason=f"{why}: the block tables cannot feed it")
    adapted += kernels.adapted
    adapted.append("prepare_slot_mappings reads the global batch's idx_mapping, "
                   "query_start_loc, positions and num_tokens as pcpcheck gives them (a dummy "
                   "request after the real ones where the step has graph padding)")
    return kernels


def _probe(release: Release) -> None:
    """Lay one small step out with rank 0's manager: an internal it lacks (a segment field, an
    attribute the layout sets) is interface drift, named in one line, not a verdict per case."""
    step = Batch(REPLICATED, 2, (Request(1, False, 0, (0,)), Request(5, True, 0, (1,))), 16)
    try:
        manager_view(release, step, 0)
    except AttributeError as exc:
        raise InterfaceDrift(f"PCPManager layout: {exc}") from None
    except TypeError as exc:  # a changed signature: unexpected or missing argument
        raise InterfaceDrift(f"PCPManager layout call: {exc}") from None


# ---------------------------------------------------------------------------------------------
# The release's manager laid out on CPU (a rank's view of a step)

def kernel_step(release, batch: Batch) -> bool:
    """Whether this step's slot maps come from the release's own kernels: every step's, where
    they run here (`release.kernels.real`); else the reference formula's, the path table says
    why."""
    return release.kernels.real


def make_manager(release, batch: Batch, rank: int):
    """Rank `rank`'s PCPManager for the step's regime, on CPU, its buffers sized by the step,
    with the release's own block tables for the step where they run (kernel_step): built as its
    model runner builds it where it has a builder (release_builder), else by pcpcheck's call of
    its constructor."""
    dcp_size, dcp_rank = reference.dcp_size(batch), rank if batch.regime == DCP else 0
    kernels = kernel_step(release, batch)
    dummies = release.step_dummies(batch) if kernels else 0
    sizes = (max(len(batch.requests) + bool(dummies), 1),
             max(sum(r.num_tokens for r in batch.requests) + dummies, batch.graph_size, 1))
    tables = (release.kernels.for_step(batch, dcp_size, dcp_rank, sizes[1],
                                       release.caps.replicated_kv_group) if kernels else None)
    if release.builder is not None:
        return _built(release, batch, rank, sizes, tables)
    kwargs: dict[str, Any] = dict(pcp_world_size=batch.pcp_size, pcp_rank=rank,
                                  device=torch.device("cpu"), dcp_world_size=dcp_size,
                                  dcp_rank=dcp_rank)
    if "cp_interleave" in release.manager_params:
        kwargs["cp_interleave"] = batch.interleave
    if release.caps.manager_shards:
        kwargs["shard_decode_requests"] = batch.regime == SHARDED
    if kernels or release.partition.real:  # sizes its input buffers and slot-map buffers
        kwargs.update(max_num_reqs=sizes[0], max_num_tokens=sizes[1])
        if kernels:
            kwargs["block_tables"] = tables
    return release.manager(**kwargs)


def _built(release, batch: Batch, rank: int, sizes: tuple[int, int], tables):
    """The manager from the release's own builder, given what its model runner passes: the
    step's configuration (its scheduler's max_num_seqs and max_num_batched_tokens the step's
    `sizes`), the CPU, a text model, the step's block tables, the release's class; the rank's
    PCP group (in a worker the rank's own; a rank laid out alone, its place) and its DCP group
    (D = P in dcp)."""
    given = {"vllm_config": _synthetic_config(batch.regime, batch.pcp_size,
                                              reference.dcp_size(batch), False, release.space,
                                              batch.interleave, batch.block_size, sizes),
             "device": torch.device("cpu"), "supports_mm_inputs": False, "block_tables": tables,
             "cls": release.manager, "req_states": None}
    builder = release.builder
    pcp = rankctx.bound_group_or(rankctx.RankPosition(rank, batch.pcp_size))
    with rankctx.bound_group(pcp), rankctx.bound_dcp(pcp if batch.regime == DCP else rankctx.SOLO):
        manager = builder.build(**{name: given[name] for name in builder.passed})
    if manager is None:
        raise InterfaceDrift(f"{BUILDER} built no manager for PCP = {batch.pcp_size}")
    if tables is not None and not builder.takes_block_tables:
        manager.set_block_tables(tables)  # as its model runner does, once the tables exist
    return manager


def manager_view(release, batch: Batch, rank: int) -> tuple[dict, LocalBatch]:
    """What rank `rank`'s own manager lays out (every rank's rows, as this rank sees them; their
    `num_decode_tokens` the layout's leading decode rows, which LAYOUT compares), and the rank's
    local batch: the one its partition_batch builds where the release's runs
    (`release.partition`), else the one its layout's segments give."""
    manager = make_manager(release, batch, rank)
    q, computed, prefilling, starts = step_arrays(batch)
    padded = batch.graph_size if batch.graph_size and release.caps.graph_padding else None
    local = None
    if release.partition.real:
        segments_by_rank, local = partition(release.partition, manager, batch, rank, padded)
    else:
        kwargs = {} if padded is None else {"padded_num_tokens": padded}
        segments_by_rank, _ = manager._build_batch_layout(q, computed, prefilling, starts,
                                                          **kwargs)
    gidx = _plain(manager._padded_gather_idx)
    width = len(gidx) // batch.pcp_size
    laid_out = [from_segments(segments, prefilling, r, width)
                for r, segments in enumerate(segments_by_rank)]
    view = {
        "rows": [each.rows for each in laid_out],
        "num_decode_tokens": [each.leading_decodes() for each in laid_out],
        "width": width,
        "gidx": gidx,
        "wmask": [bool(v) for v in _plain(manager._gathered_kv_write_mask)],
        "restore": _plain(manager._hidden_restore_idx),
    }
    if release.caps.replicated_method:
        view["replicated"] = [bool(v) for v in manager.replicated_requests(q, prefilling)]
    if kernel_step(release, batch):  # the release's kernels compute the global maps
        # a dummy request (idx_mapping -1) after the real ones, as a padded graph batch has
        dummies = release.step_dummies(batch)
        real = int(starts[-1])
        manager._global_batch = SimpleNamespace(
            idx_mapping=torch.tensor(list(range(len(q))) + [-1] * bool(dummies),
                                     dtype=torch.int32),
            query_start_loc=torch.tensor(list(starts) + [real + dummies] * bool(dummies),
                                         dtype=torch.int32),
            positions=torch.from_numpy(np.concatenate(
                [positions(batch), np.arange(dummies, dtype=np.int64)])),
            num_tokens=real + dummies)
        expanded = manager.prepare_slot_mappings()
        if dummies:
            view["dummy_slots"] = [[int(v) for v in row[real:real + dummies]]
                                   for row in _plain(release.kernels.last_global)]
    else:  # the reference formula's global maps (semantics section 3)
        # each rank its own copy: the release's code may write into what it is given
        maps = torch.tensor(release.step_global_maps(batch, rank if batch.regime == DCP else 0))
        expanded = manager._convert_to_gathered_slot_mappings(maps)
    view["expanded"] = [[int(v) for v in row] for row in _plain(expanded)]
    return view, local if local is not None else laid_out[rank]


def _plain(value) -> list:
    if isinstance(value, torch.Tensor):
        return value.cpu().tolist()
    return np.asarray(value).tolist()


@functools.lru_cache(maxsize=8)
def _cached(spec_json: str) -> Release:
    return load_release(from_spec(json.loads(spec_json)))


def release_from_spec(spec: dict) -> Release:
    """The release a worker uses: loaded once per process from its plain-data spec."""
    return _cached(json.dumps(spec, sort_keys=True))


__all__ = ["Release", "load_release", "release_from_spec"]
