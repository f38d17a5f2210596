"""How the release's own layers call its wrappers, read from the tree (semantics section 11):
every call of a wrapper in its callers' files, each argument bound to the wrapper's parameter
by the wrapper's own signature, and traced back to what the caller computes it from.

`wrapper_calls(source, wrappers) -> {wrapper name: WrapperCall}`. An argument is traced through
the caller's own code: `self.x` to the `self.x = ...` its class assigns, a parameter of the
calling function to what that function's callers in the same file pass (the indexer's
`sparse_attn_indexer`, reached through `torch.ops.vllm`), a local to its assignment. Where the
trace ends in the parallel configuration (`parallel_config.<name>`, `....parallel_config.<name>`),
the argument is the caller's configuration expression: `WrapperCall.config` maps the parameter
to it, evaluated per step on the regime's ParallelConfig (`evaluate`). Every other argument is
data the step supplies (the K/V rows, the slot map, `num_decode_tokens`), passed as the caller
passes it: by position or by keyword. The call sites must agree; where they do not, the
release's wrapper cannot be called as its callers do: InterfaceDrift names the wrapper and the
parameter. A wrapper no layer calls is left out: no step enters through it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass, field

from pcpcheck.shared.errors import InterfaceDrift

# The wrappers' callers (semantics sections 10-11): the MLA attention layer and the sparse
# indexer, in every release 0.26.0-0.34.0.
CALLER_FILES = ("vllm/model_executor/layers/attention/mla_attention.py",
                "vllm/model_executor/layers/sparse_attn_indexer.py")
CONFIG = "parallel_config"  # the name an expression of the parallel configuration reads


@dataclass
class WrapperCall:
    """How the callers call one wrapper: the parameters they pass positionally (in order) and by
    keyword, and for those settled by the configuration, the caller's expression of it. `data`:
    the others, in the wrapper's order (its K/V tensors, then the slot map, then
    `num_decode_tokens`: semantics section 11); `shard`: the parameter the wrapper hands on as
    the gather's `shard_decode_requests` (None where it hands on none)."""

    wrapper: str
    positional: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    config: dict[str, str] = field(default_factory=dict)  # parameter -> expression source
    sites: tuple[str, ...] = ()  # "relpath:line" of each call site
    data: tuple[str, ...] = ()
    shard: str | None = None

    def arguments(self, data: tuple, configured: dict[str, object]) -> tuple[list, dict]:
        """(args, kwargs) of the call the callers make: `data` for the data parameters, the
        configuration's values (`evaluate`) for the rest."""
        values = {**dict(zip(self.data, data, strict=True)), **configured}
        return [values[p] for p in self.positional], {p: values[p] for p in self.keywords}

    def evaluate(self, parallel_config) -> dict[str, object]:
        """Each configuration parameter's value on `parallel_config` (the regime's): the tree's
        own expression of it, compiled once per load."""
        return {parameter: eval(code, {CONFIG: parallel_config})
                for parameter, code in self._compiled.items()}

    @functools.cached_property
    def _compiled(self) -> dict[str, types.CodeType]:
        return {parameter: compile(expression, "<caller>", "eval")
                for parameter, expression in self.config.items()}


def gather_shard(module_source: str, wrapper: str, gather: str, shard: str) -> str | None:
    """The parameter of `wrapper` it passes on as the gather's `shard` parameter (the gather's
    contract, semantics section 5: its fourth), read from the wrapper's own code."""
    for function in ast.walk(ast.parse(module_source)):
        if not isinstance(function, ast.FunctionDef) or function.name != wrapper:
            continue
        parameters = {a.arg for a in (*function.args.posonlyargs, *function.args.args,
                                      *function.args.kwonlyargs)}
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and callee(node) == gather:
                passed = next((k.value for k in node.keywords if k.arg == shard),
                              node.args[3] if len(node.args) > 3 else None)
                if isinstance(passed, ast.Name) and passed.id in parameters:
                    return passed.id
    return None


def wrapper_calls(source, gather_path: str, wrappers: dict[str, Callable],
                  data_counts: dict[str, int], gather: str, shard: str) -> dict[str, WrapperCall]:
    """The call of each wrapper in `wrappers` (name -> the release's function, defined in
    `gather_path`) its callers make; `data_counts`: how many data arguments each takes (its
    tensors, the slot map, nd)."""
    found: dict[str, list[tuple[str, int, dict, dict]]] = {name: [] for name in wrappers}
    for relpath in CALLER_FILES:
        if not source.has(relpath):
            continue
        tree = ast.parse(source.read(relpath))
        for node in ast.walk(tree):
            name = callee(node) if isinstance(node, ast.Call) else None
            if name in wrappers:
                assert isinstance(node, ast.Call) and name is not None
                bound, config = _bind(node, wrappers[name], tree)
                found[name].append((relpath, node.lineno, bound, config))
    calls = {}
    for name, sites in found.items():
        if not sites:  # no layer calls it: no step enters through it (load_release says so)
            continue
        call = _agreed(name, sites, wrappers[name])
        call.data = tuple(p for p in inspect.signature(wrappers[name]).parameters
                          if p in (*call.positional, *call.keywords) and p not in call.config)
        if len(call.data) != data_counts[name]:
            extra = [p for p in call.data[data_counts[name]:]] or ["(too few)"]
            raise InterfaceDrift(f"{name}: its callers ({', '.join(call.sites)}) pass "
                                 f"{', '.join(call.data)}, and nothing in the caller settles "
                                 f"{extra[0]} (not data pcpcheck supplies, nor read from the "
                                 "configuration)")
        call.shard = gather_shard(source.read(gather_path), name, gather, shard)
        calls[name] = call
    return calls


def callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(
        func, ast.Attribute) else None


def _bind(call: ast.Call, function: Callable, tree: ast.Module) -> tuple[dict, dict]:
    """(parameter -> "positional k" or "keyword", parameter -> configuration expression)."""
    parameters = list(inspect.signature(function).parameters)
    bound: dict[str, str] = {}
    expressions: dict[str, ast.expr] = {}
    for k, argument in enumerate(call.args):
        if isinstance(argument, ast.Starred) or k >= len(parameters):
            raise InterfaceDrift(f"{function.__name__}: a caller passes {ast.unparse(argument)} "
                                 "where its signature has no positional parameter")
        bound[parameters[k]] = f"positional {k}"
        expressions[parameters[k]] = argument
    for keyword in call.keywords:
        if keyword.arg is None or keyword.arg not in parameters:
            raise InterfaceDrift(f"{function.__name__}: a caller passes "
                                 f"{keyword.arg or '**'}=, which its signature lacks")
        bound[keyword.arg] = "keyword"
        expressions[keyword.arg] = keyword.value
    config = {}
    for parameter, expression in expressions.items():
        traced = _trace(expression, call, tree, depth=3)
        if traced is not None:
            config[parameter] = traced
    return bound, config


def _trace(expression: ast.expr, at: ast.AST, tree: ast.Module, depth: int) -> str | None:
    """The configuration expression `expression` (at node `at`) is computed from, else None."""
    if depth < 0:
        return None
    if _reads_config(expression):
        return ast.unparse(_rooted(expression))
    if isinstance(expression, ast.Attribute) and isinstance(expression.value, ast.Name):
        return _one({_trace(assigned, assigned, tree, depth - 1)
                     for assigned in _assignments(tree, expression.value.id, expression.attr)})
    if isinstance(expression, ast.Name):
        function = _enclosing(tree, at)
        if function is None:
            return None
        local = _local_assignment(function, expression.id)
        if local is not None:
            return _trace(local, local, tree, depth - 1)
        names = [a.arg for a in (*function.args.posonlyargs, *function.args.args,
                                 *function.args.kwonlyargs)]
        if expression.id not in names:
            return None
        return _one({_trace(passed, passed, tree, depth - 1)
                     for passed in _passed(tree, function.name, names.index(expression.id),
                                           expression.id)})
    return None


def _one(traced: set[str | None]) -> str | None:
    """The configuration expression every trace agrees on, else None."""
    return traced.pop() if len(traced) == 1 else None


def _reads_config(expression: ast.expr) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == CONFIG
               or isinstance(node, ast.Name) and node.id == CONFIG
               for node in ast.walk(expression))


def _rooted(expression: ast.expr) -> ast.expr:
    """`expression` with every `<anything>.parallel_config` made the name `parallel_config`."""
    class Root(ast.NodeTransformer):
        def visit_Attribute(self, node):
            if node.attr == CONFIG:
                return ast.Name(CONFIG, ast.Load())
            return self.generic_visit(node)
    return ast.fix_missing_locations(Root().visit(ast.parse(ast.unparse(expression), mode="eval")).body)


def _assignments(tree: ast.Module, owner: str, attribute: str) -> list[ast.expr]:
    """The values of the file's assignments `owner.attribute = value` (`self.x = ...`)."""
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Attribute)
            and target.attr == attribute and isinstance(target.value, ast.Name)
            and target.value.id in (owner, "self")]


def _enclosing(tree: ast.Module, node: ast.AST) -> ast.FunctionDef | None:
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and any(child is node
                                                         for child in ast.walk(function)):
            inner = _enclosing_in(function, node)
            return inner or function
    return None


def _enclosing_in(function: ast.FunctionDef, node: ast.AST) -> ast.FunctionDef | None:
    for child in ast.walk(function):
        if child is not function and isinstance(child, ast.FunctionDef) and any(
                grandchild is node for grandchild in ast.walk(child)):
            return _enclosing_in(child, node) or child
    return None


def _local_assignment(function: ast.FunctionDef, name: str) -> ast.expr | None:
    values = [node.value for node in ast.walk(function) if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name) and target.id == name]
    return values[0] if len(values) == 1 else None


def _passed(tree: ast.Module, function: str, index: int, name: str) -> list[ast.expr]:
    """What the file's calls of `function` pass for its parameter `name` (position `index`)."""
    passed = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and callee(node) == function:
            keyword = next((k.value for k in node.keywords if k.arg == name), None)
            if keyword is not None:
                passed.append(keyword)
            elif index < len(node.args):
                passed.append(node.args[index])
    return passed


def _agreed(name: str, sites: list[tuple[str, int, dict, dict]], function: Callable) -> WrapperCall:
    shapes = {(tuple(sorted(bound.items())), tuple(sorted(config.items())))
              for _, _, bound, config in sites}
    if len(shapes) > 1:
        where = ", ".join(f"{relpath}:{line}" for relpath, line, _, _ in sites)
        raise InterfaceDrift(f"{name}: its callers ({where}) call it differently: pcpcheck "
                             "cannot tell which call a step makes")
    _, _, bound, config = sites[0]
    positional = tuple(sorted((p for p, how in bound.items() if how != "keyword"),
                              key=lambda p: int(bound[p].split()[1])))
    return WrapperCall(wrapper=name, positional=positional,
                       keywords=tuple(p for p, how in bound.items() if how == "keyword"),
                       config=config, sites=tuple(f"{r}:{line}" for r, line, _, _ in sites))


__all__ = ["WrapperCall", "wrapper_calls"]
