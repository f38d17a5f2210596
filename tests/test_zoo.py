"""The bug zoo through `pcpcheck check FILE`, as a user runs it: one deliberately wrong gather per
function-level bug class of pcp-semantics section 7 (tests/zoo/), each reported under the exact
invariant ID it violates, shrunk to the minimal case stated here, with a reproducer that fails.

Minimal cases are what hypothesis shrinking reaches with the case strategy of pcpcheck.cases;
each test states the size of the smallest case that can show its bug.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import reference
from pcpcheck.cases import Case
from pcpcheck.cli import main
from spec.names import PAD_HYGIENE, REPLICA, RETURNS, UNIQUE

ZOO = Path(__file__).parent / "zoo"
MAX_EXAMPLES = "300"

# file, regime, invariant, and the size of its minimal case: P ranks, at most W rows per rank and
# at most N real tokens. The comment names a minimal case and why nothing smaller shows the bug.
# Hypothesis may end its shrink in either of two equally small cases (say one decode plus a
# graph-padding row, or one decode plus a one-token prefill), so the size is asserted, not one
# particular case.
ZOO_CASES = [
    # class 10: the early return keeps T[:nd]: one decode classified nd = 0 is never written.
    ("upstream.py", "draft-mixed", REPLICA, (2, 1, 1)),
    # class 1: branch E needs 0 < nd < L: a decode plus a padding row or a one-token prefill.
    ("bug01_local_block.py", "replicated", REPLICA, (2, 2, 2)),
    # class 3: the peer's one decode is dropped as "not owned" by nd.
    ("bug03_nd_ownership.py", "sharded", REPLICA, (2, 1, 1)),
    # class 4: slots truncated to L: a 2-token prefill, rank 1's token loses its slot.
    ("bug04_truncated_slots.py", "sharded", REPLICA, (2, 1, 2)),
    # class 5: rows padded after the map was built: a 2-token prefill, rank 1's token shifts.
    ("bug05_rows_padded_after_map.py", "sharded", PAD_HYGIENE, (2, 1, 2)),
    # class 6: a -1-padded tail makes S // L drop rank 1's rows: needs a second row per rank.
    ("bug06_partial_expansion.py", "sharded", REPLICA, (2, 2, 2)),
    # class 7: two padding slots (or a padding slot next to the real slot 0) both aimed at 0.
    ("bug07_zero_pad.py", "sharded", UNIQUE, (2, 1, 1)),
    # class 8: int64 slots read as int32: [0, -1] reads as [0, 0] (low, high word).
    ("bug08_slot_dtype.py", "replicated", UNIQUE, (2, 2, 2)),
    # class 9: reshape(L, -1) with no rows at all: an empty step crashes.
    ("bug09_zero_rows_reshape.py", "replicated", RETURNS, (2, 0, 0)),
    # class 11: replicated decode copies unmasked in branch E (a decode plus a second row).
    ("bug11_unmasked_replicas.py", "replicated", UNIQUE, (2, 2, 2)),
    # class 12: token-major reading of a rank-major map: two rows on rank 0 (a 2-token decode).
    ("bug12_token_major.py", "sharded", PAD_HYGIENE, (2, 2, 2)),
    # class 13: decodes assumed last: a decode and a prefill row on one rank.
    ("bug13_decodes_not_prefix.py", "replicated", PAD_HYGIENE, (2, 2, 2)),
]


def _check(args, tmp_path):
    verdict = tmp_path / "verdict.json"
    code = main(["check", *map(str, args), "--max-examples", MAX_EXAMPLES,
                 "--json", str(verdict), "--repro-dir", str(tmp_path / "repros")])
    return code, json.loads(verdict.read_text())


def _size(case: dict) -> tuple[int, int, int]:
    """(P, rows per rank, real tokens) of a counterexample's case."""
    batch = Case.from_json(json.dumps(case)).batch
    return batch.pcp_size, reference.layout(batch).num_rows, sum(r.num_tokens for r in batch.requests)


@pytest.mark.parametrize("filename, regime, invariant, minimal", ZOO_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in ZOO_CASES])
def test_zoo_bug_is_reported_with_its_invariant_and_minimal_case(filename, regime, invariant,
                                                                  minimal, tmp_path):
    code, verdict = _check([ZOO / filename, "--regime", regime], tmp_path)
    assert code == 1
    first = verdict["counterexamples"][0]
    assert (first["invariant"], first["regime"]) == (invariant, regime)
    ranks, rows, tokens = _size(first["case"])
    assert ranks == minimal[0] and rows <= minimal[1] and tokens <= minimal[2], first["report"]
    assert first["replay"].startswith("pcpcheck check ")
    _assert_reproducer_fails(verdict["reproducers"][0], invariant)


def _assert_reproducer_fails(path: str, invariant: str) -> None:
    spec = importlib.util.spec_from_file_location("reproducer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [getattr(module, name) for name in dir(module) if name.startswith("test_")]
    assert len(tests) == 1
    with pytest.raises(AssertionError, match=invariant):
        tests[0]()


def test_correct_zoo_gather_holds_everywhere(tmp_path):
    code, verdict = _check([ZOO / "correct.py"], tmp_path)
    assert (code, verdict["verdict"], verdict["counterexamples"]) == (0, "holds", [])


def test_legacy_gather_passes_replicated_and_sharded_is_not_applicable(tmp_path):
    """A gather without the shard flag predates decode sharding: the sharded regime is not its
    era (reported not applicable, with the reason), never a violation."""
    code, verdict = _check([ZOO / "legacy_no_shard.py", "--regime", "replicated",
                            "--regime", "sharded"], tmp_path)
    sharded = verdict["regimes"]["sharded"]
    assert (code, verdict["counterexamples"], sharded["cases"]) == (0, [], 0)
    assert "no shard_decode_requests" in sharded["not_applicable"]
    assert verdict["regimes"]["replicated"]["not_applicable"] is None


def test_reproducer_file_fails_under_pytest(tmp_path):
    """A reproducer is a standalone pytest file: run it the way a user would."""
    code, verdict = _check([ZOO / "bug04_truncated_slots.py", "--regime", "sharded"], tmp_path)
    assert code == 1
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          verdict["reproducers"][0]], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 1, run.stdout
    assert "REPLICA violated" in run.stdout


def test_console_script_reports_the_invariant(tmp_path):
    run = subprocess.run(["pcpcheck", "check", str(ZOO / "bug03_nd_ownership.py"), "--regime",
                          "sharded", "--max-examples", MAX_EXAMPLES], capture_output=True, text=True)
    assert run.returncode == 1
    assert "Counterexample 1: REPLICA violated" in run.stdout
    assert "replay: pcpcheck check" in run.stdout


@pytest.mark.parametrize("new, expected", [("bug01_local_block.py", 1), (None, 0)])
def test_diff_reports_a_difference_only_where_there_is_one(new, expected, capsys):
    other = str(ZOO / new) if new else "impl"
    assert main(["diff", "impl", other, "--max-examples", "200"]) == expected
    out = capsys.readouterr().out
    assert ("Outcomes differ" in out) == bool(expected)
    if expected:
        assert "old = impl: satisfies the spec" in out and "violates REPLICA" in out
