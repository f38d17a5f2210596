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

With a release tree (`StandInSpace(tree)`: a release, a checkout, or the vLLM tree a target file
lives in), a `vllm.*` module is first executed from that tree, as a fresh module of the space (the
release's own code: its settings' defaults, its tables, its helpers, wherever they moved), and
stood in for only when it cannot run here: no file for it (a C extension), an import outside the
standard library and `RELEASE_DEPENDENCIES` (installed or not, so a verdict does not depend on the
machine), or any failure while it executes. `stood_in` names each such module with the reason.
Names pcpcheck provides (`provide`: triton in interpreter mode, the platform's CPU answers) replace
the module's own after it runs (`provide_made`: a value made then, from the tree's own modules:
the deployment's platform); `fallback` names serve only where their module is a stand-in.
The tree's own `vllm.distributed.parallel_state` runs too: only its group globals are
pcpcheck's (`CallingRankGroup`, the calling rank's group of each kind).

An inert is never a silent answer: used as a truth value, a container, a number or in a
comparison it raises `StandInError` naming the file, line and name, and records it for the
worker (`take_refused`), which reports it after the case even if the code caught the error: the
run stops with exit 2, never a verdict built on a value pcpcheck made up.

Name resolution inside the space: a name listed in `_BINDINGS` gets a working stand-in wherever it
is looked up (any vllm module, or an attribute of an inert): `get_pcp_group` is
`pcpcheck.worker.rankctx.current_group` (the calling rank's group), `PAD_SLOT_ID` is -1, `init_logger`
gives a `logging` logger, `current_platform` and `direct_register_custom_op` are the deployment's
(pcpcheck.worker.deployment adds them: `add_bindings`), `cdiv`/`round_up`/`round_down` are the
arithmetic helpers, TP-group
queries describe a single TP rank (pcpcheck models TP = 1). `get_dcp_group` is left inert: the
DCP size depends on the case's regime, which the loader does not know. Every other name is an
`Inert`: callable (returns an inert, or its single function/class argument unchanged, so
`@triton.jit`, `@triton.jit(...)`, `@CustomOp.register("x")` all work), attributes are inerts,
subclassable, usable as a context manager and in `X | None` annotations. Every name looked up in
a stand-in module is recorded in `Target.stand_ins` (a live list: names first used at call time
are appended when used).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import sys
import threading
import traceback
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pcpcheck.worker import rankctx
from pcpcheck_spec.names import PAD_SLOT_ID

if TYPE_CHECKING:
    from pcpcheck.shared.source import Source

STANDIN_ROOT = "vllm"
# What only the kernels extra installs (pyproject.toml), and the hint a report gives where one
# is missing.
KERNELS_EXTRA = frozenset({"triton", "packaging", "regex", "psutil", "cachetools", "pydantic",
                           "pydantic_core"})
INSTALL_KERNELS = "pip install 'pcpcheck[kernels]'"
# What a module of a release's own tree may import besides the standard library and vllm.*:
# pcpcheck's dependencies and its kernels extra's.
RELEASE_DEPENDENCIES = frozenset({"numpy", "torch", "typing_extensions"}) | KERNELS_EXTRA
# A kernels-extra package served, where it is not installed, by the standard library module
# whose syntax it keeps: vllm.utils.import_utils imports `regex` (as `re`, for one split), and
# vllm.platforms needs that module to resolve the platform, on the path of every release. A
# pattern `re` cannot compile fails its module, which is then stood in for as any other.
STDLIB_FOR = {"regex": "re"}

_load_lock = threading.RLock()
_refused: list[str] = []  # every refused use in this process (Inert._refuse), until taken


def refuse(message: str, name: str, use: str, frame: types.FrameType) -> typing.NoReturn:
    """Refuse a use pcpcheck cannot honour: `message` after the file and line of `frame` (the
    code that made the use), recorded for the worker (`take_refused`), then raised."""
    message = f"{frame.f_code.co_filename}:{frame.f_lineno}: {message}: pcpcheck cannot honour it"
    with _load_lock:
        _refused.append(message)
    raise StandInError(message, name, use)


def take_refused() -> str | None:
    """The first use of an inert refused since the last call (the worker reports it after each
    case: the run stops with exit 2, even where the code under check caught the error)."""
    with _load_lock:
        first = _refused[0] if _refused else None
        _refused.clear()
    return first


# The tree's own process-group module runs; only its groups are pcpcheck's (the calling rank's).
PARALLEL_STATE = "vllm.distributed.parallel_state"


class StandInError(TypeError):
    """A stand-in was used in a way no stand-in can honour (a truth value, a number, ...)."""

    def __init__(self, message: str, name: str = "", use: str = ""):
        super().__init__(message)
        self.name, self.use = name, use


class NotADependency(ModuleNotFoundError):
    """A release module imports a package outside RELEASE_DEPENDENCIES."""


def is_standin_name(name: str) -> bool:
    return name == STANDIN_ROOT or name.startswith(STANDIN_ROOT + ".")


def _dcp_group():
    group = rankctx.current_dcp()
    if group is None:
        refuse("get_dcp_group(): pcpcheck binds the DCP group only on a release's steps, where "
               "the regime says who shares it", "vllm.distributed.parallel_state._DCP", "a use",
               sys._getframe(2))
    return group


# parallel_state's group globals, by the group each answers as
GROUP_KINDS = {"_WORLD": rankctx.current_group, "_PCP": rankctx.current_group,
               "_DCP": _dcp_group,
               **{name: lambda: rankctx.SOLO for name in (
                   "_TP", "_PP", "_DP", "_EP", "_ETP", "_EPLB", "_INNER_DP_WORLD", "_ENGRAM_DP")}}


class CallingRankGroup:
    """A group global of a tree's parallel_state (`_PCP`, `_DCP`, `_TP`, `_WORLD`, ...): the
    calling rank's group of its kind (GROUP_KINDS), so every rank, though the ranks share one
    module, finds its own group through the tree's own `get_pcp_group()`."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(GROUP_KINDS[self._name](), attribute)

    def __repr__(self) -> str:
        return f"<the calling rank's {self._name.strip('_')} group (pcpcheck)>"


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
    "get_tp_group": lambda: rankctx.SOLO,
    "get_tensor_model_parallel_world_size": lambda: 1,
    "get_tensor_model_parallel_rank": lambda: 0,
}


def add_bindings(bindings: dict[str, Any]) -> None:
    """Names served wherever they are looked up (pcpcheck.worker.deployment's, at its import)."""
    _BINDINGS.update(bindings)


# The key of a space's builtins naming the space: code can tell which load called it (a custom
# op registered by each rank's copy of a target runs that copy's implementation).
SPACE_KEY = "__pcpcheck_space__"


def space_of(frame: types.FrameType) -> StandInSpace | None:
    """The space whose code runs in `frame`, if any."""
    return frame.f_builtins.get(SPACE_KEY)


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


def _typing_compares() -> bool:
    """Whether the `==` being answered is typing's own (an annotation, not a value)."""
    return sys._getframe(2).f_code.co_filename == typing.__file__


class Inert:
    """An object standing in for any vllm name (see the module docstring)."""

    __slots__ = ("_name", "_space")
    KIND = "a stand-in"  # what the refusal calls it

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
        return type(self)(f"{self._name}.{name}", self._space)

    def __setattr__(self, name, value):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (inspect.isroutine(args[0]) or inspect.isclass(args[0])):
            return args[0]  # used as a decorator
        return type(self)(f"{self._name}()", self._space)

    def __mro_entries__(self, bases):
        first = next(base for base in bases if isinstance(base, Inert))
        return (_InertBase,) if first is self else ()

    def __instancecheck__(self, instance):
        return False

    def __subclasscheck__(self, subclass):
        return False

    def __getitem__(self, key):
        return type(self)(f"{self._name}[]", self._space)

    def __setitem__(self, key, value):
        pass

    def _reason(self) -> str:
        """Why this name has no real value here ("" when nothing more is known)."""
        return self._space.why(self._name) if self._space is not None else ""

    def _refuse(self, use: str):
        why = self._reason()
        refuse(f"{self._name} is {self.KIND}{f' ({why})' if why else ''}, used as {use}",
               self._name, use, sys._getframe(2))  # the code that used it: past this and the dunder

    def __iter__(self):
        self._refuse("a container (iterated)")

    def __len__(self):
        self._refuse("a container (len)")

    def __bool__(self):
        self._refuse("a truth value")

    def __contains__(self, item):
        self._refuse("a container (in)")

    def __eq__(self, other):
        if _typing_compares():  # Optional[X], X | None: typing deduplicates a Union's types
            return self is other
        self._refuse("a value (compared)")

    def __ne__(self, other):
        if _typing_compares():
            return self is not other
        self._refuse("a value (compared)")

    def __lt__(self, other):
        self._refuse("a value (compared)")

    def __le__(self, other):
        self._refuse("a value (compared)")

    def __gt__(self, other):
        self._refuse("a value (compared)")

    def __ge__(self, other):
        self._refuse("a value (compared)")

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
        self._refuse("a number")

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
    """The `vllm.*` modules of one load (the tree's own where they run here, else stand-ins),
    and the record of what was stood in for."""

    def __init__(self, tree: Source | None = None):
        self.tree = tree
        self.modules: dict[str, types.ModuleType] = {}
        self.names: list[str] = []  # names looked up in stand-in modules
        self.provided: list[str] = []  # names pcpcheck provides (the harness, adaptations)
        self.stood_in: dict[str, str] = {}  # module -> why it is a stand-in (with a tree)
        self.executed: list[str] = []  # modules run from the tree, in the order they ran
        self._overrides: dict[str, dict[str, Any]] = {}
        self._made: dict[str, dict[str, Callable[[StandInSpace], tuple[Any, str]]]] = {}
        self._fallbacks: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        if tree is not None:  # its parallel_state runs; the groups it hands out are the rank's
            self._overrides[PARALLEL_STATE] = {name: CallingRankGroup(name)
                                               for name in GROUP_KINDS}

    def provide(self, module: str, name: str, value: Any) -> None:
        """Bind `module.name` to `value` (the harness, a working adaptation), in place of the
        module's own name once it runs; recorded in `provided`, not in `names`."""
        with self._lock:
            self._overrides.setdefault(module, {})[name] = value
            if module in self.modules:
                setattr(self.modules[module], name, value)
            self.provided.append(f"{module}.{name} (working stand-in)")

    def provide_made(self, module: str, name: str,
                     make: Callable[[StandInSpace], tuple[Any, str]]) -> None:
        """As `provide`, with the value made when `module` is: `make(space)` gives it and the
        line `provided` records. Made then, every name the load provides is in place, so the
        value may come from the tree's own modules."""
        with self._lock:
            self._made.setdefault(module, {})[name] = make
            if module in self.modules:
                self._override(self.modules[module])

    def fallback(self, module: str, name: str, value: Any) -> None:
        """Bind `module.name` to `value` only if `module` is a stand-in (it cannot run here, or
        the tree lacks it); recorded in `provided` once applied, with the module's reason."""
        with self._lock:
            self._fallbacks.setdefault(module, {})[name] = value

    def record(self, name: str) -> None:
        with self._lock:
            if name not in self.names:
                self.names.append(name)

    def stood_in_by_reason(self) -> list[str]:
        """The stood-in modules, one line per reason: "reason: module, module"."""
        by_reason: dict[str, list[str]] = {}
        for module, why in self.stood_in.items():
            by_reason.setdefault(why, []).append(module)
        return [f"{why}: {', '.join(modules)}" for why, modules in by_reason.items()]

    def why(self, name: str) -> str:
        """Why the module holding `name` is a stand-in (with a tree), else ""."""
        module = name
        while module:
            if module in self.stood_in:
                return f"{module}: {self.stood_in[module]}"
            module = module.rpartition(".")[0]
        return ""

    def module(self, name: str) -> types.ModuleType:
        with self._lock:
            existing = self.modules.get(name)
            if existing is not None:
                return existing
            parent, _, child = name.rpartition(".")
            parent_module = self.module(parent) if parent else None
            existing = self.modules.get(name)  # the parent's __init__ may have imported it
            if existing is not None:
                return existing
            module = self._from_tree(name) if self.tree is not None else None
            if module is None:
                module = self._stand_in(name)
            if parent_module is not None:
                setattr(parent_module, child, module)
            return module

    def _stand_in(self, name: str) -> StandInModule:
        module = StandInModule(name)
        module.__dict__["_pcpcheck_space"] = self
        module.__path__ = []  # a package: submodules import
        module.__spec__ = importlib.machinery.ModuleSpec(name, self, is_package=True)
        module.__loader__ = self
        module.__package__ = name
        why = f"; {name}: {self.stood_in[name]}" if name in self.stood_in else ""
        for key, value in self._fallbacks.get(name, {}).items():
            setattr(module, key, value)
            self.provided.append(f"{name}.{key} (working stand-in{why})")
        self.modules[name] = module  # first: a made value may import the module's children
        self._override(module)
        return module

    def _override(self, module: types.ModuleType) -> None:
        """The names pcpcheck provides for `module`, in place of its own."""
        for key, value in self._overrides.get(module.__name__, {}).items():
            setattr(module, key, value)
        for key, make in self._made.get(module.__name__, {}).items():
            value, line = make(self)
            setattr(module, key, value)
            self.provided.append(f"{module.__name__}.{key}: {line}")

    def _from_tree(self, name: str) -> types.ModuleType | None:
        """`name` executed from the tree, or None (and the reason in `stood_in`)."""
        assert self.tree is not None
        found = self.tree.module_file(name)
        if found is None:
            self.stood_in[name] = "no Python file for it in this tree (a C extension, or absent)"
            return None
        with _load_lock:
            refused_before = len(_refused)
        try:
            return self.execute(name, *found)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure: the module cannot run here
            self.stood_in[name] = _failure(exc, self.tree.filename(found[0]))
            with _load_lock:  # a refusal that made it a stand-in is reported as its reason
                del _refused[refused_before:]
            return None

    def execute(self, name: str, relpath: str, package: bool = False,
                dependency: bool = True) -> types.ModuleType:
        """The tree's file `relpath` executed as module `name` of the space (raises what it
        raises); a `dependency` (not a file under check) imports only what RELEASE_DEPENDENCIES
        allows. It is in `modules` while it runs, so a circular import sees it half done, as in
        Python; on failure it is taken out again."""
        assert self.tree is not None
        filename = self.tree.filename(relpath)
        code = compile(self.tree.read(relpath), filename, "exec", dont_inherit=True)
        module = types.ModuleType(name)
        module.__file__ = filename
        module.__package__ = name if package else name.rpartition(".")[0]
        module.__spec__ = importlib.machinery.ModuleSpec(name, self, origin=filename,
                                                         is_package=package)
        module.__loader__ = self
        if package:
            module.__path__ = []
        module.__dict__["__builtins__"] = self.builtins_dict(release=dependency)
        with self._lock, _load_lock:
            self.modules[name] = module
            previous = sys.modules.get(name)
            sys.modules[name] = module  # library code (dataclasses) looks a class's module up
            try:
                exec(code, module.__dict__)
            except BaseException:
                del self.modules[name]
                raise
            finally:
                if previous is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = previous
            self._override(module)
            self.executed.append(name)
            if name == PARALLEL_STATE:
                self.provided.append(f"{name}: the tree's own, its groups "
                                     f"({', '.join(GROUP_KINDS)}) the calling rank's")
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

    def make_import(self, release: bool = False) -> Callable:
        """The `__import__` of code the space serves; `release`: a module of the tree, whose
        imports outside vllm.* are held to the standard library and RELEASE_DEPENDENCIES."""
        real_import = builtins.__import__

        def standin_import(name, globals=None, locals=None, fromlist=(), level=0):
            if release and not level:
                top = name.partition(".")[0]
                if (top != STANDIN_ROOT and top not in sys.stdlib_module_names
                        and top not in RELEASE_DEPENDENCIES):
                    raise NotADependency(f"imports {top!r}, not among pcpcheck's dependencies",
                                         name=top)
                if top in STDLIB_FOR and name == top and not _installed(top):
                    return self._stdlib_for(top)
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

    def _stdlib_for(self, package: str) -> types.ModuleType:
        """The standard library module serving `package` (STDLIB_FOR), recorded once."""
        with self._lock:
            line = (f"{package}: not installed ({INSTALL_KERNELS}): the standard library's "
                    f"{STDLIB_FOR[package]} serves the release's imports of it")
            if line not in self.provided:
                self.provided.append(line)
        return importlib.import_module(STDLIB_FOR[package])

    def builtins_dict(self, release: bool = False) -> dict:
        namespace = dict(builtins.__dict__)
        namespace["__import__"] = self.make_import(release)
        namespace[SPACE_KEY] = self
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

    @contextlib.contextmanager
    def imported(self):
        """As `active`, with the space's modules in sys.modules too: code that runs after the
        load and looks itself up there (vllm/envs.py's settings read `sys.modules[__name__]`)
        runs as in the release's process."""
        with self.active():
            sys.modules.update(self.modules)
            yield self


@functools.cache
def _installed(package: str) -> bool:
    """Whether `package` imports (one that is there but fails to import is as good as absent)."""
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True


def _failure(exc: BaseException, filename: str) -> str:
    """Why a tree's module cannot run here, in one line."""
    if isinstance(exc, NotADependency):
        return f"{exc}"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        hint = f" ({INSTALL_KERNELS})" if exc.name in KERNELS_EXTRA else ""
        return f"imports {exc.name!r}, which is not installed{hint}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    where = f" (line {frames[-1].lineno})" if frames else ""
    if isinstance(exc, StandInError) and exc.name:
        return f"uses {exc.name}, a stand-in, as {exc.use}{where}"
    text = " ".join(str(exc).split())[:200]
    return f"fails here{where}: {type(exc).__name__}" + (f": {text}" if text else "")
