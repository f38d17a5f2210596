"""Standalone pytest reproducers: one file per violation, replaying the exact minimal case."""

from __future__ import annotations

import os
import re

from pcpcheck.cases import describe
from pcpcheck.check import Observation

_TEMPLATE = '''"""pcpcheck reproducer: {invariant} violated in regime {regime}.

{summary}

Replays the shrunk case against the target and fails while the bug is there:
    python -m pytest {filename}
Needs only pcpcheck installed.
"""

from pcpcheck.api import replay

TARGET = {target!r}
FUNCTION = {function!r}
CASE = {case!r}


def test_{test_name}():
    verdict = replay(TARGET, CASE, function=FUNCTION)
    assert verdict.holds, verdict.report
'''


def write_reproducer(directory: str, target, regime: str, observation: Observation,
                     function: str | None = None) -> str:
    """Write the reproducer for one counterexample; return its path."""
    os.makedirs(directory, exist_ok=True)
    first = observation.violations[0]
    stem = re.sub(r"\W+", "_", os.path.splitext(os.path.basename(target.source))[0]).strip("_")
    test_name = re.sub(r"\W+", "_", f"{first.invariant}_{regime}").lower()
    filename = f"test_repro_{stem}_{test_name}.py"
    source = target.source
    if os.path.exists(source):  # a file target: absolute, so the reproducer runs from anywhere
        source = os.path.abspath(source)
    text = _TEMPLATE.format(invariant=first.invariant, regime=regime, filename=filename,
                            summary=f"Case: {describe(observation.prepared.case)}",
                            target=source, function=function,
                            case=observation.prepared.case.to_json(), test_name=test_name)
    path = os.path.join(directory, filename)
    with open(path, "w") as handle:
        handle.write(text)
    return path
