"""pcpcheck: holds an implementation of vLLM's context-parallel KV-cache gather to the spec.

    import pcpcheck
    result = pcpcheck.check("path/to/pcp.py", regimes=("sharded",), budget_s=60)
    assert result.holds, [c.report for c in result.new_violations]
    release = pcpcheck.check_release("0.33.0")  # a vLLM release's own PCP path (pcpcheck vllm)

The public surface is what this module exports; everything else may move. Names load on first
use, so importing the package (as pytest does for the plugin) costs nothing.
"""

_EXPORTS = {
    "check": "pcpcheck.api",
    "check_release": "pcpcheck.api",
    "diff": "pcpcheck.api",
    "diff_trees": "pcpcheck.api",
    "replay": "pcpcheck.api",
    "CheckResult": "pcpcheck.shared.results",
    "Counterexample": "pcpcheck.shared.results",
    "RegimeSummary": "pcpcheck.shared.results",
    "ReleaseRecord": "pcpcheck.shared.results",
    "DiffResult": "pcpcheck.shared.results",
    "TreeDiffResult": "pcpcheck.shared.results",
    "Verdict": "pcpcheck.shared.results",
    "UsageError": "pcpcheck.shared.errors",
    "LoadError": "pcpcheck.shared.errors",
    "SourceError": "pcpcheck.shared.errors",
    "InterfaceDrift": "pcpcheck.shared.errors",
    "CheckerError": "pcpcheck.shared.errors",
    "WorkerError": "pcpcheck.shared.errors",
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

