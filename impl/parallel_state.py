"""PCP group provider and the adapter for plain torch.distributed groups.

A *vLLM-style group* is anything with ``world_size`` and ``all_gather(t, dim=0)`` returning the
rank-major concatenation: all that vLLM's gather reads, and all its unit tests' fake groups carry.
The gather reads nothing else from it (no ``rank_in_group``). A plain
``torch.distributed.ProcessGroup`` is presented in that shape by :class:`ProcessGroupAdapter`.

The provider mirrors vLLM's ``get_pcp_group()``: ``set_pcp_group`` registers either a group or a
zero-argument callable returning one. A callable is called on every ``get_pcp_group()`` (the
checker registers a per-thread lookup so that ranks running as threads each get their own group).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

try:  # torch builds without distributed support still get the provider and fake groups
    import torch.distributed as dist

    _HAVE_DIST = dist.is_available()
except ImportError:  # pragma: no cover
    dist = None  # type: ignore[assignment]  # the module, absent from this build
    _HAVE_DIST = False

__all__ = [
    "ProcessGroupAdapter",
    "as_group",
    "get_pcp_group",
    "set_pcp_group",
]

# Dtypes every torch.distributed backend we target (gloo, NCCL) carries in all_gather. Anything
# else (fp8, bool, int16, unsigned, complex; bf16 on older gloo) travels as raw bytes.
_NATIVE_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int32, torch.int64}
)


def _is_process_group(obj: Any) -> bool:
    return _HAVE_DIST and isinstance(obj, dist.ProcessGroup)


def _is_vllm_group(obj: Any) -> bool:
    return hasattr(obj, "world_size") and callable(getattr(obj, "all_gather", None))


class ProcessGroupAdapter:
    """vLLM-style view of a ProcessGroup: ``world_size``, ``all_gather`` (what the gather reads)
    and ``rank_in_group`` (for callers that want it)."""

    def __init__(self, process_group: Any) -> None:
        if not _is_process_group(process_group):
            raise TypeError(
                "ProcessGroupAdapter needs a torch.distributed.ProcessGroup, got "
                f"{type(process_group).__name__}"
            )
        self.process_group = process_group
        self.world_size: int = dist.get_world_size(process_group)
        self.rank_in_group: int = dist.get_rank(process_group)

    def all_gather(self, input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Rank-major concatenation of every rank's ``input_`` along ``dim`` (equal shapes)."""
        if not isinstance(input_, torch.Tensor):
            raise TypeError(f"all_gather needs a tensor, got {type(input_).__name__}")
        if input_.dim() == 0:
            raise ValueError("all_gather needs a tensor with at least one dimension")
        dim = dim % input_.dim()
        x = input_.contiguous()
        as_bytes = x.dtype not in _NATIVE_DTYPES
        if as_bytes:
            # Same-layout byte view: the last dim grows by itemsize; element boundaries stay
            # aligned, so concatenating along any dim and viewing back is bit-exact.
            x = x.view(torch.uint8)
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.process_group)
        out = torch.cat(parts, dim=dim)
        if as_bytes:
            out = out.view(input_.dtype)
        return out

    def __repr__(self) -> str:
        return f"ProcessGroupAdapter(rank {self.rank_in_group} of {self.world_size})"


def as_group(group: Any) -> Any:
    """Return ``group`` in vLLM style: ProcessGroups are wrapped, vLLM-style groups kept."""
    if _is_process_group(group):
        return ProcessGroupAdapter(group)
    if _is_vllm_group(group):
        return group
    raise TypeError(
        "a PCP group must be a torch.distributed.ProcessGroup or a vLLM-style group with "
        f"world_size and all_gather(t, dim=0); got {type(group).__name__}"
    )


_lock = threading.Lock()
_registered: Any = None  # a group (already adapted) or a zero-argument callable
_is_callable = False


def set_pcp_group(group_or_callable: Any) -> None:
    """Register the PCP group, or a zero-argument callable returning it; ``None`` clears."""
    global _registered, _is_callable
    with _lock:
        if group_or_callable is None:
            _registered, _is_callable = None, False
        elif _is_process_group(group_or_callable) or _is_vllm_group(group_or_callable):
            _registered, _is_callable = as_group(group_or_callable), False
        elif callable(group_or_callable):
            _registered, _is_callable = group_or_callable, True
        else:
            raise TypeError(
                "set_pcp_group needs a ProcessGroup, a vLLM-style group or a callable returning "
                f"one; got {type(group_or_callable).__name__}"
            )


def get_pcp_group() -> Any:
    """The registered PCP group in vLLM style; RuntimeError if none was registered."""
    registered, is_callable = _registered, _is_callable
    if registered is None:
        raise RuntimeError(
            "no PCP group registered: call impl.set_pcp_group(group_or_callable) first, or pass "
            "group= explicitly"
        )
    if not is_callable:
        return registered
    group = registered()
    if group is None:
        raise RuntimeError("the registered PCP group provider returned None (no group for this rank)")
    return as_group(group)
