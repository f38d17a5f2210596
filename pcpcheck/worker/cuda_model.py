"""A CPU model of the CUDA stream API an asynchronous protocol uses (SPEC.md "Asynchronous
replication"): the target runs on CPU tensors, eagerly, in the order it issues work, and the
model records what each stream did in a stream trace (spec/streams.py) for the judge. It is
part of the deployment every step runs in (pcpcheck.worker.deployment).

Where the deployment installs it (`API`, `TENSOR_API`), torch.cuda's stream API (`Stream`,
`Event`, `current_stream`, `default_stream`, `stream(...)`, `set_stream`, `synchronize`,
`is_current_stream_capturing`, `is_available`, `current_device`, `device_count`) and
`Tensor.record_stream` are this module's, and in a judged step a TorchDispatchMode
(`accesses_logged`) logs every aten op that reads or writes an input of the step (views read
nothing). Each rank has its own `StreamModel` (a context variable: greenlets and threads
each see their own); outside a rank's call the API raises.

Eager CPU execution makes every value right whatever the order: only the trace can show a
missing join, and the verdict depends on it alone, never on timing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pcpcheck_spec.names import (
    CAPTURING,
    DEVICE,
    EVENT,
    FLAG,
    HOST,
    INPUT,
    KEEP,
    MAIN_STREAM,
    READ,
    RECORD,
    SLOT,
    STREAM,
    SYNC,
    WAIT,
    WRITE,
)

_model: contextvars.ContextVar[StreamModel | None] = contextvars.ContextVar(
    "pcpcheck_stream_model", default=None)


def active() -> StreamModel:
    model = _model.get()
    if model is None:
        raise RuntimeError("pcpcheck models CUDA streams only inside a rank's call")
    return model


class StreamModel:
    """One rank's step: its streams and events, and the trace of what they did."""

    def __init__(self, inputs: Sequence[torch.Tensor], capturing: bool):
        self.trace: list[tuple] = []
        self.phase = "inputs"
        self.capturing = capturing
        self._next_stream = MAIN_STREAM + 1
        self._next_event = 0
        self.main = Stream(_id=MAIN_STREAM, _owner=self)
        self.current = self.main
        self._quiet = 0
        # storage address -> input index (an empty tensor has no storage to share)
        self.inputs = {ptr: k for k, tensor in enumerate(inputs)
                       if (ptr := tensor.untyped_storage().data_ptr())}
        self.log(CAPTURING, HOST, FLAG, int(capturing))

    @contextlib.contextmanager
    def bound(self):
        """This model is the calling rank's while the block runs."""
        token = _model.set(self)
        try:
            yield self
        finally:
            _model.reset(token)

    @contextlib.contextmanager
    def quiet(self):
        """The harness's own tensor work (cloning what update_cache was given) is not the
        target's: it is logged explicitly, or not at all."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def log(self, op: str, stream: int, obj: str, index: int) -> None:
        self.trace.append((op, stream, obj, int(index), self.phase))

    def new_stream(self) -> int:
        self._next_stream += 1
        return self._next_stream - 1

    def new_event(self) -> int:
        self._next_event += 1
        return self._next_event - 1

    def input_of(self, tensor: torch.Tensor) -> int | None:
        try:
            return self.inputs.get(tensor.untyped_storage().data_ptr())
        except Exception:  # noqa: BLE001 - a tensor without storage (meta, sparse) is no input
            return None

    def touch(self, tensor: torch.Tensor, write: bool = False) -> None:
        """An access of `tensor` by the current stream, logged if it is (a view of) an input."""
        if self._quiet or tensor.numel() == 0:  # an empty view reads nothing
            return
        index = self.input_of(tensor)
        if index is not None:
            self.log(WRITE if write else READ, self.current.id, INPUT, index)

    def write_slots(self, slots: list[int]) -> None:
        for slot in slots:
            if slot >= 0:
                self.log(WRITE, self.current.id, SLOT, slot)


class Stream:
    """torch.cuda.Stream, modelled: an id; its work is what the trace logs under it."""

    def __init__(self, device=None, priority: int = 0, *, _id: int | None = None,
                 _owner: StreamModel | None = None, **kwargs):
        self.model = _owner or active()
        self.id = self.model.new_stream() if _id is None else _id
        self._previous: list[Stream] = []  # the current streams this one replaced, innermost last

    def __repr__(self):
        return f"<modelled CUDA stream {self.id}>"

    def __eq__(self, other):
        return isinstance(other, Stream) and other.model is self.model and other.id == self.id

    def __hash__(self):
        return hash((id(self.model), self.id))

    @property
    def cuda_stream(self) -> int:
        return self.id

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)

    def wait_event(self, event: Event) -> None:
        if not isinstance(event, Event):
            raise TypeError(f"wait_event takes a torch.cuda.Event, got {type(event).__name__}")
        self.model.log(WAIT, self.id, EVENT, event.id)

    def wait_stream(self, stream: Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.model.log(SYNC, HOST, STREAM, self.id)

    def query(self) -> bool:
        return True

    def __enter__(self):
        self._previous.append(self.model.current)
        self.model.current = self
        return self

    def __exit__(self, *exc):
        self.model.current = self._previous.pop()


class Event:
    """torch.cuda.Event, modelled: record, wait, synchronize (timing is not modelled)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        self.model = active()
        self.id = self.model.new_event()

    def record(self, stream: Stream | None = None) -> None:
        self.model.log(RECORD, (stream or self.model.current).id, EVENT, self.id)

    def wait(self, stream: Stream | None = None) -> None:
        (stream or self.model.current).wait_event(self)

    def synchronize(self) -> None:
        self.model.log(SYNC, HOST, EVENT, self.id)

    def query(self) -> bool:
        return True


@contextlib.contextmanager
def stream(chosen: Stream | None):
    """torch.cuda.stream(s): s is the current stream inside the block (None: unchanged)."""
    if chosen is None:
        yield
        return
    with chosen:
        yield


def _set_stream(chosen: Stream) -> None:
    active().current = chosen


def _synchronize(device=None) -> None:
    active().log(SYNC, HOST, DEVICE, 0)


def _record_stream(tensor: torch.Tensor, chosen: Stream) -> None:
    """Tensor.record_stream(s): the input's memory is kept until s's work so far is done."""
    model = active()
    index = model.input_of(tensor)
    if index is not None:
        model.log(KEEP, chosen.id, INPUT, index)


# torch.cuda's names and Tensor's the model replaces while the deployment installs it
# (pcpcheck.worker.deployment).
API = {
    "Stream": Stream,
    "Event": Event,
    "stream": stream,
    "current_stream": lambda device=None: active().current,
    "default_stream": lambda device=None: active().main,
    "set_stream": _set_stream,
    "synchronize": _synchronize,
    "is_current_stream_capturing": lambda: active().capturing,
    "is_available": lambda: True,
    "current_device": lambda: 0,
    "device_count": lambda: 1,
}
TENSOR_API = {"record_stream": _record_stream}


class _Accesses(TorchDispatchMode):
    """Logs, for the calling rank's model, every input an aten op reads or writes."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch otherwise wraps __torch_dispatch__ in _disable_dynamo, whose first call imports
        # torch._dynamo: 1.6 s of CPU in every worker process, for a mode nothing compiles under
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        model = _model.get()
        schema = func._schema
        if model is not None and model.inputs and not any(
                ret.alias_info is not None and not ret.alias_info.is_write for ret in schema.returns):
            for position, argument in enumerate(schema.arguments):
                value = args[position] if position < len(args) else kwargs.get(argument.name)
                write = argument.alias_info is not None and argument.alias_info.is_write
                for tensor in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(tensor, torch.Tensor):
                        model.touch(tensor, write)
        return func(*args, **kwargs)


def accesses_logged() -> _Accesses:
    """Every aten op's access of a step input logged, for the calling rank's model (an
    asynchronous step, whose trace the judge reads)."""
    return _Accesses()
