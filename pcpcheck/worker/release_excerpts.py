"""Single functions of a release taken from modules too big to load whole, run in the worker
(release code runs only there): the model runner's batch order and the attention metadata
builders' decode/prefill split.

Each function is cut from its file's source (by `ast`) and executed alone with the loader's
stand-ins. `load_function(source, relpath, name)` gives `(function, "")`, or `(None, why)`: the
stage then stays modeled and the path table says why.

- `step_order(sort, batch)`: the permutation of a step's requests that `sort_batch_req_ids`
  (vllm/v1/worker/gpu/model_runner.py) gives, fed as the model runner feeds it, by parameter
  name: each request's scheduled tokens, a decode's tokens past its first as its draft tokens
  (0.29 on), and a decode query length of 1.
- `rank_num_decode_tokens(split, query_start_loc, is_prefilling, ...)`: `num_decode_tokens` of
  a rank's local batch (pcpcheck.worker.release_batch) from `split_decodes_and_prefills`
  (vllm/v1/attention/backends/utils.py), called as the MLA metadata builder calls it under PCP
  with its class defaults: `decode_threshold` its `reorder_batch_threshold` (1),
  `require_uniform` (its query-length support is not VARLEN) and
  `treat_short_extends_as_decodes=not use_pcp` (False).
- `interleave_rule(source)`: the interleave sizes (`cp_kv_cache_interleave_size`) the release
  accepts, read from its config: its default (vllm/config/parallel.py) and whether
  `validate_block_size` (vllm/config/vllm.py) accepts any size that divides the block size.
"""

from __future__ import annotations

import ast
import inspect
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from pcpcheck.shared.errors import InterfaceDrift, LoadError
from pcpcheck.worker.loader import exec_source
from pcpcheck.worker.standins import StandInSpace
from pcpcheck_spec.names import Batch

MODEL_RUNNER = "vllm/v1/worker/gpu/model_runner.py"
SORT = "sort_batch_req_ids"
BACKEND_UTILS = "vllm/v1/attention/backends/utils.py"
SPLIT = "split_decodes_and_prefills"
DECODE_QUERY_LEN = 1
PARALLEL_CONFIG = "vllm/config/parallel.py"
VLLM_CONFIG = "vllm/config/vllm.py"
INTERLEAVE_DEFAULT = re.compile(r"^\s*cp_kv_cache_interleave_size:\s*int\s*=\s*(\d+)", re.M)
# validate_block_size (DCP > 1): `interleave <= block_size and block_size % interleave == 0`
INTERLEAVE_DIVIDES = re.compile(
    r"cp_kv_cache_interleave_size\s*<=\s*block_size\s*and\s*block_size\s*%\s*"
    r"self\.parallel_config\.cp_kv_cache_interleave_size\s*==\s*0")
SPLIT_FLAGS = dict(decode_threshold=1, require_uniform=True, treat_short_extends_as_decodes=False)


def interleave_rule(source) -> tuple[int, bool, str]:
    """(default, divisors, note): the release's default interleave size, whether it accepts
    every size that divides the block size (else only the default), and where that was read
    (or what was assumed, for a source without its config files)."""
    notes, default, divisors = [], 1, True
    if source.has(PARALLEL_CONFIG):
        found = INTERLEAVE_DEFAULT.search(source.read(PARALLEL_CONFIG))
        if found is None:
            raise InterfaceDrift(f"{PARALLEL_CONFIG} has no cp_kv_cache_interleave_size default")
        default = int(found.group(1))
        notes.append(f"default {default} ({PARALLEL_CONFIG})")
    else:
        notes.append(f"default 1 assumed ({PARALLEL_CONFIG} is not in this source)")
    if source.has(VLLM_CONFIG):
        divisors = INTERLEAVE_DIVIDES.search(source.read(VLLM_CONFIG)) is not None
        notes.append(f"{'sizes that divide the block size' if divisors else 'only the default'}"
                     f" accepted ({VLLM_CONFIG} validate_block_size)")
    else:
        notes.append(f"sizes that divide the block size assumed accepted ({VLLM_CONFIG} is not "
                     "in this source)")
    return default, divisors, "; ".join(notes)


def load_function(source, relpath: str, name: str):
    """(the module-level function `name` of `relpath`, "") or (None, why it is not run)."""
    if not source.has(relpath):
        return None, f"{relpath} is not in this source"
    text = source.read(relpath)
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise InterfaceDrift(f"{relpath}:{exc.lineno}: syntax error") from None
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        return None, f"{relpath} has no module-level {name}"
    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    lines = text.splitlines()[start - 1:node.end_lineno]
    # blank lines before it keep the file's line numbers in a traceback; annotations stay text
    function_text = ("from __future__ import annotations\n" + "\n" * (start - 2)
                     + "\n".join(lines) + "\n")
    package = relpath.rpartition("/")[0].replace("/", ".")
    module: Any  # the function's module: given the file's imports below
    try:
        module = exec_source(function_text, source.filename(relpath), StandInSpace(), package)
    except LoadError as exc:
        raise InterfaceDrift(f"{relpath}: {name}: {exc}") from None
    module.torch, module.np = torch, np  # the file's own imports, cut away with the rest of it
    return getattr(module, name), ""


# The sort's parameters pcpcheck knows how to give (0.26-0.28 take no draft tokens).
SORT_PARAMS = ("num_tokens_per_req", "draft_tokens", "decode_query_len")


def check_sort(sort) -> None:
    """InterfaceDrift (one line) if the release's sort takes a parameter pcpcheck cannot give."""
    unknown = [p for p in inspect.signature(sort).parameters if p not in SORT_PARAMS]
    if unknown:
        raise InterfaceDrift(f"{MODEL_RUNNER}: {SORT} takes {unknown[0]!r}, which pcpcheck does "
                             "not know how to give")


def step_order(sort, batch: Batch) -> list[int]:
    """The release's order of the step's requests, as indices into `batch.requests`."""
    ids = [f"r{index}" for index in range(len(batch.requests))]
    given = {
        "num_tokens_per_req": {rid: r.num_tokens for rid, r in zip(ids, batch.requests)},
        "draft_tokens": {rid: [0] * (r.num_tokens - 1) for rid, r in zip(ids, batch.requests)
                         if not r.prefilling and r.num_tokens > 1},
        "decode_query_len": DECODE_QUERY_LEN}
    ordered = list(sort(**{p: given[p] for p in inspect.signature(sort).parameters}))
    if sorted(ordered) != sorted(ids):
        raise ValueError(f"{SORT} returned {ordered!r}, not an order of the step's requests")
    return [ids.index(rid) for rid in ordered]


def rank_num_decode_tokens(split, query_start_loc: list[int], is_prefilling: list[bool],
                           num_tokens: int, max_query_len: int) -> int:
    """nd of a rank's local batch, read as the attention metadata is built from it (0.34's
    model_states/default.py `prepare_attn`, eager: unpadded sizes): its request boundaries
    (num_reqs + 1), prefilling flags, real token count and longest query. A rank with no
    requests has no attention metadata: 0."""
    if len(query_start_loc) < 2:
        return 0
    metadata = SimpleNamespace(
        max_query_len=max_query_len, num_reqs=len(query_start_loc) - 1,
        num_actual_tokens=num_tokens,
        query_start_loc_cpu=torch.tensor(query_start_loc, dtype=torch.int32),
        is_prefilling=torch.tensor(is_prefilling, dtype=torch.bool))
    return int(split(metadata, **SPLIT_FLAGS)[2])


__all__ = ["BACKEND_UTILS", "MODEL_RUNNER", "SORT", "SPLIT", "SPLIT_FLAGS", "check_sort",
           "interleave_rule",
           "load_function",
           "rank_num_decode_tokens", "step_order"]
