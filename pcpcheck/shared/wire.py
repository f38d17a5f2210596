"""Where bytes cross a process boundary: message framing, and tensors as plain data.

A message is a JSON header plus raw byte blobs: `<len(header)> <len(blobs)> header blob...`.
Nothing is pickled in the direction worker -> driver: the worker runs the target, so whatever it
sends is untrusted, and the driver only ever parses JSON and copies bytes.

Tensors leave the worker as (dtype name, shape, raw bytes), read through torch's base-class
functions captured when this module is imported, before any target is loaded, with torch
function overrides disabled: a Tensor subclass whose methods lie cannot change what is read,
and a target that replaces torch's or numpy's functions cannot change how its inputs are built
or read back. A tensor reaching past the end of its storage is not read (freed memory).
The driver holds them as `Received` (dtype, shape, the device the worker found the tensor on,
bytes), checked like a tensor rebuilt from them and read as bytes or ints, never through torch.
"""

from __future__ import annotations

import functools
import json
import math
import os
import select
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any, cast, overload

import numpy as np
import torch

_FRAME = struct.Struct("<II")
MAX_MESSAGE = 512 << 20  # bytes; a longer frame is a malformed message
MAX_ITEMS = 4096  # elements of a returned tuple/list encoded one by one

Header = dict[str, Any]  # a message's JSON header, as sent or parsed (its fields: protocol's)
Message = tuple[Header, list[bytes]]  # (header, blobs)


class ChannelClosed(EOFError):
    """The peer closed its end, died, or sent something that is not a message."""


def send(fd: int, header: Header, blobs: Iterable[bytes | bytearray | memoryview] = (),
         drain: Reader | None = None) -> None:
    """Write one message. With `drain` (the reader of the peer's replies, on a non-blocking
    `fd`), read while the pipe is full: a peer blocked writing its reply never deadlocks us."""
    view = memoryview(pack(header, blobs))
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            assert drain is not None  # only a non-blocking fd blocks, and it comes with its reader
            readable, _, _ = select.select([drain.fd], [fd], [])
            if readable:
                drain.fill()
            continue
        view = view[written:]


def pack(header: Header, blobs: Iterable[bytes | bytearray | memoryview] = ()) -> bytes:
    """One message as bytes."""
    blobs = [bytes(b) if not isinstance(b, (bytes, bytearray, memoryview)) else b for b in blobs]
    header = dict(header, blobs=[len(b) for b in blobs])
    text = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_FRAME.pack(len(text), sum(len(b) for b in blobs)), text, *blobs])


def unpack(data: bytes) -> Message:
    """(header, blobs) of one message packed by `pack`; ChannelClosed if it is not one."""
    reader = Reader(-1)
    reader._buffer += data
    message = reader._parse()
    if message is None or reader._buffer:
        raise ChannelClosed("not one whole message")
    return message


class Reader:
    """Reads messages from a file descriptor, never blocking past a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    @overload
    def recv(self, deadline: None = None) -> Message: ...  # no deadline: it waits for one
    @overload
    def recv(self, deadline: float) -> Message | None: ...

    def recv(self, deadline: float | None = None) -> Message | None:
        """(header, blobs), or None when the deadline passes first. ChannelClosed on EOF."""
        while True:
            message = self._parse()
            if message is not None:
                return message
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())  # 0: read what is there already
                if not select.select([self.fd], [], [], left)[0]:
                    return None
            self.fill()

    @property
    def buffered(self) -> bool:
        """A whole message is waiting in the buffer (read while sending)."""
        if len(self._buffer) < _FRAME.size:
            return False
        text_len, blob_len = cast("tuple[int, int]", _FRAME.unpack_from(self._buffer))
        return len(self._buffer) >= _FRAME.size + text_len + blob_len

    def fill(self) -> None:
        """Read what is there (blocking if nothing is)."""
        try:
            chunk = os.read(self.fd, 1 << 20)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None
        if not chunk:
            raise ChannelClosed("end of stream")
        self._buffer += chunk

    def _parse(self) -> Message | None:
        if len(self._buffer) < _FRAME.size:
            return None
        text_len, blob_len = _FRAME.unpack_from(self._buffer)
        if text_len + blob_len > MAX_MESSAGE:
            raise ChannelClosed(f"a message of {text_len + blob_len} bytes")
        end = _FRAME.size + text_len + blob_len
        if len(self._buffer) < end:
            return None
        failure = None
        with memoryview(self._buffer) as data:  # each part copied out once
            try:
                header = json.loads(bytes(data[_FRAME.size:_FRAME.size + text_len]))
                lengths = header["blobs"]
                if not isinstance(header, dict) or sum(lengths) != blob_len or min(lengths, default=0) < 0:
                    raise ValueError("blob lengths")
                blobs, offset = [], _FRAME.size + text_len
                for length in lengths:
                    blobs.append(bytes(data[offset:offset + length]))
                    offset += length
            except (ValueError, TypeError, KeyError) as exc:
                failure = ChannelClosed(f"not a message: {exc}")
        del self._buffer[:end]  # a message that is not one is dropped all the same
        if failure is not None:
            raise failure
        return header, blobs


# --- worker side: read what a target returned, whatever it returned ---------------------------

_TensorBase = torch._C.TensorBase
_as_subclass = _TensorBase.as_subclass
_detach, _cpu, _copy, _reshape, _view = (_TensorBase.detach, _TensorBase.cpu, _TensorBase.copy_,
                                         _TensorBase.reshape, _TensorBase.view)
_empty = torch.empty
_resolve_conj, _resolve_neg, _numpy = _TensorBase.resolve_conj, _TensorBase.resolve_neg, _TensorBase.numpy
# The getters of TensorBase's properties (typed: torch's stubs declare them as plain values).
_dtype_of: Callable[[torch.Tensor], torch.dtype] = cast(Any, _TensorBase).dtype.__get__
_device_of = _TensorBase.device.__get__
_size_of = _TensorBase.size
_no_overrides = torch._C.DisableTorchFunction
_Tensor = torch.Tensor
_uint8 = torch.uint8
_data_ptr, _stride_of, _offset_of = _TensorBase.data_ptr, _TensorBase.stride, _TensorBase.storage_offset
_is_neg, _is_conj = _TensorBase.is_neg, _TensorBase.is_conj
_requires_grad: Callable[[torch.Tensor], bool] = cast(Any, _TensorBase).requires_grad.__get__
_layout_of: Callable[[torch.Tensor], torch.layout] = cast(Any, _TensorBase).layout.__get__
_strided = torch.strided
_is_cpu: Callable[[torch.Tensor], bool] = cast(Any, _TensorBase).is_cpu.__get__
_is_meta: Callable[[torch.Tensor], bool] = cast(Any, _TensorBase).is_meta.__get__
_storage_of = _TensorBase.untyped_storage
_storage_nbytes: Callable[[torch.UntypedStorage], int] = cast(Any, torch._C.StorageBase).nbytes
# Per dtype of a plain strided tensor, the dtype of the same item size numpy holds (itself where
# numpy has it): tensors are read and built through numpy, in fewer calls than torch's own views.
_NUMPY_READABLE = {dtype: dtype for dtype in (torch.float16, torch.float32, torch.float64,
                                              torch.int8, torch.int16, torch.int32, torch.int64,
                                              torch.uint8, torch.bool)}
_NUMPY_READABLE[torch.bfloat16] = torch.int16
_NUMPY_READABLE.update({getattr(torch, name): torch.uint8 for name in ("float8_e4m3fn", "float8_e5m2")
                        if hasattr(torch, name)})
_NUMPY_DTYPE = {dtype: _empty(0, dtype=dtype).numpy().dtype for dtype in set(_NUMPY_READABLE.values())}
_NUMPY_OF = {dtype: _NUMPY_DTYPE[readable] for dtype, readable in _NUMPY_READABLE.items()}
_np_frombuffer, _from_numpy, _torch_frombuffer = np.frombuffer, torch.from_numpy, torch.frombuffer
_isinstance, _type, _len, _tuple, _list, _str = isinstance, type, len, tuple, list, str
_bytearray = bytearray
_tuple_iter, _list_iter = tuple.__iter__, list.__iter__


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as a plain torch.Tensor (a subclass's methods set aside); a plain one is
    itself (what it reads through the base class is the same)."""
    return tensor if _type(tensor) is _Tensor else _as_subclass(tensor, _Tensor)


def tensor_bytes(tensor: torch.Tensor) -> tuple[str, list[int], bytes]:
    """(dtype, shape, content) of a tensor, read as a plain torch.Tensor."""
    with _no_overrides():
        plain = _plain(tensor)
        dtype = _dtype_of(plain)
        shape = _list(_size_of(plain))  # torch.Size of the base class: ints
        if _layout_of(plain) == _strided and _is_cpu(plain):
            if not _in_storage(plain, dtype):
                raise ValueError(f"a {_str(dtype)} tensor of shape {tuple(shape)} reaches past the "
                                 "end of its storage (resized smaller after the tensor was made)")
            readable = _NUMPY_READABLE.get(dtype)
            if readable is not None and not _is_neg(plain):
                if _requires_grad(plain):  # numpy() refuses a tensor that requires grad
                    plain = _detach(plain)
                # numpy's tobytes reads the logical content in order: any strides, offset, expansion
                return _str(dtype), shape, _numpy(plain if readable is dtype
                                                  else _view(plain, readable)).tobytes()
        plain = _detach(plain)
        if dtype.is_complex:
            plain = _resolve_conj(plain)
        # Else a fresh tensor of canonical strides, not .contiguous(): a tensor of one element (or
        # with size-one dimensions) counts as contiguous whatever its strides, and keeps a stride
        # the byte view refuses. copy_ reads any strides, offset, expansion or aliasing.
        fresh = _empty(shape, dtype=dtype)
        _copy(fresh, _resolve_neg(_cpu(plain)))
        flat = _reshape(fresh, (-1,))
        content = _numpy(_view(flat, _uint8)).tobytes() if flat.numel() else b""
    return _str(dtype), shape, content


def _in_storage(plain: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every element of a strided tensor lies within its storage: a storage resized
    smaller after the tensor was made leaves it reading freed memory (call with overrides off)."""
    shape, strides = _size_of(plain), _stride_of(plain)
    if 0 in shape:
        return True
    last = _offset_of(plain)
    for n, stride in zip(shape, strides):
        last += (n - 1) * stride
    return (last + 1) * dtype.itemsize <= _storage_nbytes(_storage_of(plain))


class SentTensor:
    """An input the worker built over a private copy of the driver's bytes (`tensor`), with
    what it looked like then: `read_back` tells whether it still is exactly that. (The
    driver's description is trusted: it is the judge's own.)"""

    def __init__(self, dtype_name: str, shape: list[int], content: bytes) -> None:
        self.content = content
        self._buffer = _bytearray(content)
        dtype = dtype_by_name(dtype_name)[0]
        with _no_overrides():  # as _geometry reads it, what was not just given read from torch
            self.tensor = _tensor_over(dtype, shape, self._buffer)
            self._geometry = (_data_ptr(self.tensor), dtype, _tuple(shape),
                              _stride_of(self.tensor), 0, "cpu", False, False)

    def read_back(self) -> bytes | None:
        """None if the tensor holds the bytes it was built from, else its content now (as
        tensor_bytes reads it). Cheap in the common case: the same view of the same buffer
        (read through the base class, as tensor_bytes reads), whose bytes are compared in C."""
        with _no_overrides():
            same_view = _geometry(self.tensor) == self._geometry
        if same_view and self._buffer == self.content:
            return None
        content = tensor_bytes(self.tensor)[2]
        return None if content == self.content else content


# (data pointer, dtype, shape, strides, storage offset, device type, is_neg, is_conj)
_Geometry = tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...], int | torch.SymInt, str,
                  bool, bool]


def _geometry(tensor: torch.Tensor) -> _Geometry:
    """What decides which bytes a CPU tensor's content is (call with overrides disabled)."""
    plain = _plain(tensor)
    return (_data_ptr(plain), _dtype_of(plain), _tuple(_size_of(plain)), _stride_of(plain),
            _offset_of(plain), _device_of(plain).type, _is_neg(plain), _is_conj(plain))


# A returned value's tree, as lists (JSON arrays: shorter to write and read than objects):
# [TENSOR, dtype, shape, blob index or None (meta), device], [TUPLE | LIST, *items], [OTHER, type].
TENSOR, TUPLE, LIST, OTHER = "T", "(", "[", "?"


def encode_value(value: Any, blobs: list[bytes], depth: int = 0) -> list[Any]:
    """The tree of a returned value (anything a target returned); tensors' bytes appended to
    `blobs`."""
    if _isinstance(value, _Tensor):
        with _no_overrides():
            plain = _plain(value)
            if _is_meta(plain):  # no data to read: its description alone (RETURNS names it)
                return [TENSOR, _str(_dtype_of(plain)), _list(_size_of(plain)), None, "meta"]
            device = "cpu" if _is_cpu(plain) else _str(_device_of(plain))
        dtype, shape, content = tensor_bytes(plain)
        blobs.append(content)
        return [TENSOR, dtype, shape, _len(blobs) - 1, device]
    if depth < 2 and _isinstance(value, (_tuple, _list)):
        is_tuple = _isinstance(value, _tuple)
        items = _list((_tuple_iter if is_tuple else _list_iter)(value))
        if _len(items) <= MAX_ITEMS:
            return [TUPLE if is_tuple else LIST, *[encode_value(item, blobs, depth + 1)
                                                    for item in items]]
    return [OTHER, _str(_type(value).__name__)[:100]]


# --- driver side: rebuild plain objects from what a worker sent --------------------------------

def tensor_from_bytes(dtype_name: str, shape: list[int], content: bytes | bytearray
                      ) -> torch.Tensor:
    """A plain CPU tensor (over `content` itself if it is a bytearray); ValueError if the parts do
    not describe one. Built with the functions captured at import: in a worker, a target loaded
    since may have replaced torch's or numpy's (an input built over a copy of the bytes the
    worker keeps would hide what the call wrote into it)."""
    dtype = _described(dtype_name, shape, content)[0]
    buffer = cast(bytearray, content) if _type(content) is _bytearray else _bytearray(content)
    with _no_overrides():
        return _tensor_over(dtype, shape, buffer)


def _tensor_over(dtype: torch.dtype, shape: list[int], buffer: bytearray) -> torch.Tensor:
    """A CPU tensor over `buffer`, of a description already checked (call with overrides off)."""
    if not buffer:
        return _empty(shape, dtype=dtype)
    numpy_dtype = _NUMPY_OF.get(dtype)
    if numpy_dtype is not None:
        return _view(_from_numpy(_np_frombuffer(buffer, dtype=numpy_dtype).reshape(shape)), dtype)
    return _reshape(_view(_torch_frombuffer(buffer, dtype=_uint8), dtype), shape)


def _described(dtype_name: str, shape: list[int], content: bytes | bytearray
               ) -> tuple[torch.dtype, int]:
    """(dtype, element count) of a tensor's parts; ValueError if they do not describe one."""
    dtype, itemsize = dtype_by_name(dtype_name)
    numel = _numel(shape)
    if numel * itemsize != len(content):
        raise ValueError(f"{len(content)} bytes for {dtype_name} {tuple(shape)}")
    return dtype, numel


def _numel(shape: object) -> int:
    if _type(shape) is not _list:
        raise ValueError(f"bad shape {shape!r}")
    numel = 1
    for n in cast("list[object]", shape):
        if _type(n) is not int or not 0 <= cast(int, n) < 1 << 40:
            raise ValueError(f"bad shape {shape!r}")
        numel *= cast(int, n)
    if numel > MAX_MESSAGE:
        raise ValueError(f"bad shape {shape!r}")
    return numel


@functools.cache
def dtype_by_name(name: str) -> tuple[torch.dtype, int]:
    """(dtype, item size) of a torch dtype's name ("torch.float32" or "float32")."""
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype, torch.empty((), dtype=dtype).element_size()


class Received:
    """A tensor a worker reported, as the driver holds it: plain data, its description checked
    on arrival (ValueError if the parts do not describe a tensor); `tensor()` rebuilds it."""

    __slots__ = ("dtype", "shape", "device", "content")

    def __init__(self, dtype_name: str, shape: list[int], content: bytes, device: str) -> None:
        dtype = _described(dtype_name, shape, content)[0]
        self.dtype, self.shape, self.content, self.device = dtype, tuple(shape), content, device

    def dim(self) -> int:
        return len(self.shape)

    def rows(self) -> np.ndarray:
        """Its rows as (rows, row_bytes) uint8, for bit-exact comparison."""
        rows = self.shape[0] if self.shape else 1
        row_bytes = (len(self.content) // rows if rows  # explicit: rows may be 0
                     else math.prod(self.shape[1:]) * self.dtype.itemsize)
        return np.frombuffer(self.content, dtype=np.uint8).reshape(rows, row_bytes)

    def ints(self) -> list[int]:
        """An int64 tensor's elements."""
        assert self.dtype == torch.int64
        return cast("list[int]", np.frombuffer(self.content, dtype="<i8").tolist())

    def tensor(self) -> torch.Tensor:
        return tensor_from_bytes(str(self.dtype), list(self.shape), self.content)


def decode_value(tree: Any, blobs: list[bytes]) -> object:
    """The value a worker described (encode_value's tree): tuples, lists and tensors (as
    Received); anything else becomes an empty instance of a class of the same name (what judging
    needs to name it). ValueError where a tensor's description is not one."""
    kind = tree[0] if isinstance(tree, list) and tree else None
    if kind == TENSOR:
        if len(tree) != 5:
            raise ValueError(f"a tensor described by {len(tree)} fields")
        _, dtype, shape, blob, device = tree
        if blob is None:  # a meta tensor: shape and dtype only
            content = bytes(dtype_by_name(dtype)[1] * _numel(shape))
        elif type(blob) is int and 0 <= blob < len(blobs):
            content = blobs[blob]
        else:
            raise ValueError(f"blob {blob!r} of {len(blobs)}")
        return Received(dtype, shape, content, str(device)[:40])
    if kind in (TUPLE, LIST):
        items = [decode_value(item, blobs) for item in tree[1:]]
        return tuple(items) if kind == TUPLE else items
    name = str(tree[1]) if kind == OTHER and len(tree) > 1 else "object"
    return type(name if name.isidentifier() else "object", (), {})()
