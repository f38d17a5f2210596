"""Standalone pytest reproducers: one file per violation, replaying the exact minimal case.

A target that is a file or a directory is named relative to the reproducer's own directory, so
the reproducer runs from any working directory; PCPCHECK_TARGET overrides it, so one file can be
pointed at a fixed version."""

from __future__ import annotations

import os
import re

from pcpcheck.shared.case import Case, describe

TARGET_VARIABLE = "PCPCHECK_TARGET"

_TEMPLATE = '''"""pcpcheck reproducer: {invariant} violated in regime {regime}.

{summary}

Replays the shrunk case against the target and fails while the bug is there:
    python -m pytest {filename}
from any directory (a target path is taken relative to this file), or against another version of
the gather:
    {variable}=path/to/fixed/pcp.py python -m pytest {filename}
Needs pcpcheck and pytest installed (pip install pytest: pcpcheck does not bring it).
"""

import os

from pcpcheck.api import replay

TARGET = os.environ.get({variable!r}) or {target}
FUNCTION = {function!r}
CASE = {case!r}


def test_{test_name}():
    verdict = replay(TARGET, CASE, function=FUNCTION)
    assert verdict.holds, verdict.report
'''


def reproducer_target(source: str, directory: str) -> str:
    """The target as a Python expression in a reproducer written into `directory`: a path
    relative to the reproducer's own file, else (impl, module:function, a version) as given."""
    if not os.path.exists(source):
        return repr(source)
    try:
        relative = os.path.relpath(os.path.abspath(source), os.path.abspath(directory))
    except ValueError:  # another drive (Windows): no relative path
        return repr(os.path.abspath(source))
    return f"os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), {relative!r}))"


def write_reproducer(directory: str, source: str, regime: str, invariant: str, case_json: str,
                     function: str | None = None) -> str:
    """Write the reproducer for one counterexample; return its path."""
    os.makedirs(directory, exist_ok=True)
    stem = re.sub(r"\W+", "_", os.path.splitext(os.path.basename(source))[0]).strip("_")
    test_name = re.sub(r"\W+", "_", f"{invariant}_{regime}").lower()
    filename = f"test_repro_{stem}_{test_name}.py"
    text = _TEMPLATE.format(invariant=invariant, regime=regime, filename=filename,
                            summary=f"Case: {describe(Case.from_json(case_json))}",
                            target=reproducer_target(source, directory), function=function,
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
from any directory (a checkout or wheel path is taken relative to this file). Needs pcpcheck and
pytest installed (pip install pytest); the release's wheel is fetched into pcpcheck's cache.
"""

import os

from pcpcheck.api import replay_release

SOURCE = os.environ.get({variable!r}) or {source}
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
                                    variable=TARGET_VARIABLE, source=reproducer_target(source, directory),
                                    case=case_json, test_name=test_name)
    path = os.path.join(directory, filename)
    with open(path, "w") as handle:
        handle.write(text)
    return path
