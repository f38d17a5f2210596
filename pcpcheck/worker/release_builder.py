"""The release's PCPManager built as its model runner builds it (semantics section 11): through
the manager file's own `maybe_build_pcp_manager(...)`, given what the model runner's call of it
passes (read from `model_runner.py` by AST), so the constructor's keywords, and what they are
read from (the parallel and scheduler configuration, the PCP and DCP groups), are the release's
own, never a name pcpcheck remembers (every release 0.26.0-0.34.0 has both). A tree without
that builder, or whose model runner does not call it, is built by pcpcheck's call of
`PCPManager(...)`, and the report says so.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable

from pcpcheck.shared.errors import InterfaceDrift
from pcpcheck.worker.release_calls import callee

BUILDER = "maybe_build_pcp_manager"
# what pcpcheck gives each parameter the model runner may pass (the regime's configuration, the
# rank's device, a text model, the step's block tables, the release's manager class; the model
# runner's request states none: only a partition_batch pcpcheck does not run reads them, 0.26-0.29)
GIVEN = ("vllm_config", "device", "supports_mm_inputs", "block_tables", "cls", "req_states")
REQUEST_STATES = "req_states"


@dataclasses.dataclass(frozen=True)
class ManagerBuilder:
    build: Callable  # the manager file's maybe_build_pcp_manager
    passed: tuple[str, ...]  # its parameters the model runner's call passes
    sites: tuple[str, ...]  # `file:line` of those calls

    @property
    def takes_block_tables(self) -> bool:
        """Whether the block tables are given at construction; else the model runner sets them
        after (`set_block_tables`, 0.33 on)."""
        return "block_tables" in self.passed

    def note(self) -> str:
        return (f"PCPManager built by its {BUILDER}({', '.join(self.passed)}) as the model "
                f"runner calls it ({', '.join(self.sites)}), on each step's configuration: the "
                "regime's parallel configuration, the scheduler's sizes the step's (max_num_seqs, "
                "max_num_batched_tokens), the rank's place in its PCP and DCP groups"
                + (f", {REQUEST_STATES} None (only partition_batch reads them)"
                   if REQUEST_STATES in self.passed else "")
                + ("" if self.takes_block_tables else
                   "; the block tables set after it, by its set_block_tables"))


def manager_builder(source, manager_module, runner_path: str, partitions: bool
                    ) -> ManagerBuilder | None:
    """The model runner's way of building the manager, where the manager file has the builder
    and the model runner calls it; None where not. InterfaceDrift where the call passes a
    parameter pcpcheck cannot give (the request states where its partition_batch runs:
    `partitions`), or leaves out one the builder requires, or two calls differ."""
    build = getattr(manager_module, BUILDER, None)
    if not callable(build) or not source.has(runner_path):
        return None
    try:
        tree = ast.parse(source.read(runner_path))
    except SyntaxError:
        return None  # the loader reports a file that does not parse where it runs
    parameters = inspect.signature(build).parameters
    names = list(parameters)
    found: dict[tuple[str, ...], list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or callee(node) != BUILDER:
            continue
        site = f"{runner_path}:{node.lineno}"
        if any(isinstance(a, ast.Starred) for a in node.args) or len(node.args) > len(names) \
                or any(k.arg is None for k in node.keywords):
            raise InterfaceDrift(f"{BUILDER}: its caller ({site}) passes arguments pcpcheck "
                                 "cannot name against its signature")
        passed = (*names[:len(node.args)], *(k.arg for k in node.keywords if k.arg))
        for name in passed:
            if name not in GIVEN or (name == REQUEST_STATES and partitions):
                raise InterfaceDrift(f"{BUILDER}: its caller ({site}) passes {name!r}, which "
                                     "pcpcheck does not know how to give")
        for name, parameter in parameters.items():
            if name not in passed and parameter.default is inspect.Parameter.empty:
                raise InterfaceDrift(f"{BUILDER}: its parameter {name!r} has no default and "
                                     f"its caller ({site}) does not pass it")
        found.setdefault(tuple(passed), []).append(site)
    if not found:
        return None
    if len(found) > 1:
        raise InterfaceDrift(f"{BUILDER}: its callers pass different parameters ("
                             + "; ".join(f"{', '.join(s)}: {', '.join(p)}"
                                         for p, s in found.items()) + ")")
    ((passed, sites),) = found.items()
    return ManagerBuilder(build, passed, tuple(sites))


__all__ = ["BUILDER", "ManagerBuilder", "manager_builder"]
