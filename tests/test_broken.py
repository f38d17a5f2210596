"""A broken target's verdict comes as fast as a correct one's: a case on which a rank hangs or
dies is evidence at once, its smaller cases are tried in order of size each beside its replay,
so a target that hangs (or crashes) on every call costs two cases a regime; the smallest
hanging step is found where a target hangs only from some size on; a hang that does not come
back is flaky; a slow but correct target holds, and the report gives its time per call; a slow
wrong one gets its verdict without seconds-long shrinking. Speed
is what benchmarks/broken_targets.py prints: here the verdicts and the cases run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pcpcheck.faces.cli import main
from pcpcheck_spec.names import COLLECTIVE, DRAFT, REPLICA, REPLICATED, RETURNS, SHARDED

TARGETS = Path(__file__).resolve().parent / "broken" / "targets.py"


def _check(tmp_path, function: str, *args: str) -> tuple[int, dict]:
    out = tmp_path / "out.json"
    code = main(["check", str(TARGETS), "--function", function, "--json", str(out), *args])
    return code, json.loads(out.read_text())


def _shown(result: dict) -> list[dict]:
    return [c for c in result["counterexamples"] if c["folded_into"] is None]


@pytest.mark.parametrize("function", ["hangs", "segfaults", "recurses", "exits_3"])
def test_a_target_that_hangs_or_crashes_on_every_call_costs_two_cases_a_regime(
        function, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    code, result = _check(tmp_path, function, "--regime", SHARDED, "--regime", DRAFT,
                          "--max-examples", "5", "--timeout", "2")
    assert code == 1
    # the case that hung or crashed, and the smallest step, run once beside its replay
    assert {regime: r["cases"] for regime, r in result["regimes"].items()} == {SHARDED: 2, DRAFT: 2}
    for regime in (SHARDED, DRAFT):
        first = next(c for c in result["counterexamples"] if c["regime"] == regime)
        assert first["invariant"] in (COLLECTIVE, RETURNS) and first["flaky"] is None, first
        batch = first["case"]["batch"]
        assert batch["pcp_size"] == 2 and batch["requests"] == [], batch  # the smallest step
        assert first["note"].startswith("shrunk in ") and "its replay ran beside it" in first["note"]
    printed = capsys.readouterr().out
    if function == "hangs":  # what the time goes to, said while it goes
        # the seconds said depend on when the wait was first noticed (a loaded machine: later)
        assert re.search(rf"  {SHARDED:<12} rank 0 has run \d s of its 2 s timeout \(generating, "
                         r"case 1\); waiting for it", printed), printed
        assert "(looking for the smallest case that shows it again, attempt 1); waiting" in printed


@pytest.mark.parametrize("function, pcp_size, tokens", [("hangs_at_p4", 4, 0),
                                                        ("hangs_at_3_tokens", 2, 3)])
def test_the_shrunk_hang_is_the_smallest_step_that_hangs(function, pcp_size, tokens, tmp_path):
    """Hangs from 4 ranks on (any step), or from 3 tokens on (any ranks): the counterexample is
    the step with the fewest ranks, then tokens, that hangs."""
    code, result = _check(tmp_path, function, "--regime", REPLICATED, "--max-examples", "300",
                          "--timeout", "2")
    assert code == 1
    (first,) = _shown(result)
    batch = first["case"]["batch"]
    assert first["invariant"] == COLLECTIVE and first["flaky"] is None
    assert (batch["pcp_size"], sum(r["num_tokens"] for r in batch["requests"])) == (pcp_size, tokens)


def test_a_hang_that_does_not_come_back_is_reported_flaky(tmp_path, monkeypatch):
    # a timeout no correct call comes near on a loaded machine (its replay, a fresh worker,
    # must not time out: that would read as the hang reproduced)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    code, result = _check(tmp_path, "hangs_once", "--regime", SHARDED, "--max-examples", "20",
                          "--timeout", "5")
    assert code == 1
    (first,) = _shown(result)
    assert first["invariant"] == COLLECTIVE
    assert first["flaky"] == {"replays": 1, "reproduced": 0}
    assert "no smaller case tried showed it again" in first["note"]
    assert "FLAKY" in first["report"].splitlines()[0]


def test_a_slow_correct_target_holds_and_the_report_gives_its_time_per_call(tmp_path, capsys):
    code, result = _check(tmp_path, "slow", "--regime", SHARDED, "--max-examples", "4",
                          "--max-ranks", "2", "--timeout", "2")
    assert code == 0
    summary = result["regimes"][SHARDED]
    assert summary["cases"] == 4 and summary["slowest_call"] >= 0.3 and summary["mean_call"] >= 0.3
    printed = capsys.readouterr().out
    assert "(calls: slowest " in printed and "of a 2 s timeout)" in printed
    assert "calls: the slowest took " in printed and "raise --timeout" in printed


def test_a_slow_target_gets_its_verdict_without_seconds_long_shrinking(tmp_path):
    """Each attempt costs seconds (1.5 s a call, P = 2): once the regime has a violation and
    2 x --timeout has passed since it began, the search stops drawing (abandoning the cases in
    flight), shrinking and replaying, and the counterexample says why
    (benchmarks/broken_targets.py times it, and a slow target that crashes)."""
    code, result = _check(tmp_path, "slow_and_wrong", "--regime", REPLICATED, "--max-examples",
                          "50", "--max-ranks", "2", "--timeout", "2")
    assert code == 1
    first = result["counterexamples"][0]
    assert first["invariant"] == REPLICA
    assert "the target's calls are slow" in first["note"], first["note"]
    # two attempts (each 3 s, P = 2 ranks one after the other) pass the 4 s: a few cases at most
    assert result["regimes"][REPLICATED]["cases"] <= 6, result["regimes"][REPLICATED]
