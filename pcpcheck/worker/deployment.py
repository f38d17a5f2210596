"""The deployment vLLM's PCP code is written for, modelled on CPU: a CUDA platform, one GPU per
rank (docs/semantics.md section 11). A worker process enters it at its first load
(`enter`), so every load and every step of every mode runs in it (a file, alone or in its tree,
`--async`, a release's path), and a question the code asks about its world gets a deployment's
answer, never the checker's machine's:

- `vllm.platforms.current_platform`: in a tree, an instance of the tree's own CUDA platform class
  (`tree_platform`: `vllm/platforms/cuda.py` run on CPU, made once per process and tree), so
  its answers are the release's own; where that module cannot run here, and for a file alone,
  `PLATFORM`, pcpcheck's table of what a CUDA deployment answers (`is_cuda()`, `device_type`,
  `dispatch_key`, ...). A question no CPU can answer faithfully (a device's capability, its
  memory, its name) is refused by name, the run stops with exit 2, as a stand-in's use does:
  the class asks torch.cuda, refused below, or reads this machine's torch build
  (`MACHINE_ANSWERS`); the model answers it with an `Unmodelled` value.
- Devices: a tensor created on, or moved to, `"cuda"`, `"cuda:N"` or `torch.device("cuda")`
  lives on the rank's device (CPU; the rank's GPU with `--device cuda`); on CPU, pinned host
  memory is ordinary memory.
- `torch.cuda`: the stream API is pcpcheck.worker.cuda_model's, with a stream model bound to every
  rank's call (`on_rank`); a profiling range or mark (`torch.cuda.nvtx`), `set_device`,
  `device(i)` and `empty_cache` move no value and are modelled as doing nothing; a device query
  (`get_device_capability`, `mem_get_info`, ...) is refused by name.
- Custom ops: `direct_register_custom_op` (vllm.utils.torch_utils) and `torch.library.custom_op`
  register the op's implementation for the deployment's device, so `torch.ops.<lib>.<name>(...)`
  runs it on the calling rank, collectives inside it included. The op is called as a Python
  function, not through torch's C++ dispatcher: a rank of the threads backend is a greenlet, and
  switching ranks inside a C++ frame aborts the process.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from pcpcheck.worker import cuda_model
from pcpcheck.worker.standins import (
    Inert,
    StandInModule,
    StandInSpace,
    add_bindings,
    refuse,
    space_of,
)

DEVICE_TYPE = "cuda"

# What a CUDA platform answers (vllm/platforms/cuda.py CudaPlatformBase, interface.Platform): the
# values every PCP deployment sees.
PLATFORM_VALUES: dict[str, Any] = {
    "device_name": "cuda", "device_type": DEVICE_TYPE, "dispatch_key": "CUDA",
    "ray_device_key": "GPU", "dist_backend": "nccl",
    "device_control_env_var": "CUDA_VISIBLE_DEVICES", "simple_compile_backend": "inductor",
}
PLATFORM_PREDICATES: dict[str, bool] = {
    "is_cuda": True, "is_cuda_alike": True, "is_rocm": False, "is_tpu": False, "is_xpu": False,
    "is_cpu": False, "is_out_of_tree": False, "is_unspecified": False,
    # pinning and confidential computing change how host memory is staged, never a value
    "is_pin_memory_available": False, "is_confidential_compute": False,
}
UNMODELLED = "a property of the GPU itself, which pcpcheck does not model on CPU"


class Unmodelled(Inert):
    """A deployment's answer pcpcheck cannot give faithfully: any use of it is refused by name."""

    __slots__ = ()
    KIND = "not modelled"

    def _reason(self) -> str:
        return UNMODELLED


class Platform:
    """`current_platform` of a CUDA deployment (the module docstring)."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name in PLATFORM_VALUES:
            return PLATFORM_VALUES[name]
        if name in PLATFORM_PREDICATES:
            answer = PLATFORM_PREDICATES[name]
            return lambda *args, **kwargs: answer
        return Unmodelled(f"vllm.platforms.current_platform.{name}", None)

    def __repr__(self) -> str:
        return "<pcpcheck's model of a CUDA platform>"


PLATFORM = Platform()

PLATFORM_MODULE = "vllm.platforms.cuda"
# The class vLLM resolves where NVML finds no GPU (as here: vllm.third_party.pynvml's nvmlInit
# fails and the module catches it), named rather than taken from the module's `CudaPlatform`:
# on a machine with an NVIDIA driver that is NvmlCudaPlatform, which would answer a device
# question from the checker's GPU through NVML. This one asks torch.cuda: the deployment's
# (refused on CPU), the rank's GPU with --device cuda. A release without it: `CudaPlatform`.
PLATFORM_CLASS = "NonNvmlCudaPlatform"
# What the class answers from this machine's torch build (no CUDA in it: 0 devices, CUDA
# runtime 0), never from a deployment: refused by name on the instance, on CPU.
MACHINE_ANSWERS = ("device_count", "get_cuda_runtime_major")

_tree_platforms: dict[tuple[str, str], tuple[Any, str]] = {}  # (kind, location) -> tree_platform


def tree_platform(space: StandInSpace) -> tuple[Any, str]:
    """`current_platform` for the space's tree and the line the load's `provided` records: the
    tree's own platform (`PLATFORM_MODULE`.`PLATFORM_CLASS`), instantiated with no arguments as
    vLLM does, else `PLATFORM` and why. Made once per process and tree (each rank's copy of a
    file in a tree shares it, as a process shares vLLM's), from the first space to ask."""
    assert space.tree is not None
    key = (space.tree.kind, space.tree.location)
    made = _tree_platforms.get(key)
    if made is None:
        made = _tree_platforms[key] = _own_platform(space)
    return made


def _own_platform(space: StandInSpace) -> tuple[Any, str]:
    module = space.module(PLATFORM_MODULE)
    if isinstance(module, StandInModule):
        return PLATFORM, _model_because(space.why(PLATFORM_MODULE) or f"{PLATFORM_MODULE}: absent")
    cls = next((value for value in (getattr(module, PLATFORM_CLASS, None),
                                    getattr(module, "CudaPlatform", None))
                if isinstance(value, type)), None)
    if cls is None:
        return PLATFORM, _model_because(f"{PLATFORM_MODULE} has no {PLATFORM_CLASS} class")
    try:
        platform = cls()
    except Exception as exc:  # noqa: BLE001 - any failure: the model answers instead
        text = " ".join(str(exc).split())[:200]
        return PLATFORM, _model_because(f"{cls.__name__}() fails here: {type(exc).__name__}: {text}")
    line = f"{cls.__module__}.{cls.__qualname__}(), the tree's own, as vLLM makes it" + (
        " where NVML finds no GPU" if cls.__name__ == PLATFORM_CLASS else "")
    if _device is None or _device.type != DEVICE_TYPE:
        for name in MACHINE_ANSWERS:
            setattr(platform, name, _refusing_answer(name))
        line += f"; {', '.join(MACHINE_ANSWERS)} refused (this machine's torch answers them)"
    return platform, line


def _model_because(why: str) -> str:
    return f"pcpcheck's model of a CUDA platform (working stand-in; {why})"


def _refusing_answer(name: str) -> Callable:
    def refused(*args, **kwargs):
        refuse(f"vllm.platforms.current_platform.{name}() is not modelled (the class answers it "
               f"from this machine's torch build, no CUDA deployment's)",
               f"vllm.platforms.current_platform.{name}", "a call", sys._getframe(1))
    return refused


def _is_deployment_device(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == DEVICE_TYPE
    if isinstance(device, str):
        return device == DEVICE_TYPE or device.startswith(DEVICE_TYPE + ":")
    return False


# The torch functions and Tensor methods that make a tensor on a device, or move one, each
# wrapped in the deployment: a function mode would see every op, about 1.4 microseconds an op.
FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "as_tensor", "asarray", "arange", "range",
             "linspace", "logspace", "eye", "rand", "randn", "randint", "randperm", "empty_like",
             "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
             "empty_strided", "scalar_tensor", "tril_indices", "triu_indices")
TENSOR_FACTORIES = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor")


def _devices_on(device: torch.device) -> contextlib.ExitStack:
    """FACTORIES, TENSOR_FACTORIES, `Tensor.to` and `Tensor.cuda` with a deployment device made
    `device` (the rank's, a CPU), for the returned stack's life; pinned host memory, which a
    CUDA platform offers (`is_pin_memory_available()`) and a CPU without an accelerator
    refuses, is ordinary memory: pinning moves no value."""
    def on_rank(value: object) -> object:
        return device if _is_deployment_device(value) else value

    def mapped(func: Callable) -> Callable:
        @functools.wraps(func)
        def with_device(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = on_rank(kwargs["device"])
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            return func(*args, **kwargs)
        return with_device

    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args:
            args = (on_rank(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = on_rank(kwargs["device"])
        return original_to(self, *args, **kwargs)

    def cuda(self, device_index=None, non_blocking=False, **kwargs):
        return original_to(self, device, non_blocking=non_blocking)

    stack = contextlib.ExitStack()
    stack.enter_context(_patched(torch, {name: mapped(getattr(torch, name)) for name in FACTORIES}))
    stack.enter_context(_patched(torch.Tensor, {
        **{name: mapped(getattr(torch.Tensor, name)) for name in TENSOR_FACTORIES},
        "to": to, "cuda": cuda,
        # a copy, as pinning an unpinned tensor makes one
        "pin_memory": lambda self, *args, **kwargs: self.clone()}))
    return stack


# ---------------------------------------------------------------------------------------------
# torch.cuda beyond the stream API


class _Device:
    """torch.cuda.device(i): one GPU per rank, so selecting it changes nothing."""

    def __init__(self, device=None):
        self.idx = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _nothing(*args, **kwargs) -> None:
    return None


@contextlib.contextmanager
def _range(*args, **kwargs):
    yield


def _refusing_class(name: str) -> type:
    """A refused torch.cuda class (CUDAGraph, graph): still a type, so an annotation such as
    `torch.cuda.CUDAGraph | None` evaluates; making one is refused."""
    return type(name, (), {"__init__": _refusing(name), "__module__": "torch.cuda"})


def _refusing(name: str) -> Callable:
    def refused(*args, **kwargs):
        asker, called = _asker(sys._getframe(1))
        asked = f"{called}() asks torch.cuda.{name}(), which" if called else f"torch.cuda.{name}()"
        refuse(f"{asked} is not modelled ({UNMODELLED})", f"torch.cuda.{name}", "a call", asker)
    return refused


def _is_tree_platform(frame: types.FrameType) -> bool:
    name = frame.f_globals.get("__name__") or ""
    return space_of(frame) is not None and (name == "vllm.platforms"
                                            or name.startswith("vllm.platforms."))


def _asker(frame: types.FrameType) -> tuple[types.FrameType, str]:
    """The code that asked, past the tree's platform modules' frames (a platform method that
    asks torch.cuda is refused where its caller called it), and what it called there ("" when
    it asked torch.cuda itself)."""
    called = ""
    while _is_tree_platform(frame) and frame.f_back is not None:
        code = frame.f_code
        method = "." in code.co_qualname and "<locals>" not in code.co_qualname
        called = (f"vllm.platforms.current_platform.{code.co_name}" if method
                  else f"{frame.f_globals['__name__']}.{code.co_name}")
        frame = frame.f_back
    return frame, called


# Modelled as doing nothing: none of them moves a value.
NO_OPS = {"set_device": _nothing, "empty_cache": _nothing, "device": _Device}
NVTX = {"range_push": lambda *args, **kwargs: 0, "range_pop": lambda *args, **kwargs: 0,
        "mark": _nothing, "range": _range, "range_start": lambda *args, **kwargs: 0,
        "range_end": _nothing}
# Refused: what only a GPU answers, and CUDA graphs, which are not modelled (a captured step is
# one whose asynchronous protocol must fall back).
REFUSED = ("get_device_capability", "get_device_properties", "get_device_name", "mem_get_info",
           "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
           "memory_stats", "reset_peak_memory_stats", "utilization", "get_arch_list",
           "get_rng_state", "set_rng_state", "CUDAGraph", "graph", "graph_pool_handle")


# ---------------------------------------------------------------------------------------------
# Custom ops


class ModelledOp:
    """`torch.ops.<lib>.<name>`: the implementation the calling code's load registered (each
    rank's copy of a target registers its own), called on the calling rank."""

    def __init__(self, qualname: str):
        self.qualname = qualname
        self.by_space: dict[int, Callable] = {}  # id(space) (0: no space) -> implementation
        self.last: Callable | None = None
        self.default = self

    def register(self, func: Callable, frame: types.FrameType) -> None:
        self.by_space[id(space_of(frame) or 0)] = self.last = func

    def register_fake(self, *args, **kwargs):
        """torch.library's fake, kernel and autograd registrations change no value on the rank's
        device: accepted as such, used directly or as a decorator."""
        if args and callable(args[-1]):
            return args[-1]
        return lambda func: func

    register_kernel = register_autograd = register_vmap = register_torch_dispatch = register_fake

    def __call__(self, *args, **kwargs):
        func = self.by_space.get(id(space_of(sys._getframe(1)) or 0), self.last)
        assert func is not None  # registered when created
        return func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<custom op {self.qualname}, modelled: its implementation runs on the rank>"


def _registered(qualname: str, func: Callable, frame: types.FrameType) -> ModelledOp:
    namespace, _, name = qualname.partition("::")
    library = getattr(torch.ops, namespace)
    op = library.__dict__.get(name)
    if not isinstance(op, ModelledOp):
        op = ModelledOp(qualname)
        setattr(library, name, op)
    op.register(func, frame)
    return op


def direct_register_custom_op(op_name: str, op_func: Callable, mutates_args=None, fake_impl=None,
                              target_lib=None, dispatch_key=None, tags=()) -> None:
    """vllm.utils.torch_utils.direct_register_custom_op, registered for the deployment's device
    (the library `target_lib` names, else vLLM's)."""
    namespace = getattr(target_lib, "ns", None) or "vllm"
    _registered(f"{namespace}::{op_name}", op_func, sys._getframe(1))


def custom_op(name: str, fn: Callable | None = None, /, *, mutates_args=(), device_types=None,
              schema=None, tags=None):
    """torch.library.custom_op in the deployment: the decorated function, called as the op
    (and as `torch.ops.<ns>.<name>`)."""
    frame = sys._getframe(1)

    def register(func: Callable) -> ModelledOp:
        return _registered(name, func, frame)

    return register if fn is None else register(fn)


def furnish(space: StandInSpace) -> None:
    """A tree's space answers as the deployment, whatever its own modules find on this machine:
    its platform the tree's own CUDA platform (`tree_platform`), made once `vllm.platforms` is
    (after everything else the load provides is in place)."""
    space.provide_made("vllm.platforms", "current_platform", tree_platform)
    space.provide("vllm.utils.torch_utils", "direct_register_custom_op", direct_register_custom_op)


# ---------------------------------------------------------------------------------------------
# Installing it


@contextlib.contextmanager
def _patched(owner: object, names: dict[str, Any]):
    """`owner`'s attributes (a module's, a class's own) set to `names` for the block."""
    saved = {name: vars(owner).get(name, _ABSENT) for name in names}
    for name, value in names.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


_ABSENT = object()


def _stream_api() -> contextlib.ExitStack:
    """torch.cuda's stream API the model's (pcpcheck.worker.cuda_model), for the stack's life."""
    stack = contextlib.ExitStack()
    stack.enter_context(_patched(torch.cuda, cuda_model.API))
    stack.enter_context(_patched(torch.Tensor, cuda_model.TENSOR_API))
    return stack


_entered: contextlib.ExitStack | None = None
_device: torch.device | None = None  # the rank device the deployment was entered on


def enter(device: torch.device) -> None:
    """The deployment for every later load and case of this worker process, on the rank device
    `device`: never taken down (the process runs only the code under check and the harness around
    it, which asks torch.cuda nothing), so a case pays no set-up. On a real GPU (`--device
    cuda`) torch.cuda and its devices are the GPU's own; the streams are modelled where a step
    is judged (`judged`)."""
    global _entered, _device
    if _entered is not None:
        return
    _device = device
    import torch.cuda.nvtx as nvtx
    stack = contextlib.ExitStack()
    stack.enter_context(_patched(torch.library, {"custom_op": custom_op}))
    if device.type != DEVICE_TYPE:
        refused = {name: _refusing_class(name) if name[0].isupper() or name == "graph"
                   else _refusing(name) for name in REFUSED}
        stack.enter_context(_patched(torch.cuda, {**NO_OPS, **refused}))
        stack.enter_context(_patched(nvtx, NVTX))
        stack.enter_context(_stream_api())
        stack.enter_context(_devices_on(device))
    _entered = stack


@contextlib.contextmanager
def judged(device: torch.device):
    """An asynchronous step, whose stream trace is judged: every access of an input is logged
    too (and on a GPU the stream API is the model's for it)."""
    with contextlib.ExitStack() as stack:
        if device.type == DEVICE_TYPE:
            stack.enter_context(_stream_api())
        stack.enter_context(cuda_model.accesses_logged())
        yield


def on_rank():
    """The calling rank's streams for one call (an asynchronous step binds its own, judged)."""
    return cuda_model.StreamModel((), capturing=False).bound()


class BreakableCUDAGraphCapture:
    """vLLM's capture state (vllm/compilation/breakable_cudagraph.py, 0.34.0) for code whose tree
    does not run it (a file alone): active while the step runs under a CUDA graph capture, as
    torch.cuda.is_current_stream_capturing() answers. A tree's own class answers for itself."""

    @classmethod
    def is_active(cls) -> bool:
        return bool(torch.cuda.is_current_stream_capturing())

    @classmethod
    def current(cls):
        return cls if cls.is_active() else None


add_bindings({"current_platform": PLATFORM, "direct_register_custom_op": direct_register_custom_op,
              "BreakableCUDAGraphCapture": BreakableCUDAGraphCapture})
