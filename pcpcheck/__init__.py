"""pcpcheck: holds an implementation of vLLM's context-parallel KV-cache gather to the spec.

    import pcpcheck
    result = pcpcheck.check("path/to/pcp.py", regimes=("sharded",), budget_s=60)
    assert result.holds, [c.report for c in result.new_violations]
    release = pcpcheck.check_release("0.33.0")  # a vLLM release's own PCP path (pcpcheck vllm)

The public surface is what this module exports; everything else may move. Names load on first
use, so importing the package (as pytest does for the plugin) costs nothing.
"""

import sys
import types

_EXPORTS = {
    "check": "pcpcheck.api",
    "replay": "pcpcheck.api",
    "check_release": "pcpcheck.api",
    "ReleaseRecord": "pcpcheck.api",
    "diff": "pcpcheck.diff",
    "CheckResult": "pcpcheck.api",
    "Counterexample": "pcpcheck.api",
    "RegimeSummary": "pcpcheck.api",
    "Verdict": "pcpcheck.api",
    "DiffResult": "pcpcheck.diff",
    "UsageError": "pcpcheck.api",
    "LoadError": "pcpcheck.loader",
    "CheckerError": "pcpcheck.engine",
    "WorkerError": "pcpcheck.backends.base",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pcpcheck' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _Package(type(sys.modules[__name__])):
    """`pcpcheck.check` is the API function, although a submodule `pcpcheck.check` (the judging
    of one case) exists: importing that submodule would bind the package attribute to it, so
    the attribute ignores that binding. The submodule stays importable by its full name
    (`from pcpcheck.check import Observation`)."""

    @property
    def check(self):
        return __getattr__("check")

    @check.setter
    def check(self, value):
        if not isinstance(value, types.ModuleType):
            globals()["check"] = value


sys.modules[__name__].__class__ = _Package
