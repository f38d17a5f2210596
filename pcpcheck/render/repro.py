"""Standalone pytest reproducers: one file per violation, replaying the exact minimal case.

The target is named as given (a path relative to the working directory stays relative), and
PCPCHECK_TARGET overrides it, so one file can be pointed at a fixed version."""

from __future__ import annotations

import os
import re

from pcpcheck.shared.case import Case, describe

TARGET_VARIABLE = "PCPCHECK_TARGET"

_TEMPLATE = '''"""pcpcheck reproducer: {invariant} violated in regime {regime}.

{summary}

Replays the shrunk case against the target and fails while the bug is there:
    python -m pytest {filename}
from the directory pcpcheck ran in (a relative TARGET is taken from there), or against another
version of the gather:
    {variable}=path/to/fixed/pcp.py python -m pytest {filename}
Needs only pcpcheck installed.
"""

import os

from pcpcheck.api import replay

TARGET = os.environ.get({variable!r}) or {target!r}
FUNCTION = {function!r}
CASE = {case!r}


def test_{test_name}():
    verdict = replay(TARGET, CASE, function=FUNCTION)
    assert verdict.holds, verdict.report
'''


def reproducer_target(source: str) -> str:
    """A file target relative to the working directory (when below it), else as given."""
    if not os.path.exists(source):
        return source  # impl, module:function
    relative = os.path.relpath(os.path.abspath(source))
    return os.path.abspath(source) if relative.startswith(os.pardir) else relative


def write_reproducer(directory: str, source: str, regime: str, invariant: str, case_json: str,
                     function: str | None = None) -> str:
    """Write the reproducer for one counterexample; return its path."""
    os.makedirs(directory, exist_ok=True)
    stem = re.sub(r"\W+", "_", os.path.splitext(os.path.basename(source))[0]).strip("_")
    test_name = re.sub(r"\W+", "_", f"{invariant}_{regime}").lower()
    filename = f"test_repro_{stem}_{test_name}.py"
    text = _TEMPLATE.format(invariant=invariant, regime=regime, filename=filename,
                            summary=f"Case: {describe(Case.from_json(case_json))}",
                            target=reproducer_target(source), function=function,
                            variable=TARGET_VARIABLE, case=case_json, test_name=test_name)
    path = os.path.join(directory, filename)
    with open(path, "w") as handle:
        handle.write(text)
    return path


def write_reproducers(directory: str, result) -> list[str]:
    """One reproducer per counterexample of a CheckResult."""
    return [write_reproducer(directory, result.target, c.regime, c.invariant, c.case,
                             result.options.function) for c in result.counterexamples]


_RELEASE_TEMPLATE = '''"""pcpcheck reproducer: {invariant} violated by a recorded step of {release}.

{summary}

Replays the shrunk step through the release's own PCP path on every rank and fails while the
bug is there:
    python -m pytest {filename}
or against another release (a version, a wheel or a checkout):
    {variable}=0.33.0 python -m pytest {filename}
Needs only pcpcheck installed (the release's wheel is fetched into pcpcheck's cache).
"""

import os

from pcpcheck.api import replay_release

SOURCE = os.environ.get({variable!r}) or {source!r}
CASE = {case!r}


def test_{test_name}():
    result = replay_release(SOURCE, CASE)
    assert result.holds, result.counterexamples[0].report
'''


def write_release_reproducer(directory: str, source: str, release: str, step: int,
                             invariant: str, case_json: str) -> str:
    """Write the reproducer of a recorded step's (shrunk) violation; return its path."""
    os.makedirs(directory, exist_ok=True)
    test_name = re.sub(r"\W+", "_", f"{invariant}_step_{step}").lower()
    stem = re.sub(r"\W+", "_", release)
    release = f"vLLM {release}"
    filename = f"test_repro_vllm_{stem}_{test_name}.py"
    text = _RELEASE_TEMPLATE.format(invariant=invariant, release=release, filename=filename,
                                    summary=f"Step: {describe(Case.from_json(case_json))}",
                                    variable=TARGET_VARIABLE, source=reproducer_target(source),
                                    case=case_json, test_name=test_name)
    path = os.path.join(directory, filename)
    with open(path, "w") as handle:
        handle.write(text)
    return path
