"""The stand-ins a target's `vllm.*` imports get, so it loads without vLLM installed.

Each load gets its own `StandInSpace`: a private namespace of stand-in modules (`vllm`,
`vllm.distributed`, ...), created on demand, never left in `sys.modules`. Two routes lead into it:

1. The target module's own `__builtins__` is a copy of the builtins whose `__import__` sends
   `vllm`/`vllm.*` (absolute, or relative from a file that lives inside a `vllm/` tree) to the
   space and everything else to the real import. A function's builtins are fixed when it is
   defined, so imports inside the target's function bodies executed at call time, on any rank
   thread, still resolve to the same stand-ins, without touching global state and without a race
   between rank threads. This is why call-time imports need no re-installation around calls.
2. While the load executes (and only then, under a global lock), a `sys.meta_path` finder serves
   `vllm*` from the space and any `vllm*` entries already in `sys.modules` (a real vLLM, say) are
   set aside; afterwards the finder is removed, the space's modules are dropped from
   `sys.modules` and the set-aside entries are restored. This route covers helper modules the
   target imports at load time (`from mypkg.utils import x`, where `mypkg.utils` imports vllm):
   their module-level vllm names are bound at load time. Limitation: a helper module (not the
   target module itself) that imports vllm inside a function body at call time finds no stand-in.

Name resolution inside the space: a name listed in `_BINDINGS` gets a working stand-in wherever it
is looked up (any vllm module, or an attribute of an inert): `get_pcp_group` is
`pcpcheck.worker.rankctx.current_group` (the calling rank's group), `PAD_SLOT_ID` is -1, `init_logger`
gives a `logging` logger, `cdiv`/`round_up`/`round_down` are the arithmetic helpers, TP-group
queries describe a single TP rank (pcpcheck models TP = 1). `get_dcp_group` is left inert: the
DCP size depends on the case's regime, which the loader does not know. Every other name is an
`Inert`: callable (returns an inert, or its single function/class argument unchanged, so
`@triton.jit`, `@triton.jit(...)`, `@CustomOp.register("x")` all work), attributes are inerts,
subclassable, iterable (empty), falsy, compares unequal/false, usable as a context manager and in
`X | None` annotations. Using an inert as a number raises `StandInError`, reported as a LoadError
at load time. Every name looked up in a stand-in module is recorded in `Target.stand_ins` (a live
list: names first used at call time are appended when used).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from pcpcheck.worker import rankctx
from pcpcheck_spec.names import PAD_SLOT_ID

STANDIN_ROOT = "vllm"

_load_lock = threading.RLock()


class StandInError(TypeError):
    """A stand-in was used in a way no stand-in can satisfy (e.g. as a number)."""


def is_standin_name(name: str) -> bool:
    return name == STANDIN_ROOT or name.startswith(STANDIN_ROOT + ".")


class _SoloGroup:
    """A one-rank group (tensor parallelism is 1 in pcpcheck)."""

    world_size = 1
    rank_in_group = 0
    rank = 0
    ranks = (0,)
    local_rank = 0

    def all_gather(self, tensor, dim=0):
        return tensor

    def all_reduce(self, tensor):
        return tensor

    def broadcast(self, tensor, src=0):
        return tensor

    def barrier(self):
        return None


_SOLO = _SoloGroup()


def _cdiv(a, b):
    return -(a // -b)


def _round_up(x, y):
    return ((x + y - 1) // y) * y


def _round_down(x, y):
    return (x // y) * y


_BINDINGS: dict[str, Any] = {
    "get_pcp_group": rankctx.current_group,
    "PAD_SLOT_ID": PAD_SLOT_ID,
    "init_logger": logging.getLogger,
    "cdiv": _cdiv,
    "round_up": _round_up,
    "round_down": _round_down,
    "get_tp_group": lambda: _SOLO,
    "get_tensor_model_parallel_world_size": lambda: 1,
    "get_tensor_model_parallel_rank": lambda: 0,
}


class _InertBase:
    """What a class deriving from an inert derives from instead."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Inert(f"{type(self).__name__}.{name}", None)


class Inert:
    """An object standing in for any vllm name (see the module docstring)."""

    __slots__ = ("_name", "_space")

    def __init__(self, name: str, space: StandInSpace | None):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_space", space)

    def __repr__(self):
        return f"<stand-in {self._name}>"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name in _BINDINGS:
            return _BINDINGS[name]
        return Inert(f"{self._name}.{name}", self._space)

    def __setattr__(self, name, value):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (inspect.isroutine(args[0]) or inspect.isclass(args[0])):
            return args[0]  # used as a decorator
        return Inert(f"{self._name}()", self._space)

    def __mro_entries__(self, bases):
        first = next(base for base in bases if isinstance(base, Inert))
        return (_InertBase,) if first is self else ()

    def __instancecheck__(self, instance):
        return False

    def __subclasscheck__(self, subclass):
        return False

    def __getitem__(self, key):
        return Inert(f"{self._name}[]", self._space)

    def __setitem__(self, key, value):
        pass

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        return False

    def __contains__(self, item):
        return False

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __hash__(self):
        return id(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __or__(self, other):  # `X | None` in annotations
        return self

    def __ror__(self, other):
        return self

    def _number(self, *args):
        raise StandInError(f"stand-in {self._name} cannot be used as a number")

    __int__ = __float__ = __index__ = __complex__ = _number
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _number
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _number
    __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = __abs__ = _number
    __and__ = __rand__ = __xor__ = __rxor__ = __lshift__ = __rshift__ = _number


class StandInModule(types.ModuleType):
    """A vllm module stand-in: every attribute it lacks is a binding or an inert."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        space = self.__dict__["_pcpcheck_space"]
        full = f"{self.__name__}.{name}"
        space.record(full)
        value = _BINDINGS[name] if name in _BINDINGS else Inert(full, space)
        setattr(self, name, value)  # one object per name
        return value


class StandInSpace(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The stand-in modules of one load, and the record of names stood in for."""

    def __init__(self):
        self.modules: dict[str, StandInModule] = {}
        self.names: list[str] = []
        self.provided: list[str] = []
        self._lock = threading.RLock()

    def provide(self, module: str, name: str, value: Any) -> None:
        """Bind `module.name` to a working stand-in (a real class, a helper) before a load;
        recorded in `provided` (what the loader adapted), not in `names`."""
        setattr(self.module(module), name, value)
        with self._lock:
            self.provided.append(f"{module}.{name}")

    def record(self, name: str) -> None:
        with self._lock:
            if name not in self.names:
                self.names.append(name)

    def module(self, name: str) -> StandInModule:
        with self._lock:
            existing = self.modules.get(name)
            if existing is not None:
                return existing
            module = StandInModule(name)
            module.__dict__["_pcpcheck_space"] = self
            module.__path__ = []  # a package: submodules import
            module.__spec__ = importlib.machinery.ModuleSpec(name, self, is_package=True)
            module.__loader__ = self
            module.__package__ = name
            self.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(self.module(parent), child, module)
            return module

    # meta path finder / loader (active only while a load executes)
    def find_spec(self, fullname, path=None, target=None):
        if not is_standin_name(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return self.module(spec.name)

    def exec_module(self, module):
        pass

    def make_import(self) -> Callable:
        real_import = builtins.__import__

        def standin_import(name, globals=None, locals=None, fromlist=(), level=0):
            absolute = name
            if level:
                package = (globals or {}).get("__package__") or ""
                if not is_standin_name(package):
                    return real_import(name, globals, locals, fromlist, level)
                try:
                    absolute = importlib.util.resolve_name("." * level + name, package)
                except ImportError:
                    return real_import(name, globals, locals, fromlist, level)
            if not is_standin_name(absolute):
                return real_import(name, globals, locals, fromlist, level)
            module = self.module(absolute)
            if fromlist or level:
                return module
            return self.module(absolute.partition(".")[0])

        return standin_import

    def builtins_dict(self) -> dict:
        namespace = dict(builtins.__dict__)
        namespace["__import__"] = self.make_import()
        return namespace

    @contextlib.contextmanager
    def active(self):
        """Serve vllm* through the import system (load time only; see the module docstring)."""
        with _load_lock:
            saved = {k: v for k, v in sys.modules.items() if is_standin_name(k)}
            for key in saved:
                del sys.modules[key]
            sys.meta_path.insert(0, self)
            try:
                yield self
            finally:
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self)
                for key in [k for k in sys.modules if is_standin_name(k)]:
                    del sys.modules[key]
                sys.modules.update(saved)
