"""The release's own configuration of a regime (semantics section 11): its ParallelConfig,
CacheConfig and SchedulerConfig (pydantic dataclasses in `vllm/config/`, run
from the tree where pydantic is installed: the `kernels` extra), built as a deployment of that
regime builds them, so what the path reads from its configuration (the decode sharding, the
interleave, validate_config's checks) is the release's computation, not pcpcheck's assumption.

`regime_configs(space, regime, pcp, dcp, interleave, block_size) -> RegimeConfigs`, made once
per worker process and arguments. A class that cannot be built here (its module is a stand-in,
or its constructor fails) is pcpcheck's model of it, and `unbuilt` says why: the report names it.
The model configuration is never built: it needs a model's files (`MODEL_CONFIG`), and so is
the compilation configuration's CUDA-graph mode, which only a VllmConfig resolves from it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pcpcheck.worker.standins import StandInModule, StandInSpace
from pcpcheck_spec.names import SHARDED

PARALLEL, CACHE, SCHEDULER = "ParallelConfig", "CacheConfig", "SchedulerConfig"
MODULES = {PARALLEL: "vllm.config.parallel", CACHE: "vllm.config.cache",
           SCHEDULER: "vllm.config.scheduler"}
# What a deployment's configuration holds besides the regime's sizes: one node, vLLM's default
# multiprocessing executor (the ParallelConfig's own default would probe for ray); a model length
# no drawn step comes near; a decoder-only model (PCP supports no other).
EXECUTOR = "mp"
# DCP's communication backend: the one MRV2's PCP + DCP requires (its validate_config, 0.34)
DCP_COMM_BACKEND = "ag_rs"
MAX_MODEL_LEN = 1 << 16
MODEL_CONFIG = ("ModelConfig and VllmConfig are not built: they need a model's files; "
                "validate_config reads pcpcheck's sparse MLA model (DeepSeek-V3.2) and CUDA-graph "
                "mode NONE (the mode only a VllmConfig resolves)")


@dataclass(frozen=True)
class RegimeConfigs:
    parallel: Any
    cache: Any
    scheduler: Any
    unbuilt: dict[str, str] = field(default_factory=dict)  # class -> why the model stands in
    # pcpcheck's model of the regime's parallel configuration: what a regime no configuration
    # of the release makes is given (the decode sharding the regime says)
    modelled_parallel: Any = None

    def lines(self) -> list[str]:
        """What the report says of them: each class the release's own, or why not."""
        built = [name for name in MODULES if name not in self.unbuilt]
        return ([f"{', '.join(built)}: the release's own, built per regime"] if built else []) + [
            f"{name}: pcpcheck's model ({why})" for name, why in self.unbuilt.items()]


def regime_configs(space: StandInSpace, regime: str, pcp: int, dcp: int, interleave: int,
                   block_size: int) -> RegimeConfigs:
    return _cached(space, regime, pcp, dcp, interleave, block_size)


@functools.lru_cache(maxsize=256)
def _cached(space: StandInSpace, regime: str, pcp: int, dcp: int, interleave: int,
            block_size: int) -> RegimeConfigs:
    unbuilt: dict[str, str] = {}
    models = {
        PARALLEL: SimpleNamespace(
            prefill_context_parallel_size=pcp, decode_context_parallel_size=dcp,
            cp_kv_cache_interleave_size=interleave, pipeline_parallel_size=1,
            enable_expert_parallel=False, dcp_comm_backend=DCP_COMM_BACKEND,
            pcp_shard_decode_requests=regime == SHARDED),
        CACHE: SimpleNamespace(block_size=block_size),
        SCHEDULER: SimpleNamespace(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False),
    }
    fields: dict[str, dict[str, Any]] = {
        PARALLEL: dict(prefill_context_parallel_size=pcp, decode_context_parallel_size=dcp,
                       cp_kv_cache_interleave_size=interleave,
                       distributed_executor_backend=EXECUTOR,
                       **({"dcp_comm_backend": DCP_COMM_BACKEND} if dcp > 1 else {})),
        CACHE: dict(block_size=block_size),
        SCHEDULER: dict(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False),
    }
    made = {}
    for name, module_name in MODULES.items():
        made[name], why = _build(space, module_name, name, fields[name])
        if made[name] is None:
            made[name], unbuilt[name] = models[name], why
    return RegimeConfigs(made[PARALLEL], made[CACHE], made[SCHEDULER], unbuilt,
                         models[PARALLEL])


def _build(space: StandInSpace, module_name: str, name: str, fields: dict) -> tuple[Any, str]:
    if space.tree is None:
        return None, "no vLLM tree"
    module = space.module(module_name)
    if isinstance(module, StandInModule):
        return None, space.why(module_name) or f"{module_name} is a stand-in"
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        return None, f"{module_name} has no class {name}"
    fields = {key: value for key, value in fields.items()
              if key in getattr(cls, "__dataclass_fields__", fields)}
    try:
        with space.imported():  # vllm/envs.py reads itself from sys.modules
            return cls(**fields), ""
    except Exception as exc:  # noqa: BLE001 - the release's class rejects what pcpcheck gives it
        text = " ".join(str(exc).split())[:200]
        return None, f"{name}({', '.join(fields)}) fails here: {type(exc).__name__}: {text}"


__all__ = ["MODEL_CONFIG", "RegimeConfigs", "regime_configs"]
