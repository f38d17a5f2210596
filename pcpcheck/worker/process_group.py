"""The group a rank sees on a real torch.distributed process group (gloo, nccl, torchrun).

`GroupAdapter`: pcpcheck's own vLLM-style view (world_size, rank_in_group, all_gather(t, dim))
of a ProcessGroup, moving dtypes the backend lacks (bfloat16, float8, ... on gloo) as bytes.
`CheckedGroup` wraps it for one call: it records every all_gather in the rank's trace, as
`("all_gather", dim, shape, dtype)`, and before the real collective exchanges a fixed-size header
(16 int64: kind, case number, dim, shape, dtype) on every rank, in a round of fixed size that
also carries the rows themselves when they fit (`_INLINE` bytes: then that round is the
collective, one per call instead of two):
- a peer still in an earlier case: the round is repeated until every rank is in this case;
- a peer past this case (it returned or raised, and went on to a later case or to the end of
  its batch): every rank of this case raises `CollectiveAborted`, at once, without a timeout;
- headers disagree (dim, shape, dtype): every rank raises `CollectiveAborted` instead of handing
  the backend unequal shapes (which can crash or hang it).
Before going idle (no next batch waiting) every rank joins FINISHED rounds (`finish`) until all
are done with its last case. Rounds are matched one for one on every rank, so the group stays
usable, and ranks never wait for each other between cases unless they gather.
"""

from __future__ import annotations

import zlib

import torch

from pcpcheck.worker.runner import CollectiveAborted
from pcpcheck_spec.names import INCOMPLETE

_HEADER = 16  # [kind, case, dim, ndim, dtype code, shape (11, -1 padded)]
_HEAD_BYTES = _HEADER * 8
_INLINE = 8192  # bytes of a rank's rows carried in the header round (every round is this size)
_GATHER, _FINISHED = 1, 2
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]
_DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
_NATIVE = {"gloo": {torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8,
                    torch.int32, torch.int64}}


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else 1000 + zlib.crc32(str(dtype).encode()) % 10**6


def _shape_text(header: list[int]) -> str:
    ndim, code = header[3], header[4]
    shape = header[5:5 + ndim] if ndim <= _HEADER - 5 else ["..."]
    dtype = str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else f"dtype#{code}"
    return f"dim {header[2]} ({', '.join(map(str, shape))}{',' if ndim == 1 else ''}) {dtype}"


def _exchange(adapter: GroupAdapter, device, header: list[int], payload=None):
    """One header round: every rank's header, and every rank's round (its payload after
    _HEAD_BYTES). Every round has the same size, whatever each rank sends in it."""
    import torch.distributed as dist
    mine = torch.empty(_HEAD_BYTES + _INLINE, dtype=torch.uint8, device=device)
    head = torch.tensor(header + [-1] * (_HEADER - len(header)), dtype=torch.int64)
    mine[:_HEAD_BYTES] = head.view(torch.uint8).to(device)
    if payload is not None:
        mine[_HEAD_BYTES:_HEAD_BYTES + payload.numel()] = payload
    parts = [torch.empty_like(mine) for _ in range(adapter.world_size)]
    dist.all_gather(parts, mine, group=adapter.process_group)
    headers = torch.stack([part[:_HEAD_BYTES] for part in parts]).view(torch.int64).cpu().tolist()
    return headers, parts


def _past(header: list[int], case: int) -> bool:
    """The rank that sent `header` is done with case number `case`."""
    return header[1] > case or (header[0] == _FINISHED and header[1] == case)


def finish(adapter: GroupAdapter, device, case: int) -> bool:
    """Before going idle after case number `case`: FINISHED rounds until every rank is done
    with it (finished too, or already in a later case). True if the group failed (poisoned)."""
    while True:
        try:
            headers, _ = _exchange(adapter, device, [_FINISHED, case])
        except Exception:  # noqa: BLE001 - a backend timeout or a dead peer
            return True
        if all(_past(h, case) for h in headers):
            return False


class GroupAdapter:
    """vLLM-style view of a torch.distributed ProcessGroup: rank-major all_gather along dim."""

    def __init__(self, process_group, backend: str):
        import torch.distributed as dist
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank_in_group = dist.get_rank(process_group)
        self._native = _NATIVE.get(backend)  # None: every dtype is native (nccl)

    def all_gather(self, input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
        import torch.distributed as dist
        if input_.dim() == 0:
            raise ValueError("all_gather needs a tensor with at least one dimension")
        dim %= input_.dim()
        x = input_.contiguous()
        as_bytes = self._native is not None and x.dtype not in self._native
        if as_bytes:  # the last dim grows by the item size; element boundaries stay aligned
            x = x.view(torch.uint8) if x.dim() else x.reshape(1).view(torch.uint8)
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.process_group)
        out = torch.cat(parts, dim=dim)
        return out.view(input_.dtype) if as_bytes else out


class CheckedGroup:
    """The group a rank's call gets: trace, header rounds, then the real all_gather."""

    def __init__(self, adapter: GroupAdapter, device: torch.device, trace: list, on_wait=None,
                 case: int = 0, poisoned: bool = False):
        self._adapter = adapter
        self._case = case  # the case number (Worker.count), alike on every rank
        self._device = device
        self._trace = trace
        self._on_wait = on_wait or (lambda waiting: None)  # the host's hang clock
        self.world_size = adapter.world_size
        self.rank_in_group = adapter.rank_in_group
        self.poisoned = poisoned  # the backend itself failed: the group cannot be trusted any more

    def _abort(self, reason: str) -> CollectiveAborted:
        message = f"all_gather on rank {self.rank_in_group} never completed: {reason}"
        self._trace.append((INCOMPLETE, message))
        return CollectiveAborted(message)

    def _exchange(self, header: list[int], payload):
        """Header rounds until no rank is in an earlier case (they are waiting, not running)."""
        self._on_wait(True)
        try:
            while True:
                headers, parts = _exchange(self._adapter, self._device, header, payload)
                if not any(h[1] < self._case for h in headers):
                    return headers, parts
        finally:
            self._on_wait(False)

    def all_gather(self, input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
        if not isinstance(input_, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(input_).__name__}")
        if not isinstance(dim, int):
            raise TypeError(f"all_gather takes an int dim, got {type(dim).__name__}")
        self._trace.append(("all_gather", dim, tuple(input_.shape), str(input_.dtype)))
        if self.poisoned:
            raise self._abort("the process group already failed on this rank")
        shape = list(input_.shape)
        header = [_GATHER, self._case, dim, len(shape), _dtype_code(input_.dtype)]
        header += shape if len(shape) <= _HEADER - 5 else [zlib.crc32(str(shape).encode())]
        size = input_.numel() * input_.element_size()
        inline = None  # the rows as bytes, if they travel in the header round
        if input_.dim() and size <= _INLINE and input_.device == self._device:
            inline = input_.contiguous().reshape(-1).view(torch.uint8)
        try:
            headers, parts = self._exchange(header, inline)
        except Exception as exc:  # noqa: BLE001 - a backend timeout or a dead peer
            self.poisoned = True
            raise self._abort(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
        finished = [r for r, h in enumerate(headers) if _past(h, self._case)]
        if finished:
            raise self._abort("a peer never joined it (ranks that returned or raised instead: "
                              f"{finished})")
        if any(h != headers[0] for h in headers):
            raise self._abort("shapes disagree across ranks: " + ", ".join(
                f"rank {r}: {_shape_text(h)}" for r, h in enumerate(headers)))
        if not -input_.dim() <= dim < max(input_.dim(), 1):  # like torch.cat, on every rank alike
            raise IndexError(f"all_gather: dim {dim} out of range for a {input_.dim()}-d tensor")
        if inline is not None:  # every rank's rows came with the headers (equal, so all inline)
            return torch.cat([part[_HEAD_BYTES:_HEAD_BYTES + size].view(input_.dtype).reshape(shape)
                              for part in parts], dim=dim)
        self._on_wait(True)
        try:
            return self._adapter.all_gather(input_, dim)
        except (TypeError, ValueError):
            raise  # argument checks: identical on every rank, nothing was sent
        except Exception as exc:  # noqa: BLE001 - the backend's failure, whatever it is, breaks the group
            self.poisoned = True
            raise self._abort(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
        finally:
            self._on_wait(False)
