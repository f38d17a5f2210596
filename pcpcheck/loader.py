"""Load a gather target without vLLM installed.

`load_target(target, function=None) -> Target` accepts:

- `None` or `"impl"`: the bundled torch implementation, `pcpcheck_impl.gather_prefill_cache_inputs`.
- a path to a Python file (a vLLM checkout's `vllm/v1/attention/ops/pcp.py`, a fork's copy, a zoo
  file): executed as a fresh module under a unique name, with stand-ins for every `vllm` import.
- `module:function` or `module` (e.g. `tests.zoo.correct:_gather_prefill_cache_inputs`): the
  module is located on sys.path (its parent packages are imported normally) and executed fresh,
  with the same stand-ins.

Every failure is a `LoadError` with a one-line message.

Stand-in design
---------------
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
`pcpcheck.rankctx.current_group` (the calling rank's group), `PAD_SLOT_ID` is -1, `init_logger`
gives a `logging` logger, `cdiv`/`round_up`/`round_down` are the arithmetic helpers, TP-group
queries describe a single TP rank (pcpcheck models TP = 1). `get_dcp_group` is left inert: the
DCP size depends on the case's regime, which the loader does not know. Every other name is an
`Inert`: callable (returns an inert, or its single function/class argument unchanged, so
`@triton.jit`, `@triton.jit(...)`, `@CustomOp.register("x")` all work), attributes are inerts,
subclassable, iterable (empty), falsy, compares unequal/false, usable as a context manager and in
`X | None` annotations. Using an inert as a number raises `StandInError`, reported as a LoadError
at load time. Every name looked up in a stand-in module is recorded in `Target.stand_ins` (a live
list: names first used at call time are appended when used).

The target module itself is registered in `sys.modules` under its name while it executes (some
library code looks itself up there) and then removed again (file form: a unique name
`pcpcheck_target_<n>_<stem>`; module form: the previous entry, if any, is put back). It lives on
through `Target.function.__globals__`.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import itertools
import logging
import os
import sys
import threading
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pcpcheck import rankctx
from pcpcheck_spec.names import PAD_SLOT_ID

DEFAULT_FUNCTIONS = ("_gather_prefill_cache_inputs", "gather_prefill_cache_inputs")
STANDIN_ROOT = "vllm"

_load_lock = threading.RLock()
_counter = itertools.count(1)


class LoadError(Exception):
    """A target could not be loaded; str(error) is one line for the user."""


class StandInError(TypeError):
    """A stand-in was used in a way no stand-in can satisfy (e.g. as a number)."""


# ----------------------------------------------------------------------------------------------
# Stand-ins


def _is_standin_name(name: str) -> bool:
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

    def __init__(self, name: str, space: "StandInSpace | None"):
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
        if not _is_standin_name(fullname):
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
                if not _is_standin_name(package):
                    return real_import(name, globals, locals, fromlist, level)
                try:
                    absolute = importlib.util.resolve_name("." * level + name, package)
                except ImportError:
                    return real_import(name, globals, locals, fromlist, level)
            if not _is_standin_name(absolute):
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
            saved = {k: v for k, v in sys.modules.items() if _is_standin_name(k)}
            for key in saved:
                del sys.modules[key]
            sys.meta_path.insert(0, self)
            try:
                yield self
            finally:
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self)
                for key in [k for k in sys.modules if _is_standin_name(k)]:
                    del sys.modules[key]
                sys.modules.update(saved)


# ----------------------------------------------------------------------------------------------
# Target


@dataclass
class Target:
    name: str
    function: Callable
    accepts_shard: bool
    accepts_group: bool
    stand_ins: list[str] = field(default_factory=list)
    source: str = ""
    function_name: str = ""
    shard_positional: bool = False  # shard_decode_requests is positional-only (rare)

    def call(self, tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False, group=None):
        """Call the target with the parameters it accepts. With a group, it is also bound as the
        calling thread's group, so the target's `get_pcp_group()` returns it."""
        args: list[Any] = [tensors, slot_mapping, num_decode_tokens]
        kwargs: dict[str, Any] = {}
        if self.accepts_shard:
            if self.shard_positional:
                args.append(shard_decode_requests)
            else:
                kwargs["shard_decode_requests"] = shard_decode_requests
        if self.accepts_group and group is not None:
            kwargs["group"] = group
        if group is None:
            return self.function(*args, **kwargs)
        with rankctx.bound_group(group):
            return self.function(*args, **kwargs)


def _signature_flags(function: Callable) -> tuple[bool, bool, bool]:
    """(accepts_shard, accepts_group, shard_positional)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return True, False, False  # assume vLLM's signature
    params = signature.parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    shard = params.get("shard_decode_requests")
    accepts_shard = shard is not None or var_kw
    shard_positional = shard is not None and shard.kind is inspect.Parameter.POSITIONAL_ONLY
    group = params.get("group")
    accepts_group = group is not None and group.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
    return accepts_shard, accepts_group, shard_positional


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _where(exc: BaseException, filename: str | None) -> str:
    """file:line of the deepest frame in `filename` (else the deepest frame) of exc's traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    chosen = None
    if filename is not None:
        real = os.path.realpath(filename)
        for frame in frames:
            if os.path.realpath(frame.filename) == real:
                chosen = frame
    if chosen is None:
        importlib_frames = [f for f in frames if "importlib" not in f.filename]
        chosen = importlib_frames[-1] if importlib_frames else (frames[-1] if frames else None)
    if chosen is None:
        return filename or "<target>"
    return f"{chosen.filename}:{chosen.lineno}"


def _import_failure(exc: BaseException, filename: str | None, label: str) -> LoadError:
    where = _where(exc, filename)
    if isinstance(exc, SyntaxError):
        return LoadError(f"{exc.filename}:{exc.lineno}: syntax error: {_one_line(exc.msg)}")
    if isinstance(exc, StandInError):
        return LoadError(f"{where}: importing {label}: cannot stand in: {_one_line(exc)}")
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return LoadError(
            f"{where}: importing {label}: module {exc.name!r} is not installed and cannot be "
            f"stood in for (only {STANDIN_ROOT}.* is)"
        )
    return LoadError(
        f"{where}: importing {label} failed: {type(exc).__name__}: {_one_line(exc)}"
    )


def _pick_function(module: types.ModuleType, function: str | None, label: str) -> tuple[str, Callable]:
    names = (function,) if function else DEFAULT_FUNCTIONS
    for name in names:
        if name in module.__dict__:
            obj = module.__dict__[name]
            if isinstance(obj, Inert):
                raise LoadError(
                    f"{label}: {name} is imported from {obj._name.rpartition('.')[0]} (a vllm "
                    f"module, stood in for here): point the tool at the file that defines it"
                )
            if not callable(obj):
                raise LoadError(f"{label}: {name} is not callable ({type(obj).__name__})")
            return name, obj
    found = sorted(
        key
        for key, value in module.__dict__.items()
        if callable(value)
        and not key.startswith("__")
        and not isinstance(value, (Inert, types.ModuleType))
        and not isinstance(value, type)
    )
    wanted = " or ".join(names)
    listing = ", ".join(found[:20]) + (", ..." if len(found) > 20 else "") if found else "none"
    raise LoadError(f"{label}: no function {wanted}; callables found: {listing}")


def _make_target(module, function, label, source, space, name_prefix) -> Target:
    fn_name, fn = _pick_function(module, function, label)
    accepts_shard, accepts_group, shard_positional = _signature_flags(fn)
    return Target(
        name=f"{name_prefix}:{fn_name}",
        function=fn,
        accepts_shard=accepts_shard,
        accepts_group=accepts_group,
        stand_ins=space.names if space is not None else [],
        source=source,
        function_name=fn_name,
        shard_positional=shard_positional,
    )


def _package_from_path(path: Path) -> str:
    """`vllm.v1.attention.ops` for .../vllm/v1/attention/ops/pcp.py (relative vllm imports)."""
    parts = path.parent.parts
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] == STANDIN_ROOT:
            package = parts[index:]
            if all(part.isidentifier() for part in package):
                return ".".join(package)
            return ""
    return ""


def _load_impl(function: str | None) -> Target:
    try:
        impl = importlib.import_module("pcpcheck_impl")
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"cannot import the bundled implementation (impl): {_one_line(exc)}") from None
    return _make_target(impl, function, "impl", "impl", None, "impl")


def _load_file(path: Path, function: str | None) -> Target:
    if not path.exists():
        raise LoadError(f"{path}: no such file")
    if not path.is_file():
        raise LoadError(f"{path}: not a file")
    if path.suffix != ".py":
        raise LoadError(f"{path}: not a Python file (.py expected)")
    try:
        source = path.read_bytes()  # bytes: compile honours a BOM and a PEP 263 coding line
    except OSError as exc:
        raise LoadError(f"{path}: cannot read: {_one_line(exc)}") from None
    filename = str(path)
    space = StandInSpace()
    module = exec_source(source, filename, space, _package_from_path(path.resolve()))
    return _make_target(module, function, filename, filename, space, path.name)


def exec_source(source: str, filename: str, space: StandInSpace,
                package: str = "") -> types.ModuleType:
    """Execute `source` (the text of `filename`, which may live in a wheel) as a fresh module
    whose vllm.* imports `space` serves; `package` resolves its relative imports. LoadError
    (one line) on failure."""
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise LoadError(f"{filename}:{exc.lineno}: syntax error: {_one_line(exc.msg)}") from None
    except ValueError as exc:  # null bytes
        raise LoadError(f"{filename}: cannot compile: {_one_line(exc)}") from None
    stem = "".join(c if c.isalnum() else "_" for c in Path(filename).stem)
    module_name = f"pcpcheck_target_{next(_counter)}_{stem}"
    module = types.ModuleType(module_name)
    module.__file__ = filename
    module.__package__ = package
    module.__dict__["__builtins__"] = space.builtins_dict()
    with space.active():
        sys.modules[module_name] = module
        try:
            exec(code, module.__dict__)
        except (Exception, SystemExit) as exc:
            raise _import_failure(exc, filename, Path(filename).name) from None
        finally:
            sys.modules.pop(module_name, None)
    return module


def _load_module(spec_text: str, function: str | None) -> Target:
    module_name, sep, fn_part = spec_text.partition(":")
    if sep and function and fn_part and fn_part != function:
        raise LoadError(f"{spec_text}: names function {fn_part!r} but function={function!r} was given")
    function = function or (fn_part or None)
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise LoadError(f"{spec_text!r}: not an existing file and not a module[:function] name")
    if function is not None and not function.isidentifier():
        raise LoadError(f"{spec_text!r}: {function!r} is not a function name")
    if _is_standin_name(module_name):
        raise LoadError(f"{module_name}: vllm modules are stood in for here; point at the .py file instead")
    space = StandInSpace()
    with space.active():
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError as exc:
            raise LoadError(f"{module_name}: no module named {exc.name!r}") from None
        except (Exception, SystemExit) as exc:
            raise _import_failure(exc, None, module_name) from None
        if spec is None:
            raise LoadError(f"{module_name}: no module named {module_name!r}")
        loader = spec.loader
        origin = spec.origin
        filename = origin if origin and origin.endswith(".py") else None
        previous = sys.modules.get(module_name)
        try:
            if isinstance(loader, importlib.machinery.SourceFileLoader):
                module = importlib.util.module_from_spec(spec)
                module.__dict__["__builtins__"] = space.builtins_dict()
                sys.modules[module_name] = module
                try:
                    loader.exec_module(module)
                finally:
                    if previous is None:
                        sys.modules.pop(module_name, None)
                    else:
                        sys.modules[module_name] = previous
            else:  # namespace packages, extension modules, ...: a plain import
                module = importlib.import_module(module_name)
        except LoadError:
            raise
        except (Exception, SystemExit) as exc:
            raise _import_failure(exc, filename, module_name) from None
    source = f"{module_name}:{function}" if function else module_name
    target = _make_target(module, function, module_name, source, space, module_name)
    target.source = f"{module_name}:{target.function_name}"
    return target


def load_target(target: str | None, function: str | None = None) -> Target:
    """Load the gather under test. Raises LoadError (one line) for every failure."""
    if target is None or target == "impl":
        return _load_impl(function)
    if not isinstance(target, (str, os.PathLike)):
        raise LoadError(f"target must be a path or module[:function], not {type(target).__name__}")
    text = os.fspath(target)
    if not text.strip():
        raise LoadError("empty target")
    path = Path(text).expanduser()
    looks_like_path = (
        text.endswith(".py") or os.sep in text or "/" in text or text.startswith(".") or path.exists()
    )
    if looks_like_path:
        return _load_file(path, function)
    return _load_module(text, function)


__all__ = ["LoadError", "StandInError", "Target", "load_target", "Inert", "StandInSpace", "exec_source"]

