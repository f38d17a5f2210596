"""The checker survives any target (in-process backend): each hostile target in tests/hostile/
ends in a clear verdict naming the invariant, within a bounded time, and the checker keeps
working for the next check."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from pcpcheck.cli import main
from spec.names import COLLECTIVE, LENGTH, NO_MUTATION, RETURNS

HOSTILE = Path(__file__).parent / "hostile"
BOUND_SECONDS = 120  # far above what any of these takes: a hang, not slowness, trips it

CASES = [
    ("raises_rank0.py", RETURNS),
    ("wrong_types.py", RETURNS),
    ("wrong_shape.py", RETURNS),
    ("sys_exit.py", RETURNS),
    ("fewer_rows.py", LENGTH),
    ("mutates_inputs.py", NO_MUTATION),
    ("extra_collective_rank0.py", COLLECTIVE),
    ("skip_collective_rank1.py", COLLECTIVE),
    ("hang_rank1.py", COLLECTIVE),
]


def _check_bounded(argv):
    """Run the CLI in a watchdog thread: the test fails rather than hangs."""
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("code", main(argv)), daemon=True)
    worker.start()
    worker.join(BOUND_SECONDS)
    assert not worker.is_alive(), f"pcpcheck did not finish within {BOUND_SECONDS} s"
    return result["code"]


@pytest.mark.parametrize("filename, invariant", CASES, ids=[c[0] for c in CASES])
def test_hostile_target_gets_a_clear_verdict(filename, invariant, tmp_path, monkeypatch):
    monkeypatch.setenv("PCPCHECK_HANG_SECONDS", "2")  # hang_rank1: long past the timeout below
    verdict_path = tmp_path / "verdict.json"
    code = _check_bounded(["check", str(HOSTILE / filename), "--regime", "sharded",
                           "--max-examples", "20", "--timeout", "0.5", "--json", str(verdict_path)])
    verdict = json.loads(verdict_path.read_text())
    assert code == 1
    first = verdict["counterexamples"][0]
    assert first["invariant"] == invariant
    assert first["ranks"], "the verdict names the rank(s)"
    # The checker is still healthy: the bundled impl checks clean right after.
    assert _check_bounded(["check", "impl", "--regime", "sharded", "--max-examples", "20"]) == 0


def test_noisy_target_does_not_garble_the_report():
    run = subprocess.run(["pcpcheck", "check", str(HOSTILE / "noisy.py"), "--regime",
                          "replicated", "--max-examples", "30"], capture_output=True, text=True,
                         timeout=BOUND_SECONDS)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "DEBUG rank" not in run.stdout and "WARNING: noisy" not in run.stderr
    assert "every invariant holds" in run.stdout
