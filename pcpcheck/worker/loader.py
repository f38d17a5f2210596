"""Load a gather target without vLLM installed.

`load_target(target, function=None) -> Target` accepts:

- `None` or `"impl"`: the bundled torch implementation, `pcpcheck_impl.gather_prefill_cache_inputs`.
- a path to a Python file (a vLLM checkout's `vllm/v1/attention/ops/pcp.py`, a fork's copy, a zoo
  file): executed as a fresh module under a unique name, with stand-ins for every `vllm` import.
- `module:function` or `module` (e.g. `tests.zoo.correct:_gather_prefill_cache_inputs`): the
  module is located on sys.path (its parent packages are imported normally) and executed fresh,
  with the same stand-ins.

Every failure is a `LoadError` with a one-line message.

Stand-ins for the `vllm.*` imports: pcpcheck.worker.standins.

The target module itself is registered in `sys.modules` under its name while it executes (some
library code looks itself up there) and then removed again (file form: a unique name
`pcpcheck_target_<n>_<stem>`; module form: the previous entry, if any, is put back). It lives on
through `Target.function.__globals__`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import os
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcpcheck.shared.errors import LoadError
from pcpcheck.worker import deployment, rankctx
from pcpcheck.worker.standins import (
    STANDIN_ROOT,
    Inert,
    StandInError,
    StandInSpace,
    is_standin_name,
)

if TYPE_CHECKING:  # annotations only: the loader imports nothing it does not run
    from pcpcheck.shared.source import Source

DEFAULT_FUNCTIONS = ("_gather_prefill_cache_inputs", "gather_prefill_cache_inputs")

_counter = itertools.count(1)


# ----------------------------------------------------------------------------------------------
# Target


@dataclass(kw_only=True)
class Target:
    name: str
    function: Callable
    accepts_shard: bool
    accepts_group: bool
    stand_ins: list[str] = field(default_factory=list)
    source: str = ""
    function_name: str = ""
    shard_positional: bool = False  # shard_decode_requests is positional-only (rare)
    # `--async`: the protocol class beside the gather (start/finish), and the caller's order
    protocol: type | None = None
    async_order: tuple[str, ...] = ()
    # the gather's file uses torch.cuda's stream API: its sharded steps' streams are judged
    uses_streams: bool = False

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


def _one_line(text: object) -> str:  # an exception, most often
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
    if isinstance(exc, StandInError):  # its message names the file, line and name
        return LoadError(f"importing {label}: {_one_line(exc)}")
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


def _pick_protocol(module: types.ModuleType, name: str, label: str) -> type:
    """The asynchronous protocol class: `name`, else the module's one class with callable start
    and finish (classes it imports from vllm are stand-ins, never candidates)."""
    def shaped(value) -> bool:
        return (isinstance(value, type) and not isinstance(value, Inert)
                and callable(getattr(value, "start", None)) and callable(getattr(value, "finish", None)))
    if name:
        value = module.__dict__.get(name)
        if value is None:
            raise LoadError(f"{label}: no class {name} (--async names the protocol class)")
        if not shaped(value):
            raise LoadError(f"{label}: {name} is not a class with start and finish methods")
        return value
    found = sorted(key for key, value in module.__dict__.items() if shaped(value))
    if len(found) != 1:
        which = ", ".join(found) if found else "none"
        raise LoadError(f"{label}: --async needs one class with start and finish methods, found "
                        f"{which}: name it with --async CLASS")
    return module.__dict__[found[0]]


# What code that orders work between CUDA streams names (torch.cuda's and Tensor's): a file
# that names none of them runs its work on the main stream alone.
STREAM_API = frozenset({"Stream", "Event", "stream", "set_stream", "wait_stream", "wait_event",
                        "record_stream"})


def uses_streams(function: Callable) -> bool:
    """Whether the module defining `function` names the stream API anywhere in its functions
    and classes (their code objects' names, nested code included)."""
    name = getattr(function, "__module__", None)
    pending = [function, *(value for value in getattr(function, "__globals__", {}).values()
                           if getattr(value, "__module__", None) == name)]
    seen: set[int] = set()
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, type):
            pending.extend(vars(value).values())
            continue
        if isinstance(value, property):
            pending.extend(accessor for accessor in (value.fget, value.fset) if accessor)
            continue
        code = getattr(getattr(value, "__func__", value), "__code__", value)
        if isinstance(code, types.CodeType):
            if STREAM_API.intersection(code.co_names):
                return True
            pending.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return False


def make_target(module, function, label, source, space, name_prefix) -> Target:
    from pcpcheck.shared.protocol import split_function
    from pcpcheck_spec.names import ASYNC_ORDER
    function, protocol_name, order = split_function(function)
    fn_name, fn = _pick_function(module, function, label)
    accepts_shard, accepts_group, shard_positional = _signature_flags(fn)
    protocol = None if protocol_name is None else _pick_protocol(module, protocol_name, label)
    return Target(
        protocol=protocol,
        async_order=(order or ASYNC_ORDER) if protocol is not None else (),
        name=f"{name_prefix}:{fn_name}",
        function=fn,
        accepts_shard=accepts_shard,
        accepts_group=accepts_group,
        stand_ins=space.names if space is not None else [],
        source=source,
        function_name=fn_name,
        shard_positional=shard_positional,
        uses_streams=uses_streams(fn),
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
    except Exception as exc:  # noqa: BLE001 - a broken install may raise anything: a LoadError names it
        raise LoadError(f"cannot import the bundled implementation (impl): {_one_line(exc)}") from None
    return make_target(impl, function, "impl", "impl", None, "impl")


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
    package = _package_from_path(path.resolve())
    space = StandInSpace(_tree_of(path.resolve(), package))
    if space.tree is not None:
        deployment.furnish(space)
    module = exec_source(source, filename, space, package)
    return make_target(module, function, filename, filename, space, path.name)


def _tree_of(path: Path, package: str) -> Source | None:
    """The vLLM tree a file inside `vllm/` belongs to (a checkout: the directory holding
    `vllm/`), whose own modules its vllm.* imports then run; None for a file outside one."""
    if not package:
        return None
    from pcpcheck.shared.source import Source
    root = path.parents[len(package.split("."))]
    return Source(kind="checkout", location=str(root), release="unknown")


def exec_source(source: str | bytes, filename: str, space: StandInSpace,
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
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a target's import may raise anything: a LoadError names it
            raise _import_failure(exc, filename, Path(filename).name) from None
        finally:
            sys.modules.pop(module_name, None)
    return module


def exec_release_file(source: Source, relpath: str, space: StandInSpace) -> types.ModuleType:
    """A file of a vLLM release (relpath in a pcpcheck.shared.source.Source): with the space's
    tree, its module there (run once; the module other release files import), else a fresh
    module of its own package; its `vllm.*` imports served by `space`. LoadError on failure."""
    if space.tree is None:
        package = relpath.rpartition("/")[0].replace("/", ".")
        return exec_source(source.read(relpath), source.filename(relpath), space, package)
    name = relpath.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    existing = space.modules.get(name)
    if existing is not None and name in space.executed:
        return existing
    filename = source.filename(relpath)
    with space.active():
        try:
            return space.execute(name, relpath, relpath.endswith("/__init__.py"),
                                 dependency=False)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a release file may raise anything: a LoadError names it
            raise _import_failure(exc, filename, Path(filename).name) from None


def _load_module(spec_text: str, function: str | None) -> Target:
    from pcpcheck.shared.protocol import async_function, split_function
    function, protocol, order = split_function(function)
    module_name, sep, fn_part = spec_text.partition(":")
    if sep and function and fn_part and fn_part != function:
        raise LoadError(f"{spec_text}: names function {fn_part!r} but function={function!r} was given")
    function = function or (fn_part or None)
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise LoadError(f"{spec_text!r}: not an existing file and not a module[:function] name")
    if function is not None and not function.isidentifier():
        raise LoadError(f"{spec_text!r}: {function!r} is not a function name")
    if is_standin_name(module_name):
        raise LoadError(f"{module_name}: vllm modules are stood in for here; point at the .py file instead")
    space = StandInSpace()
    with space.active():
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError as exc:
            raise LoadError(f"{module_name}: no module named {exc.name!r}") from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a target's import may raise anything: a LoadError names it
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
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a target's import may raise anything: a LoadError names it
            raise _import_failure(exc, filename, module_name) from None
    source = f"{module_name}:{function}" if function else module_name
    picked = function if protocol is None else async_function(function, protocol, order)
    target = make_target(module, picked, module_name, source, space, module_name)
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


__all__ = ["LoadError", "Target", "load_target", "exec_source"]

