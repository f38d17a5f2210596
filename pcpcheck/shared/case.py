"""A case as data: a scheduler step (pcpcheck_spec.names.Batch) plus the tensors the gather
carries, its JSON, and the content of every row.

A case is plain data, so that a counterexample replays without hypothesis (`pcpcheck check
TARGET --replay CASE_JSON`) and can be shipped to other processes. Row content is a function of
(tensor index, row label): the first four bytes hold the label (XOR LABEL_KEY), the rest are a
hash of it, so any output row can be traced back to its input row bit for bit. Whether a case
is well formed (the spec's preconditions) is the driver's question: pcpcheck.search.draw.parse_case.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pcpcheck_spec.names import DCP, DRAFT_REGIMES, Batch, Request

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.int8,
}
if hasattr(torch, "float8_e4m3fn"):
    DTYPES["float8_e4m3fn"] = torch.float8_e4m3fn


@dataclass(frozen=True)
class TensorSpec:
    trailing: tuple[int, ...]
    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.trailing) * self.torch_dtype.itemsize


@dataclass(frozen=True)
class Case:
    batch: Batch
    tensors: tuple[TensorSpec, ...] = (TensorSpec((4,), "float32"),)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Case:
        """The case a JSON text describes, field for field; ValueError (one line naming the
        field) for malformed JSON or a missing or unknown field. The values are not checked
        here: pcpcheck.search.draw.parse_case also checks the spec's preconditions."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        data = _fields(data, "case", ("batch", "tensors"), ())
        batch = _fields(data["batch"], "batch", ("regime", "pcp_size", "requests"), _BATCH_OPTIONAL)
        requests = []
        for i, request in enumerate(_list(batch["requests"], "requests")):
            request = _fields(request, f"request {i}", _REQUEST_FIELDS, ())
            request["blocks"] = tuple(_list(request["blocks"], f"request {i}: blocks"))
            requests.append(Request(**request))
        batch["requests"] = tuple(requests)
        tensors = []
        for k, tensor in enumerate(_list(data["tensors"], "tensors")):
            tensor = _fields(tensor, f"tensor {k}", ("trailing", "dtype"), ())
            tensors.append(TensorSpec(tuple(_list(tensor["trailing"], f"tensor {k}: trailing")),
                                      tensor["dtype"]))
        return Case(Batch(**batch), tuple(tensors))


_REQUEST_FIELDS = ("num_tokens", "prefilling", "context_len", "blocks")
_BATCH_OPTIONAL = ("block_size", "interleave", "graph_size", "dp_pad", "pad_slot_map",
                   "num_decode_tokens")


def _list(value: object, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{name} must be a list, got {value!r}")
    return value


def _fields(data: object, name: str, required: tuple[str, ...], optional: tuple[str, ...]
            ) -> dict[str, Any]:
    """The fields of a JSON object, every required one present and no unknown one."""
    if not isinstance(data, dict):
        raise ValueError(f"{name} must be an object, got {data!r}")
    missing = [f for f in required if f not in data]
    unknown = sorted(set(data) - set(required) - set(optional))
    if missing or unknown:
        raise ValueError(f"{name}: " + ("missing " + ", ".join(missing) if missing
                                        else "unknown field " + ", ".join(unknown)))
    return dict(data)


def pad_label(rank: int, row: int, num_rows: int) -> int:
    """The label of padding row `row` of rank `rank` (num_rows rows per rank): negative and
    distinct across ranks (the convention of pcpcheck_spec/names.py; each statement computes it
    itself, and so does pcpcheck)."""
    return -(1 + rank * num_rows + row)


# Stored in a row's first four bytes XORed with the label: a zero-filled row (what padding often
# is) then claims label LABEL_KEY, never a real one. Stored plainly, a zero row of 4 bytes (an
# int8 or fp8 row of 4) was token 0's row, bit for bit: a padding bug passed for token 0.
LABEL_KEY = 0x2B7E1516


def row_content(labels: np.ndarray, tensor_index: int, row_bytes: int) -> np.ndarray:
    """Bytes of the rows with these labels in tensor `tensor_index`: (n, row_bytes) uint8."""
    labels = np.asarray(labels, dtype=np.int64)
    out = np.empty((labels.size, row_bytes), dtype=np.uint8)
    out[:, :4] = (labels.astype("<i4") ^ np.int32(LABEL_KEY)).view(np.uint8).reshape(-1, 4)
    if row_bytes > 4:
        position = np.arange(4, row_bytes, dtype=np.uint64)
        mixed = (labels.astype(np.uint64)[:, None] * np.uint64(0x9E3779B1)
                 + position * np.uint64(0x85EBCA6B) + np.uint64(tensor_index * 0xC2B2AE35))
        out[:, 4:] = ((mixed ^ (mixed >> np.uint64(15))) & np.uint64(0xFF)).astype(np.uint8)
    return out


def as_tensor(content: np.ndarray, spec: TensorSpec) -> torch.Tensor:
    """Rows of bytes as a tensor of the spec's dtype and trailing shape (bit-exact)."""
    rows = content.shape[0]
    if rows == 0:  # a zero-row byte array cannot be viewed as a wider dtype
        return torch.empty((0, *spec.trailing), dtype=spec.torch_dtype)
    return torch.from_numpy(np.ascontiguousarray(content)).view(spec.torch_dtype).reshape(
        rows, *spec.trailing)


def as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's rows as (rows, row_bytes) uint8, for bit-exact comparison."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = math.prod(tensor.shape[1:]) * tensor.element_size()  # explicit: rows may be 0
    # numpy's reshape and math.prod: torch's reshape and np.prod cost more than the rest
    return tensor.detach().cpu().contiguous().view(torch.uint8).numpy().reshape(rows, row_bytes)


def describe(case: Case) -> str:
    """One line a reviewer reads: regime, ranks, requests."""
    batch = case.batch
    kind = "draft" if batch.regime in DRAFT_REGIMES else None
    parts = [f"{kind or ('prefill' if r.prefilling else 'decode')}({r.num_tokens}"
             + (f", ctx {r.context_len}" if r.context_len else "") + ")" for r in batch.requests]
    extra = []
    if batch.graph_size:
        extra.append(f"graph size {batch.graph_size}")
    if batch.regime in DRAFT_REGIMES:
        extra.append(f"dp_pad {batch.dp_pad}")
        if batch.pad_slot_map:
            extra.append("map padded")
        if batch.num_decode_tokens is not None:
            extra.append(f"nd {batch.num_decode_tokens}")
    if batch.regime == DCP and batch.interleave > 1:
        extra.append(f"interleave {batch.interleave}")
    return (f"{batch.regime}, P={batch.pcp_size}, B={batch.block_size}: [" + ", ".join(parts)
            + "]" + ("; " + ", ".join(extra) if extra else ""))
