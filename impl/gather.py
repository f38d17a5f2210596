"""``gather_prefill_cache_inputs``: the PCP KV-cache gather, vLLM's signature, torch.

Branches (docs/semantics.md section 5; ``L`` = local rows, ``S`` = len(slot_mapping), ``P`` =
PCP world size, ``nd`` = num_decode_tokens):

- A  ``S <= L`` (unexpanded map): rows ``T[:S]``, slots ``s[:S]`` -- the spec's answer; upstream
  keeps ``[:nd]``, which drops the KV of real prefill-classified rows (bug class 10).
- B  ``S > L``, shard: all_gather every tensor, slots ``s[:P*L]``.
- C  ``S > L``, not shard, ``nd == L``: tensors unchanged, slots ``s[:L]`` (rank 0's block).
- D  ``S > L``, not shard, ``nd == 0``: all_gather every tensor, slots ``s[:P*L]``.
- E  ``S > L``, not shard, ``0 < nd < L``: ``T[:nd] ++ all_gather(T[nd:])``, slots
  ``s[:nd] ++ concat_q s[q*L+nd:(q+1)*L]``.

One collective per call: B, D and E issue a single ``all_gather(x, dim=0)`` whatever the number of
tensors (vLLM issues one per tensor: two for MLA). The wire format ``x``, which a test double
answering with canned data must produce (the rank-major concatenation of every rank's ``x``):

- one tensor: the tensor itself (made contiguous), its shape and dtype;
- several tensors, each flattened to ``(n, width)`` rows (``width`` = the product of its trailing
  dims, so ``n = 0`` works) and placed side by side in call order (``torch.cat(dim=1)``): in their
  dtype when all dtypes are equal, else each row block as bytes (``.view(torch.uint8)``). The
  reply, ``(P*n, total width)`` of that dtype, is split by columns back into each tensor's shape
  and dtype, each output dense (contiguous).

This module states the behaviour independently: it imports only torch, the group provider and
spec.names' PAD_SLOT_ID.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from pcpcheck_impl.parallel_state import as_group, get_pcp_group
from pcpcheck_spec.names import PAD_SLOT_ID

__all__ = [
    "CHECK_ND_AGREEMENT",
    "check_expanded_index_fits",
    "check_expanded_map",
    "check_flag",
    "check_nd_agreement",
    "check_slot_mapping",
    "check_tensor",
    "gather_prefill_cache_inputs",
    "resolve_shard_flag",
    "select_branch",
    "validate_gather_inputs",
]

# Debug flag: before the collectives of an expanded call (S > L), all_gather [nd, L, S, shard]
# over the group and raise ValueError on every rank if the ranks disagree (see check_nd_agreement).
# Off by default: it costs one small collective and a host sync per call. Per call, the keyword
# ``check_nd_agreement=`` of the gather (and of the wrappers) overrides it.
CHECK_ND_AGREEMENT: bool = False



def _is_integer_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _type_name(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dim()}-d torch.Tensor of {x.dtype}"
    return type(x).__name__


def _check_dense(name: str, t: torch.Tensor) -> None:
    # Nested and sparse tensors have no plain row dimension to slice and concatenate: refuse
    # them here rather than let torch fail deep inside (a nested tensor cannot even report
    # its shape).
    if t.is_nested:
        raise TypeError(
            f"{name} is a nested tensor ({t.layout}): expected a dense tensor whose dim 0 holds "
            "the rows (pad it with .to_padded_tensor(...) or concatenate its components)"
        )
    if t.layout != torch.strided:
        raise TypeError(
            f"{name} has the layout {t.layout}: expected a dense (torch.strided) tensor; call "
            ".to_dense() first"
        )


def check_tensor(name: str, t: Any) -> torch.Tensor:
    """``t`` must be a dense tensor with at least one dimension (its rows)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_type_name(t)}")
    _check_dense(name, t)
    if t.dim() == 0:
        raise ValueError(
            f"{name} is 0-dimensional (a scalar): expected a tensor whose dim 0 holds the rows"
        )
    return t


def check_slot_mapping(slot_mapping: Any) -> torch.Tensor:
    """``slot_mapping`` must be a 1-D tensor of a signed integer dtype (it holds PAD_SLOT_ID -1)."""
    if not isinstance(slot_mapping, torch.Tensor):
        raise TypeError(f"slot_mapping must be a torch.Tensor, got {_type_name(slot_mapping)}")
    _check_dense("slot_mapping", slot_mapping)
    if slot_mapping.dim() != 1:
        raise ValueError(
            f"slot_mapping must be 1-D (one slot per token), got shape {tuple(slot_mapping.shape)}"
        )
    dtype = slot_mapping.dtype
    if not _is_integer_dtype(dtype):
        raise TypeError(
            f"slot_mapping must have an integer dtype (int32 or int64), got {dtype}"
        )
    if torch.iinfo(dtype).min > PAD_SLOT_ID:  # a slot map must be able to hold it
        raise TypeError(
            f"slot_mapping has the unsigned dtype {dtype}, which cannot hold PAD_SLOT_ID="
            f"{PAD_SLOT_ID}: use int32 or int64"
        )
    return slot_mapping


def check_expanded_index_fits(num_rows: int, world_size: int, dtype: torch.dtype) -> None:
    """The expanded map's length ``P*L`` (its indices ``q*L + j`` run up to P*L-1) must fit the
    slot map's dtype. Pure arithmetic on sizes: testable without allocating P*L entries."""
    total = world_size * num_rows
    limit = torch.iinfo(dtype).max
    if total > limit:
        raise ValueError(
            f"the expanded slot map length P*L = {world_size}*{num_rows} = {total} overflows "
            f"slot_mapping's dtype {dtype} (max {limit}): use a wider slot dtype (int64)"
        )


def check_flag(name: str, value: Any) -> bool:
    """A flag (``shard_decode_requests``, ``use_pcp``) must be a Python bool.

    vLLM passes config values that are bools; anything else is a mistake that truthiness would
    hide (``"False"``, ``"no"``, ``2`` or a group passed positionally all read as True and take
    the sharded branch). ``numpy.bool_`` and bool tensors are refused too, with the hint
    ``bool(x)``: one accepted type keeps the check simple, and reading a tensor costs a device
    sync on every call.
    """
    if type(value) is bool:
        return value
    kind = type(value)
    if isinstance(value, torch.Tensor):
        got, bool_like = _type_name(value), value.dtype == torch.bool
    elif kind.__module__ == "numpy":
        # a numpy bool's dtype equals the type bool (`is` would not hold)
        got, bool_like = f"numpy.{kind.__name__} {value!r}", getattr(value, "dtype", None) == bool  # noqa: E721 - a dtype, not a type
    elif isinstance(value, (int, float, str, type(None))):
        got, bool_like = f"{kind.__name__} {value!r}", False
    else:  # a group or other object: its repr may be long or hold an address
        got, bool_like = kind.__qualname__, False
    raise TypeError(
        f"{name} must be a bool (True or False), got {got}" + (": pass bool(x)" if bool_like else "")
    )


def resolve_shard_flag(pcp_shard_decode_requests: Any, shard_decode_requests: Any) -> bool:
    """The wrappers' shard flag: vLLM 0.33.0's ``pcp_shard_decode_requests`` (default False) or
    the older keyword ``shard_decode_requests`` (default None: not given). Both given is refused
    when they could disagree (the new name set to True)."""
    new = check_flag("pcp_shard_decode_requests", pcp_shard_decode_requests)
    if shard_decode_requests is None:
        return new
    old = check_flag("shard_decode_requests", shard_decode_requests)
    if new:
        raise TypeError(
            "the shard flag was given twice: pass pcp_shard_decode_requests (vLLM 0.33.0's name) "
            "or shard_decode_requests (the older name), not both"
        )
    return old


def _check_num_decode_tokens(num_decode_tokens: Any, num_rows: int) -> int:
    if isinstance(num_decode_tokens, torch.Tensor):
        raise TypeError(
            f"num_decode_tokens must be a Python int (vLLM passes attn_metadata.num_decode_tokens), "
            f"got a {_type_name(num_decode_tokens)}: pass int(t); a tensor is refused because "
            "reading it costs a device sync on every call"
        )
    if isinstance(num_decode_tokens, bool) or not isinstance(num_decode_tokens, numbers.Integral):
        raise TypeError(
            f"num_decode_tokens must be an int, got {type(num_decode_tokens).__name__} "
            f"{num_decode_tokens!r}"
        )
    nd = int(num_decode_tokens)
    if nd < 0:
        raise ValueError(
            f"num_decode_tokens={nd} is negative: expected 0 <= num_decode_tokens <= L={num_rows} "
            "(the local row count)"
        )
    if nd > num_rows:
        raise ValueError(
            f"num_decode_tokens={nd} is above the local row count L={num_rows}: expected "
            f"0 <= num_decode_tokens <= {num_rows}"
        )
    return nd


def check_world_size(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"the PCP group's world_size must be a positive int, got {world_size!r}")
    return int(world_size)


def validate_gather_inputs(
    tensors: Any,
    slot_mapping: Any,
    num_decode_tokens: Any,
    *,
    names: Sequence[str] | None = None,
) -> tuple[tuple[torch.Tensor, ...], int, int, int]:
    """Check the gather's inputs; return ``(tensors as a tuple, L, S, nd)``.

    The one place the gather's inputs are checked (the MLA and indexer wrappers call it too);
    once the group is known, `check_expanded_map` adds what needs P. ``names``: what to call each
    tensor in messages (default ``tensors[i]``). Raises TypeError for a wrong kind of argument and
    ValueError for a wrong value. Reads only shapes, dtypes and devices: never a tensor's values
    (no device sync).
    """
    if not isinstance(tensors, (tuple, list)):
        raise TypeError(f"tensors must be a tuple or list of tensors, got {_type_name(tensors)}")
    if len(tensors) == 0:
        raise ValueError("tensors must hold at least one tensor, got an empty sequence")
    if names is None or len(names) != len(tensors):
        names = [f"tensors[{i}]" for i in range(len(tensors))]
    for name, t in zip(names, tensors):
        check_tensor(name, t)
    num_rows = tensors[0].shape[0]
    for name, t in zip(names, tensors):
        if t.shape[0] != num_rows:
            raise ValueError(
                f"row counts differ: {names[0]} has {num_rows} rows, {name} has {t.shape[0]} "
                "(every tensor must have the same leading dimension L)"
            )
    check_slot_mapping(slot_mapping)
    device = tensors[0].device
    for name, t in zip([*names, "slot_mapping"], [*tensors, slot_mapping]):
        if t.device != device:
            raise ValueError(
                f"devices differ: {names[0]} is on {device}, {name} is on {t.device} (every "
                "tensor and slot_mapping must be on one device)"
            )
    nd = _check_num_decode_tokens(num_decode_tokens, num_rows)
    return tuple(tensors), num_rows, slot_mapping.shape[0], nd


def check_expanded_map(num_rows: int, num_slots: int, world_size: int, dtype: torch.dtype) -> None:
    """An expanded map (S > L) must have exactly ``P*L`` entries (any length when L = 0: there
    are no rows to pair), and ``P*L`` must fit the slot dtype."""
    if num_slots > num_rows:
        total = world_size * num_rows
        if num_slots < total:
            raise ValueError(
                f"slot_mapping has {num_slots} entries, between the local row count L={num_rows} "
                f"and P*L={world_size}*{num_rows}={total}: rows and slots would not pair (an "
                f"expanded map has exactly P*L={total} entries, an unexpanded one at most L)"
            )
        if num_slots > total and num_rows > 0:
            raise ValueError(
                f"slot_mapping has {num_slots} entries, more than P*L={world_size}*{num_rows}="
                f"{total}: rows and slots would not pair (an expanded map has exactly P*L entries; "
                "tensors cut below the map's rank stride W shift rows against slots)"
            )
        check_expanded_index_fits(num_rows, world_size, dtype)


def check_nd_agreement(
    group: Any, num_rows: int, num_slots: int, nd: int, shard: bool, device: torch.device
) -> None:
    """Debug check before the collectives: do all ranks agree on the call's shape?

    One all_gather of ``[nd, L, S, shard]`` (int64, on the slot map's device) over the group.
    Every rank must have equal L, S and shard flag; in the replicated branches (shard False:
    C, D, E) also equal ``num_decode_tokens`` -- a rank cannot see a disagreement locally, and a
    real run hangs (C on one rank, E on another) or writes decode rows with wrong slots. In the
    sharded branch B, nd legitimately differs per rank and is not compared. On disagreement every
    rank raises the same ValueError naming each rank's values.
    """
    mine = torch.tensor([nd, num_rows, num_slots, int(shard)], dtype=torch.int64, device=device)
    table = group.all_gather(mine, dim=0)
    world_size = group.world_size
    if not isinstance(table, torch.Tensor) or tuple(table.shape) != (4 * world_size,):
        raise RuntimeError(
            f"group.all_gather returned {_type_name(table)} for the nd agreement check, expected "
            f"shape ({4 * world_size},)"
        )
    rows = table.reshape(world_size, 4).tolist()
    keys = [tuple(r[1:]) if r[3] else tuple(r) for r in rows]
    if all(k == keys[0] for k in keys) and len({r[3] for r in rows}) == 1:
        return
    what = "; ".join(
        f"rank {q}: num_decode_tokens={r[0]}, L={r[1]}, S={r[2]}, shard_decode_requests={bool(r[3])}"
        for q, r in enumerate(rows)
    )
    raise ValueError(
        "PCP ranks disagree on the gather's inputs (every rank needs equal L, S and "
        "shard_decode_requests, and with shard_decode_requests=False equal num_decode_tokens; "
        f"otherwise the collectives hang or decode rows get wrong slots): {what}"
    )


def select_branch(num_rows: int, num_slots: int, nd: int, shard: bool) -> str:
    """Branch letter of docs/semantics.md section 5 for ``L``, ``S``, ``nd`` and the shard flag."""
    if num_slots <= num_rows:
        return "A"
    if shard:
        return "B"
    if nd == num_rows:
        return "C"
    if nd == 0:
        return "D"
    return "E"


def _all_gather_one(group: Any, x: torch.Tensor, world_size: int, what: str) -> torch.Tensor:
    out = group.all_gather(x, dim=0)
    expected = (world_size * x.shape[0], *x.shape[1:])
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected or out.dtype != x.dtype:
        got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        raise RuntimeError(
            f"group.all_gather returned {got}{what}, expected shape {expected} dtype {x.dtype}"
        )
    return out


def _all_gather(
    group: Any, tensors: Sequence[torch.Tensor], world_size: int
) -> tuple[torch.Tensor, ...]:
    """Every rank's rows of each tensor, rank-major, in ONE all_gather (wire format: module
    docstring). Bit-exact: bytes are only copied and reinterpreted, never converted."""
    if len(tensors) == 1:
        return (_all_gather_one(group, tensors[0].contiguous(), world_size, ""),)
    num_rows = tensors[0].shape[0]
    as_bytes = any(t.dtype != tensors[0].dtype for t in tensors)
    blocks = []
    for t in tensors:
        block = t.reshape(num_rows, math.prod(t.shape[1:]))  # explicit width: n = 0 works
        blocks.append(block.contiguous().view(torch.uint8) if as_bytes else block)
    packed = torch.cat(blocks, dim=1)
    what = (f" for the rows of {len(tensors)} tensors packed side by side"
            + (" as bytes" if as_bytes else ""))
    out = _all_gather_one(group, packed, world_size, what)
    outputs, start = [], 0
    for t, block in zip(tensors, blocks):
        columns = out[:, start:start + block.shape[1]]
        start += block.shape[1]
        shape = (out.shape[0], *t.shape[1:])
        if columns.numel() == 0:  # a byte view of an empty block cannot change element size
            outputs.append(torch.empty(shape, dtype=t.dtype, device=out.device))
        else:
            outputs.append(columns.contiguous().view(t.dtype).reshape(shape))
    return tuple(outputs)


def gather_prefill_cache_inputs(
    tensors: Sequence[torch.Tensor],
    slot_mapping: torch.Tensor,
    num_decode_tokens: int,
    shard_decode_requests: bool = False,
    *,
    group: Any = None,
    check_nd_agreement: bool | None = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Gather PCP-local cache-write inputs so that rows and slot_mapping pair for the kernel.

    ``group``: a vLLM-style group or a ProcessGroup; default ``get_pcp_group()``. The group is
    looked up only when the branch needs P (``S > L``), so branch A runs without one.
    ``check_nd_agreement``: run the cross-rank agreement check (see :func:`check_nd_agreement`)
    before the collectives of an expanded call; ``None`` uses the module flag
    ``CHECK_ND_AGREEMENT``. Bad input raises TypeError/ValueError naming the argument
    (docs/errors.md lists every message).
    Outputs are views of the inputs or fresh tensors; inputs are never mutated.
    """
    return gather_named(
        tensors, slot_mapping, num_decode_tokens, shard_decode_requests, group, check_nd_agreement
    )


def gather_named(
    tensors: Any,
    slot_mapping: Any,
    num_decode_tokens: Any,
    shard_decode_requests: Any,
    group: Any,
    check_agreement: bool | None,
    names: Sequence[str] | None = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The gather, its messages naming the caller's arguments (`names`: the MLA and indexer
    wrappers pass theirs)."""
    shard = check_flag("shard_decode_requests", shard_decode_requests)
    tensors, num_rows, num_slots, nd = validate_gather_inputs(
        tensors, slot_mapping, num_decode_tokens, names=names
    )
    if num_slots <= num_rows:  # A: unexpanded map, every real row is written
        return tuple(t[:num_slots] for t in tensors), slot_mapping[:num_slots]

    group = get_pcp_group() if group is None else as_group(group)
    world_size = check_world_size(group.world_size)
    check_expanded_map(num_rows, num_slots, world_size, slot_mapping.dtype)
    if CHECK_ND_AGREEMENT if check_agreement is None else check_agreement:
        check_nd_agreement(group, num_rows, num_slots, nd, shard, slot_mapping.device)
    branch = select_branch(num_rows, num_slots, nd, shard)
    total = world_size * num_rows

    if branch == "C":  # replicated, all decode: rank 0's block of the map
        return tensors, slot_mapping[:num_rows]
    if branch in ("B", "D"):  # every rank's rows, rank-major
        return _all_gather(group, tensors, world_size), slot_mapping[:total]

    # E: replicated, mixed. Local decode rows with rank 0's decode slots, then every rank's
    # prefill rows with that rank's prefill slots.
    device = slot_mapping.device
    decode_idx = torch.arange(nd, device=device)
    prefill_idx = (
        torch.arange(world_size, device=device).unsqueeze(1) * num_rows
        + torch.arange(nd, num_rows, device=device).unsqueeze(0)
    ).reshape(-1)
    slots_out = slot_mapping[torch.cat((decode_idx, prefill_idx))]
    gathered = _all_gather(group, tuple(t[nd:] for t in tensors), world_size)
    rows_out = tuple(torch.cat((t[:nd], g), dim=0) for t, g in zip(tensors, gathered))
    return rows_out, slots_out
