"""triton's CPU interpreter as a release's kernels run in it (pcpcheck.worker.release_kernels):
what pcpcheck changes about it, each change either one the report lists under "adapted"
(`MASK_CAST`) or one that leaves every value a kernel computes as triton's own interpreter
computes it, done once per worker process by `adapt(interpreter, tl)`.

- Masks that reach the interpreter as int8 (`~sharded | is_local` over a bool tensor) are cast
  to bool in its masked load and store, which refuse them otherwise (`MASK_CAST`, adapted).
- Its language patches (`_patch_lang`, per launch and per jit-helper call, finding triton's
  builtins with inspect.getmembers each time) are found once, replayed per launch and restored
  after it.
- Its int32 overflow checks are skipped where its device_assert asserts nothing.
- Its triton-type -> numpy-dtype map is kept per type.
- Each builtin's type-level work is done once per signature (`Plans`): a kernel's programs call
  the same builtins on the same types over and over, and the interpreter spends most of a
  launch in TritonSemantic (type checks, promotions, broadcasts, casts, constants) and in
  building triton's type and tensor objects, not on the data.

How a plan stays exact. In the interpreter, a builtin (tl.load, tensor.__add__, tl.where, ...)
is Python over TritonSemantic, whose decisions read the arguments' types, the constants given
and the builder's options, and whose values are made only by the builder's methods
(InterpreterBuilder.create_*, binary_op, get_int32, ...), the only place numpy touches the data.
A builtin's first call with a signature (the builtin; per argument a tensor's type, a constant's
class and value, a dtype; which tensor arguments share a handle; the builder's options) runs as
triton's own and records the builder calls it makes, each argument either an argument's handle,
an earlier call's result or a constant; later calls with that signature make the same builder
calls on their own handles, in the same order, and wrap the result as the first call did. A
call is not planned, and runs as triton's own every time, where the signature holds anything
else (a tuple, a descriptor, a function), where a builder call is given a handle, tensor or
array that is none of those, where the result is not a tensor of one of those handles, an
argument, None or a constant, or where anything reads a handle's data outside a builder call
(a builtin deciding on values). tests/test_vllm_reuse.py compares planned launches with
triton's own on every kernel the releases ship.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

MASK_CAST = ("triton interpreter: int8 masks (from `~sharded | is_local` over bool tensors) cast "
             "to bool in its masked load/store")
# Plans kept per worker process, all builtins together (a slot kernel needs about 60): past
# this many, all are dropped and made again as calls come.
PLANS_MAX = 20_000


def adapt(interpreter, tl) -> None:
    """Every change of the module docstring, made once per process (each is idempotent)."""
    _cast_masks_to_bool(interpreter)
    _patch_language_once(interpreter, tl)
    _skip_inert_overflow_checks(interpreter, tl)
    _memoize_numpy_dtypes(interpreter)


def _skip_inert_overflow_checks(interpreter, tl) -> None:
    """The interpreter checks every int32 add, sub and mul for overflow (sanitize_overflow:
    both sides cast to int64, the op again, two compares) and hands the result to
    device_assert, which asserts nothing unless its options say debug: the check then has no
    effect but its cost (a quarter of a slot kernel's). Switched off only where this triton's
    device_assert is shown to ignore a false condition (a version that asserts keeps it)."""
    builder = interpreter.interpreter_builder
    try:
        if builder.options.debug or not builder.options.sanitize_overflow:
            return
        false = tl.tensor(interpreter.TensorHandle(np.array([False]), tl.int1), tl.int1)
        interpreter.interpreter_semantic.device_assert(false, "pcpcheck probe", None)
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    except (AttributeError, AssertionError, TypeError):
        return  # not this triton's interpreter, or its device_assert asserts: checks stay


def _memoize_numpy_dtypes(interpreter) -> None:
    """The interpreter maps a triton type to its numpy dtype by building a dict of every type
    on each call (about ten times per op); the answer depends only on the type's class and name
    and, for a block or pointer, its element type's class: kept per those."""
    to_numpy = interpreter._get_np_dtype
    if getattr(to_numpy, "_pcpcheck_memoized", False):
        return
    known: dict[tuple, Any] = {}

    def memoized(tt_dtype):
        try:
            key = (type(tt_dtype), tt_dtype.name, type(getattr(tt_dtype, "element_ty", None)))
        except AttributeError:  # no triton type: triton's own answer (its error)
            return to_numpy(tt_dtype)
        found = known.get(key)
        if found is None:
            found = known[key] = to_numpy(tt_dtype)
        return found

    memoized._pcpcheck_memoized = True  # type: ignore[attr-defined]
    interpreter._get_np_dtype = memoized


def _patch_language_once(interpreter, tl) -> None:
    """triton's interpreter patches triton.language for every kernel launch and every call of a
    jit helper (`_patch_lang`), finding its builtins anew each time (inspect.getmembers over
    the language modules: most of a small launch's CPU). The patches it makes are found once
    per set of language modules a kernel sees, then replayed on each launch and restored after
    it, as before: outside a launch the language stays as triton left it. A helper called
    inside a launch that sees no other language module patches nothing: its patches are on
    already (any other call is triton's own). Each builtin's patch is planned (`Plans`)."""
    if getattr(interpreter, "_pcpcheck_patched_once", False):
        return
    patch_lang = interpreter._patch_lang
    plans = Plans(interpreter, tl)
    found: dict[frozenset[int], Grouped] = {}  # the language modules a kernel sees -> patches
    on: list[frozenset[int]] = []  # the language modules of the replays not restored yet

    class Replayed:
        """One launch's patches on (a module's in one dict update), restored by `restore`."""

        def __init__(self, langs: frozenset[int], patches: Grouped):
            self._langs = langs
            missing = interpreter._MISSING
            self._modules = []
            for names, values in patches.modules:
                self._modules.append((names, {name: names.get(name, missing)
                                              for name in values}))
                names.update(values)
            self._others = [(obj, name, getattr(obj, name, missing))
                            for obj, name, _ in patches.others]
            for obj, name, value in patches.others:
                setattr(obj, name, value)
            on.append(langs)

        def restore(self) -> None:
            missing = interpreter._MISSING
            for obj, name, original in reversed(self._others):
                if original is missing:
                    delattr(obj, name)
                else:
                    setattr(obj, name, original)
            for names, originals in self._modules:
                names.update(originals)
                for name, original in originals.items():
                    if original is missing:
                        del names[name]
            on.remove(self._langs)

    class AlreadyOn:
        def restore(self) -> None:
            pass

    def replayed_patch_lang(fn):
        langs = frozenset(id(value) for value in fn.__globals__.values()
                          if value is tl or value is tl.core)
        if on:  # a jit helper called inside a launch
            return AlreadyOn() if langs and any(langs <= active for active in on) \
                else patch_lang(fn)
        patches = found.get(langs)
        if patches is None:
            scope = patch_lang(fn)  # triton's own: what it patches, with the values it sets
            patched = dict.fromkeys((obj, name) for obj, name, _ in scope._changes)
            patches = Grouped([(obj, name, plans.planned(obj, name, getattr(obj, name)))
                               for obj, name in patched])
            scope.restore()
            found[langs] = patches
        return Replayed(langs, patches)

    interpreter._patch_lang = replayed_patch_lang
    interpreter._pcpcheck_patched_once = True
    interpreter._pcpcheck_plans = plans


class Grouped:
    """A launch's patches (object, name, value), those of plain modules as one dict per module
    (set and restored with one `dict.update`: what setattr on a module does, without a call
    per name), the rest (classes) one by one."""

    def __init__(self, patches: list[tuple[Any, str, Any]]) -> None:
        by_module: dict[int, tuple[dict, dict]] = {}
        self.others: list[tuple[Any, str, Any]] = []
        for obj, name, value in patches:
            if type(obj) is types.ModuleType:
                by_module.setdefault(id(obj), (vars(obj), {}))[1][name] = value
            else:
                self.others.append((obj, name, value))
        self.modules = list(by_module.values())


def _cast_masks_to_bool(interpreter) -> None:
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_pcpcheck_masks_cast", False):
        return
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask):
        if mask.data.dtype == bool:
            return mask
        return interpreter.TensorHandle(mask.data.astype(bool), mask.dtype)

    builder.create_masked_load = lambda self, ptrs, mask, other, cache, volatile: load(
        self, ptrs, as_bool(mask), other, cache, volatile)
    builder.create_masked_store = lambda self, ptrs, value, mask, cache: store(
        self, ptrs, value, as_bool(mask), cache)
    builder._pcpcheck_masks_cast = True


# ---------------------------------------------------------------------------------------------
# Plans: a builtin's type-level work once per signature


class _Unplanned(Exception):
    """This call (or signature) runs as triton's own."""


_UNPLANNED: Any = object()  # a signature recorded as not plannable
_TENSOR_FIELDS = frozenset({"handle", "shape", "numel", "type", "dtype"})


def _changed(was: dict, now: dict) -> bool:
    """Whether a dict of attributes differs from its earlier copy (a value replaced, added or
    removed: compared by identity, never by value)."""
    return was.keys() != now.keys() or any(now[key] is not value for key, value in was.items())


def _shared(handles: list) -> tuple[int, ...]:
    """Per handle, the first position holding that same handle."""
    if len(handles) == 2:
        return (0, 0) if handles[0] is handles[1] else (0, 1)
    first: list[int] = []
    for index, handle in enumerate(handles):
        first.append(next(i for i in range(index + 1) if handles[i] is handle))
    return tuple(first)


class Plans:
    """The builtins' plans of one interpreter (see the module docstring). `planned(patch)`
    wraps one of the interpreter's language patches: a builtin's (the lambda `_patch_attr`
    makes, calling the builtin with `_semantic=interpreter_semantic`) is planned, any other
    patch is returned as it is."""

    def __init__(self, interpreter, tl) -> None:
        self._interpreter = interpreter
        self._tl = tl
        self._builder = interpreter.interpreter_builder
        self._handle_class = interpreter.TensorHandle
        kind = type(self._builder)
        self._methods = [name for name in dir(kind) if not name.startswith("_")
                         and callable(getattr(kind, name))
                         and name not in ("set_grid_idx", "set_grid_dim")]
        # builder methods that make a triton type (or no cache policy) from their arguments
        # alone: their results are constants of a plan, never called again
        self._pure = {name for name in self._methods
                      if name.startswith("get_") and name.endswith("_ty")} | {"get_cache_policy"}
        self._types: dict[int, tuple[Any, int]] = {}  # id(type) -> (type, its number)
        self._numbers: dict[tuple, int] = {}  # a type's structure -> its number
        self._options: dict[int, Any] = {}  # id -> the builder's options objects seen (kept)
        self._tables: list[dict] = []  # every planned builtin's plans
        self._count = 0
        self._state = [False, False]  # whether a call is being recorded; whether plans are off
        self.recorded = 0  # calls that made a plan (or found their signature not plannable)
        self._fast_tensors = self._tensor_fields_are(_TENSOR_FIELDS)

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """Every builtin call within runs as triton's own (tests compare the two)."""
        was = self._state[1]
        self._state[1] = True
        try:
            yield
        finally:
            self._state[1] = was

    def _tensor_fields_are(self, fields: frozenset[str]) -> bool:
        """Whether a triton tensor is exactly these attributes (then a plan's result is made by
        copying them from the recorded one's, its own handle set; else by tl.tensor itself)."""
        tl = self._tl
        handle = self._handle_class(np.zeros(2, dtype=np.int32), tl.int32)
        made = tl.core.tensor(handle, tl.block_type(tl.int32, [2]))
        return set(vars(made)) == fields

    # --- wrapping -------------------------------------------------------------------------

    def planned(self, obj, name: str, patch):
        """The interpreter's patch of `obj.name`, planned where it is a builtin's; the tensor
        truth as `_truth` says; any other patch itself."""
        if obj is self._tl.core.tensor and name == "__bool__":
            return self._truth(patch)
        member = (getattr(patch, "__kwdefaults__", None) or {}).get("member")
        if getattr(patch, "__name__", "") != "<lambda>" or member is None \
                or not self._tl.core.is_builtin(member):
            return patch
        table: dict[tuple, Any] = {}
        self._tables.append(table)
        # the hot path, per builtin call: everything it reads bound here
        tensor, builder, state = self._tl.core.tensor, self._builder, self._state
        options_seen, types = self._options, self._types
        type_number, constant, shared = self._type_number, self._constant, _shared

        def call(*args, **kwargs):
            if state[0] or state[1]:  # inside a call being recorded (part of its plan), or off
                return patch(*args, **kwargs)
            if kwargs:
                names = tuple(sorted(kwargs))
                values = args + tuple(kwargs[name] for name in names)
            else:
                names, values = (), args
            options = builder.options
            if options_seen.get(id(options)) is not options:
                options_seen[id(options)] = options  # kept: its id stays its own
            key = [names, id(options)]
            handles = []
            try:
                for value in values:
                    kind = value.__class__
                    if kind is tensor:
                        kind = value.type
                        found = types.get(id(kind))
                        key.append(found[1] if found is not None and found[0] is kind
                                   else type_number(kind))
                        value = value.handle
                        key.append(value.data.shape)  # the truth of a tensor reads its size
                        handles.append(value)
                    elif kind is int or kind is bool:
                        key.append((kind, value))
                    else:
                        key.append(constant(value))
            except _Unplanned:
                return patch(*args, **kwargs)
            if len(handles) > 1:  # which tensor arguments share a handle
                key.append(shared(handles))
            plan = table.get(tuple(key))
            if plan is None:
                return self._record(patch, args, kwargs, values, tuple(key), table)
            if plan is _UNPLANNED:
                return patch(*args, **kwargs)
            return plan(*values)

        call.__name__ = call.__qualname__ = f"planned_{getattr(member, '__name__', 'builtin')}"
        return call

    def _truth(self, patch):
        """The interpreter's truth of a tensor (`_get_bool`: a one-element tensor's value, any
        other tensor true, whatever its values), asked by a builtin being recorded (tl.load asks
        whether `other` is given): answered from the size of its data where that is more than
        one element, so that the plan depends on no value (a plan's signature holds its
        arguments' data shapes); a one-element tensor's value is read (the call is not
        planned). Only where this triton's truth is shown to follow that rule; else its own."""
        tl, handle = self._tl, self._handle_class

        def probe(values: list[int]) -> bool:
            data = np.array(values, dtype=np.int32)
            return bool(patch(tl.core.tensor(handle(data, tl.int32),
                                             tl.block_type(tl.int32, [len(values)]))))

        try:
            rule = probe([0, 0]) and probe([1, 0]) and not probe([0]) and probe([1])
        except Exception:  # noqa: BLE001 - not this triton's rule: its own truth, unplanned
            rule = False
        if not rule:
            return patch
        state = self._state

        def truth(tensor):
            if state[0] and vars(tensor.handle)["data"].size != 1:
                return True
            return patch(tensor)

        return truth

    # --- signatures -----------------------------------------------------------------------

    def _constant(self, value) -> tuple:
        kind = value.__class__
        if kind is int or kind is bool or kind is str or value is None:
            return (kind, value)
        if kind is float:
            return (kind, value.hex())  # -0.0 and 0.0 apart
        core = self._tl.core
        if kind is core.constexpr:
            return ("constexpr", self._constant(value.value))
        if isinstance(value, core.dtype):
            return ("dtype", self._type_number(value))
        raise _Unplanned

    def _type_number(self, kind) -> int:
        """A number per triton type structure (equal types, equal numbers)."""
        found = self._types.get(id(kind))
        if found is not None and found[0] is kind:
            return found[1]
        structure = self._structure(kind)
        number = self._numbers.setdefault(structure, len(self._numbers))
        if len(self._types) > 4096:
            self._types.clear()
        self._types[id(kind)] = (kind, number)
        return number

    def _structure(self, kind) -> tuple:
        core = self._tl.core
        cls = kind.__class__
        if cls is core.block_type:
            return ("block", tuple(kind.shape), self._structure(kind.element_ty))
        if cls is core.pointer_type:
            return ("pointer", self._structure(kind.element_ty), kind.address_space, kind.const)
        if cls is core.dtype:
            return ("scalar", kind.name)
        raise _Unplanned  # a tuple, descriptor or other type: triton's own

    # --- recording ------------------------------------------------------------------------

    def _record(self, patch: Callable, args: tuple, kwargs: dict, values: tuple, key: tuple,
                table: dict) -> Any:
        """The call as triton's own, its builder calls recorded; its plan (or _UNPLANNED) kept."""
        tensor = self._tl.core.tensor
        where: dict[int, tuple[str, int]] = {}  # id(handle or result) -> ("arg"|"call", index)
        for index, value in enumerate(values):
            if value.__class__ is tensor:
                where.setdefault(id(value.handle), ("arg", index))
        calls: list[tuple[Callable, list, dict]] = []
        kept: list[Any] = []  # every builder result, alive while ids are compared
        problems: list[str] = []
        depth = [0]

        def ref(value):
            found = where.get(id(value))
            if found is not None:
                return found
            if self._holds_data(value):
                raise _Unplanned
            return ("constant", value)

        def recorder(name: str, method):
            pure = name in self._pure

            def recorded(*a, **k):
                if depth[0]:  # a builder method calling another: the outer call is the plan's
                    return method(*a, **k)
                depth[0] += 1
                try:
                    result = method(*a, **k)
                finally:
                    depth[0] -= 1
                kept.append(result)
                if not pure:
                    try:
                        calls.append((method, [ref(x) for x in a],
                                      {n: ref(x) for n, x in k.items()}))
                    except _Unplanned:
                        problems.append(name)
                    where[id(result)] = ("call", len(calls) - 1)
                return result
            return recorded

        builder, handle_class = self._builder, self._handle_class

        def read_data(handle):
            if not depth[0]:
                problems.append("data")  # a value read outside the builder
            return handle.__dict__["data"]

        def write_data(handle, data):
            handle.__dict__["data"] = data

        # what the call could change of its arguments besides through the builder: a plan
        # would not change it again
        before = [(dict(vars(value)), dict(value.handle.attr)) for value in values
                  if value.__class__ is tensor]
        for name in self._methods:
            setattr(builder, name, recorder(name, getattr(builder, name)))
        handle_class.data = property(read_data, write_data)
        self._state[0] = True
        try:
            result = patch(*args, **kwargs)
        finally:
            self._state[0] = False
            del handle_class.data
            for name in self._methods:
                delattr(builder, name)
        self.recorded += 1
        after = [(vars(value), value.handle.attr) for value in values if value.__class__ is tensor]
        if any(_changed(was, now) for pair in zip(before, after) for was, now in zip(*pair)):
            problems.append("an argument changed")
        plan = _UNPLANNED
        if not problems:
            try:
                plan = self._compile(calls, self._result(result, values, where), len(values))
            except _Unplanned:
                pass
        self._count += 1
        if self._count > PLANS_MAX:
            for each in self._tables:
                each.clear()
            self._count = 0
        table[key] = plan
        return result

    def _holds_data(self, value) -> bool:
        """Whether `value` is, or holds, a handle, tensor or array (never a plan's constant)."""
        if isinstance(value, (self._handle_class, self._tl.core.base_value, np.ndarray)):
            return not isinstance(value, self._tl.core.constexpr)
        if isinstance(value, (list, tuple)):
            return any(self._holds_data(item) for item in value)
        if isinstance(value, dict):
            return any(self._holds_data(item) for item in value.values())
        return False

    def _result(self, result, values, where) -> tuple:
        core = self._tl.core
        for index, value in enumerate(values):
            if result is value and value.__class__ in (core.tensor, core.constexpr):
                return ("arg", index)
        kind = result.__class__
        if kind is core.tensor:
            made = where.get(id(result.handle))
            if made is None or set(vars(result)) != _TENSOR_FIELDS:
                raise _Unplanned
            return ("tensor", made, {k: v for k, v in vars(result).items() if k != "handle"})
        if result is None or kind in (int, bool, str, core.constexpr):
            return ("constant", result)
        raise _Unplanned

    def _compile(self, calls, result: tuple, arity: int) -> Callable:
        """The plan as one Python function of the call's values (positional, then keywords by
        name): its builder calls in order, then its result."""
        env: dict[str, Any] = {"new": object.__new__, "tensor": self._tl.core.tensor}

        def source(ref: tuple) -> str:
            kind, what = ref
            if kind == "arg":
                return f"a{what}.handle"
            if kind == "call":
                return f"v{what}"
            name = f"c{len(env)}"
            env[name] = what
            return name

        lines = [f"def plan({', '.join(f'a{i}' for i in range(arity))}):"]
        for index, (method, args, kwargs) in enumerate(calls):
            env[f"m{index}"] = method
            given = [source(ref) for ref in args] + [f"{n}={source(ref)}"
                                                      for n, ref in kwargs.items()]
            lines.append(f"    v{index} = m{index}({', '.join(given)})")
        if result[0] == "arg":
            lines.append(f"    return a{result[1]}")
        elif result[0] == "constant":
            env["result"] = result[1]
            lines.append("    return result")
        elif self._fast_tensors:
            env["fields"] = result[2]
            lines += ["    made = new(tensor)", "    made.__dict__.update(fields)",
                      f"    made.handle = {source(result[1])}", "    return made"]
        else:
            env["kind"] = result[2]["type"]
            lines.append(f"    return tensor({source(result[1])}, kind)")
        # generated from a recording (builder methods and constants held in env), no input text
        exec(compile("\n".join(lines), "<pcpcheck plan>", "exec"), env)
        return env["plan"]


__all__ = ["MASK_CAST", "PLANS_MAX", "Plans", "adapt"]
