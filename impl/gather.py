"""``gather_prefill_cache_inputs``: the PCP KV-cache gather, vLLM's signature, torch.

Branches (pcp-semantics section 5; ``L`` = local rows, ``S`` = len(slot_mapping), ``P`` = PCP
world size, ``nd`` = num_decode_tokens):

- A  ``S <= L`` (unexpanded map): rows ``T[:S]``, slots ``s[:S]`` -- the spec's answer; upstream
  keeps ``[:nd]``, which drops the KV of real prefill-classified rows (bug class 10).
- B  ``S > L``, shard: all_gather every tensor, slots ``s[:P*L]``.
- C  ``S > L``, not shard, ``nd == L``: tensors unchanged, slots ``s[:L]`` (rank 0's block).
- D  ``S > L``, not shard, ``nd == 0``: all_gather every tensor, slots ``s[:P*L]``.
- E  ``S > L``, not shard, ``0 < nd < L``: ``T[:nd] ++ all_gather(T[nd:])``, slots
  ``s[:nd] ++ concat_q s[q*L+nd:(q+1)*L]``.

This module states the behaviour independently: it imports only torch and the group provider.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import torch

from .parallel_state import as_group, get_pcp_group

__all__ = ["gather_prefill_cache_inputs", "select_branch", "validate_gather_inputs"]


def _is_integer_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def validate_gather_inputs(
    tensors: Any, slot_mapping: Any, num_decode_tokens: Any, world_size: int | None = None
) -> tuple[tuple[torch.Tensor, ...], int, int, int]:
    """Check the gather's inputs; return ``(tensors as a tuple, L, S, nd)``.

    ``world_size`` (P), when given and ``S > L``, adds the pairing check ``S >= P*L``.
    Raises TypeError for a wrong kind of argument and ValueError for a wrong value.
    """
    if not isinstance(tensors, (tuple, list)):
        raise TypeError(f"tensors must be a tuple or list of tensors, got {type(tensors).__name__}")
    if len(tensors) == 0:
        raise ValueError("tensors must hold at least one tensor, got an empty sequence")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{i}] must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() == 0:
            raise ValueError(f"tensors[{i}] is 0-dimensional: it has no rows (dim 0) to gather")
    num_rows = tensors[0].shape[0]
    for i, t in enumerate(tensors):
        if t.shape[0] != num_rows:
            raise ValueError(
                f"row counts differ: tensors[0] has {num_rows} rows, tensors[{i}] has {t.shape[0]}"
            )
    if not isinstance(slot_mapping, torch.Tensor):
        raise TypeError(f"slot_mapping must be a torch.Tensor, got {type(slot_mapping).__name__}")
    if slot_mapping.dim() != 1:
        raise ValueError(f"slot_mapping must be 1-D, got shape {tuple(slot_mapping.shape)}")
    if not _is_integer_dtype(slot_mapping.dtype):
        raise TypeError(f"slot_mapping must have an integer dtype, got {slot_mapping.dtype}")
    if isinstance(num_decode_tokens, bool) or not isinstance(num_decode_tokens, numbers.Integral):
        raise TypeError(
            f"num_decode_tokens must be an int, got {type(num_decode_tokens).__name__}"
        )
    nd = int(num_decode_tokens)
    if not 0 <= nd <= num_rows:
        raise ValueError(f"num_decode_tokens={nd} is outside [0, {num_rows}] (the local row count)")
    num_slots = slot_mapping.shape[0]
    if world_size is not None:
        if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
            raise ValueError(f"the PCP group's world_size must be a positive int, got {world_size!r}")
        if num_rows < num_slots < world_size * num_rows:
            raise ValueError(
                f"slot_mapping has {num_slots} entries, between the local row count L={num_rows} "
                f"and P*L={world_size * num_rows}: rows and slots would not pair (an expanded map "
                "has P*L entries, an unexpanded one at most L)"
            )
    return tuple(tensors), num_rows, num_slots, nd


def select_branch(num_rows: int, num_slots: int, nd: int, shard: bool) -> str:
    """Branch letter of section 5 for ``L``, ``S``, ``nd`` and the shard flag."""
    if num_slots <= num_rows:
        return "A"
    if shard:
        return "B"
    if nd == num_rows:
        return "C"
    if nd == 0:
        return "D"
    return "E"


def _all_gather(group: Any, t: torch.Tensor, world_size: int) -> torch.Tensor:
    out = group.all_gather(t.contiguous(), dim=0)
    expected = (world_size * t.shape[0], *t.shape[1:])
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected or out.dtype != t.dtype:
        got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        raise RuntimeError(
            f"group.all_gather returned {got}, expected shape {expected} dtype {t.dtype}"
        )
    return out


def gather_prefill_cache_inputs(
    tensors: Sequence[torch.Tensor],
    slot_mapping: torch.Tensor,
    num_decode_tokens: int,
    shard_decode_requests: bool = False,
    *,
    group: Any = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Gather PCP-local cache-write inputs so that rows and slot_mapping pair for the kernel.

    ``group``: a vLLM-style group or a ProcessGroup; default ``get_pcp_group()``. The group is
    looked up only when the branch needs P (``S > L``), so branch A runs without one.
    Outputs are views of the inputs or fresh tensors; inputs are never mutated.
    """
    tensors, num_rows, num_slots, nd = validate_gather_inputs(
        tensors, slot_mapping, num_decode_tokens
    )
    if num_slots <= num_rows:  # A: unexpanded map, every real row is written
        return tuple(t[:num_slots] for t in tensors), slot_mapping[:num_slots]

    group = get_pcp_group() if group is None else as_group(group)
    world_size = group.world_size
    validate_gather_inputs(tensors, slot_mapping, nd, world_size)
    branch = select_branch(num_rows, num_slots, nd, bool(shard_decode_requests))
    total = world_size * num_rows

    if branch == "C":  # replicated, all decode: rank 0's block of the map
        return tensors, slot_mapping[:num_rows]
    if branch in ("B", "D"):  # every rank's rows, rank-major
        return tuple(_all_gather(group, t, world_size) for t in tensors), slot_mapping[:total]

    # E: replicated, mixed. Local decode rows with rank 0's decode slots, then every rank's
    # prefill rows with that rank's prefill slots.
    device = slot_mapping.device
    decode_idx = torch.arange(nd, device=device)
    prefill_idx = (
        torch.arange(world_size, device=device).unsqueeze(1) * num_rows
        + torch.arange(nd, num_rows, device=device).unsqueeze(0)
    ).reshape(-1)
    slots_out = slot_mapping[torch.cat((decode_idx, prefill_idx))]
    rows_out = tuple(
        torch.cat((t[:nd], _all_gather(group, t[nd:], world_size)), dim=0) for t in tensors
    )
    return rows_out, slots_out
