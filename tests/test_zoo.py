"""The bug zoo through `pcpcheck check FILE`, as a user runs it: one deliberately wrong gather per
function-level bug class of docs/semantics.md section 7 (tests/zoo/), each reported under the exact
invariant ID it violates, shrunk to the minimal case stated here, with a reproducer that fails.

Minimal cases are what hypothesis shrinking reaches with the case strategy of pcpcheck.search.draw;
each test states the size of the smallest case that can show its bug.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings

import pcpcheck_reference as reference
from pcpcheck.backends import make_backend
from pcpcheck.faces.cli import main
from pcpcheck.judge.run import run_case
from pcpcheck.search.draw import TENSOR_SPECS, cases, kernel_decode_tokens
from pcpcheck.search.minimize import reduced as reduce_greedily
from pcpcheck.search.reduce import smaller
from pcpcheck.shared.case import Case, TensorSpec
from pcpcheck_spec.names import (
    ASYNC_FALLBACK,
    ASYNC_INPUT,
    ASYNC_LIFETIME,
    ASYNC_READ,
    COLLECTIVE,
    DCP,
    DEFAULT_REGIMES,
    DRAFT,
    DRAFT_MIXED,
    HAZARD_REGIMES,
    PAD_HYGIENE,
    REGIMES,
    REPLICA,
    REPLICATED,
    RETURNS,
    SHARDED,
    UNIQUE,
    Batch,
    Request,
)
from pcpcheck_spec.registry import ASYNC, GATHER, pairs

ZOO = Path(__file__).parent / "zoo"
MAX_EXAMPLES = "300"

# file, regime, invariant, and the size of its minimal case: P ranks, at most W rows per rank and
# at most N real tokens. The comment names a minimal case and why nothing smaller shows the bug.
# Hypothesis may end its shrink in either of two equally small cases (say one decode plus a
# graph-padding row, or one decode plus a one-token prefill), so the size is asserted, not one
# particular case.
ZOO_CASES = [
    # class 10 (hazard): the early return keeps T[:nd]: a 2-token draft block the kernel
    # classifies as prefill (nd = 0) is never written.
    ("upstream.py", "draft-mixed", REPLICA, (2, 2, 2)),
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
    # class 8: int64 slots read as int32 and returned so: the map's dtype changed, even when empty.
    ("bug08_slot_dtype.py", "replicated", RETURNS, (2, 0, 0)),
    # class 9: reshape(L, -1) with no rows at all: an empty step crashes.
    ("bug09_zero_rows_reshape.py", "replicated", RETURNS, (2, 0, 0)),
    # class 11: replicated decode copies unmasked in branch E (a decode plus a second row).
    ("bug11_unmasked_replicas.py", "replicated", UNIQUE, (2, 2, 2)),
    # class 12: token-major reading of a rank-major map: two rows on rank 0 (a 2-token decode).
    ("bug12_token_major.py", "sharded", PAD_HYGIENE, (2, 2, 2)),
    # class 13: decodes assumed last: a decode and a prefill row on one rank.
    ("bug13_decodes_not_prefix.py", "replicated", PAD_HYGIENE, (2, 2, 2)),
]


@pytest.fixture
def check_json(pcpcheck_check, tmp_path):
    """`pcpcheck check ARGS --json`: the exit code and the JSON verdict."""
    def check(args, examples=MAX_EXAMPLES):
        verdict = tmp_path / "verdict.json"
        code = pcpcheck_check([*args, "--max-examples", examples, "--json", verdict,
                               "--repro-dir", tmp_path / "repros"])
        return code, json.loads(verdict.read_text())
    return check


def _size(case: dict) -> tuple[int, int, int]:
    """(P, rows per rank, real tokens) of a counterexample's case."""
    batch = Case.from_json(json.dumps(case)).batch
    return batch.pcp_size, reference.layout(batch).num_rows, sum(r.num_tokens for r in batch.requests)


@pytest.mark.parametrize("filename, regime, invariant, minimal", ZOO_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in ZOO_CASES])
def test_zoo_bug_is_reported_with_its_invariant_and_minimal_case(filename, regime, invariant,
                                                                  minimal, check_json):
    code, verdict = check_json([ZOO / filename, "--regime", regime])
    assert code == 1
    first = verdict["counterexamples"][0]
    assert (first["invariant"], first["regime"]) == (invariant, regime)
    assert first["hazard"] is (regime in HAZARD_REGIMES)
    ranks, rows, tokens = _size(first["case"])
    assert ranks == minimal[0] and rows <= minimal[1] and tokens <= minimal[2], first["report"]
    # a request scheduling nothing changes no layout: a smallest case has none left over
    assert all(r["num_tokens"] > 0 for r in first["case"]["batch"]["requests"]), first["report"]
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


def _request(num_tokens: int, prefilling: bool, first_block: int, span: int) -> Request:
    return Request(num_tokens, prefilling, 0, tuple(range(first_block, first_block + -(-num_tokens // span))))


def _draft_mixed() -> Batch:
    requests = (_request(1, False, 0, 1), _request(2, False, 1, 1))  # a decode, then a 2-token block
    return Batch(DRAFT_MIXED, 3, requests, 1, num_decode_tokens=kernel_decode_tokens(requests))


# One pinned case per regime, P = 3, at least two written slots on every rank
# (tests/zoo/triggers.py); three ranks, so a rank that differs from the majority can be blamed.
PINNED = {
    SHARDED: Batch(SHARDED, 3, (_request(1, False, 0, 1), _request(4, True, 1, 1)), 1),
    REPLICATED: Batch(REPLICATED, 3, (_request(1, False, 0, 1), _request(4, True, 1, 1)), 1),
    DCP: Batch(DCP, 3, (_request(8, True, 0, 3),), 1),
    DRAFT: Batch(DRAFT, 3, (_request(1, False, 0, 1), _request(2, False, 1, 1)), 1),
    DRAFT_MIXED: _draft_mixed(),
}


# The asynchronous IDs' triggers (tests/zoo/async_fork.py, tests/test_async.py): the mutant
# protocol or the caller's order that breaks each; pinned on a sharded step with a decode on every
# rank (every rank's side stream then has rows to move), under a graph capture for the fallback.
ASYNC_TRIGGERS = {
    ASYNC_FALLBACK: ["--async", "StartsWhileCapturing"],
    ASYNC_INPUT: ["--async", "NoReadyWait"],
    ASYNC_READ: ["--async", "PCPAsyncCacheUpdate", "--async-order",
                 "start,attention,release,finish-nowait,reader"],
    ASYNC_LIFETIME: ["--async", "NoRecordStream"],
}
ASYNC_PINNED = Batch(SHARDED, 3, (*(_request(1, False, k, 1) for k in range(3)),
                                  _request(4, True, 3, 1)), 1)
# decodes alone, graph-padded: a FULL graph captures the step (docs/async.md)
ASYNC_PINNED_CAPTURED = Batch(SHARDED, 3, ASYNC_PINNED.requests[:3], 1, graph_size=2)


CHECK_PAIRS = pairs(GATHER) + pairs(ASYNC)


@pytest.mark.parametrize("invariant, regime", CHECK_PAIRS, ids=[f"{i}-{r}" for i, r in CHECK_PAIRS])
def test_every_invariant_fires_in_every_regime_it_applies_to(invariant, regime, pcpcheck_check,
                                                             capsys):
    """Each (ID, regime) `pcpcheck check` evaluates has a checker-level trigger reported under that
    exact ID: `pcpcheck check tests/zoo/triggers.py --function fires_ID --replay PINNED_CASE`
    (`--async` ones: ASYNC_TRIGGERS). The IDs only `pcpcheck vllm` evaluates (LAYOUT) get
    theirs from vLLM-style fixtures:
    tests/test_vllm.py::test_every_release_invariant_fires_in_every_regime_it_applies_to."""
    if invariant in ASYNC_TRIGGERS and regime == SHARDED:  # a protocol's mutant, or the
        # caller's order, in a fork's file
        batch = ASYNC_PINNED_CAPTURED if invariant == ASYNC_FALLBACK else ASYNC_PINNED
        case = Case(batch, (TensorSpec((4,), "float32"),)).to_json()
        code = pcpcheck_check([ZOO / "async_fork.py", *ASYNC_TRIGGERS[invariant], "--replay", case])
    else:  # a gather's own output made wrong; a stream ordering: a gather on a side stream
        triggers = "stream_triggers.py" if invariant in ASYNC_TRIGGERS else "triggers.py"
        case = Case(PINNED[regime], (TensorSpec((4,), "float32"),)).to_json()
        code = pcpcheck_check([ZOO / triggers, "--function", f"fires_{invariant}", "--replay", case])
    out = capsys.readouterr().out
    assert code == 1, f"no trigger makes {invariant} fire in {regime}:\n{out}"
    reported = out.splitlines()[2 if "stood in for" in out else 1]
    # every rank breaks it, except COLLECTIVE: rank 0 alone issues one collective more
    ranks = [0] if invariant == COLLECTIVE else [0, 1, 2]
    hazard = " [hazard]" if regime in HAZARD_REGIMES else ""
    assert reported.startswith(f"{invariant} violated{hazard} on rank(s) {ranks}"), out



@pytest.mark.parametrize("function, message", [
    ("returns_slots_on_meta", "slot_mapping as torch.int64 on meta; it went in as torch.int64 on cpu"),
    ("returns_rows_as_int32", "tensor 0 as torch.int32 (6, 4); it went in as torch.float32 (L, 4)"),
    ("returns_rows_reshaped", "tensor 0 as torch.float32 (6, 2, 2); it went in as torch.float32 (L, 4)"),
    ("returns_one_tensor_less", "returned 1 tensor(s) for 2 input(s)"),
    ("returns_rows_past_their_storage", "reaches past the end of its storage"),
])
def test_outputs_unlike_the_inputs_break_returns_even_with_every_byte_right(function, message,
                                                                            pcpcheck_check, capsys):
    """Count, dtype, trailing shape and device are checked, not only the bytes; a tensor is read
    only within its storage (past it lies freed memory, which may still hold the right bytes)."""
    case = Case(PINNED[SHARDED], (TensorSpec((4,), "float32"),) * 2).to_json()
    assert pcpcheck_check([ZOO / "triggers.py", "--function", function, "--replay", case]) == 1
    out = capsys.readouterr().out
    assert "RETURNS violated on rank(s) [0, 1, 2]" in out and message in out, out


def test_an_input_left_past_its_storage_is_not_the_input_sent(pcpcheck_check, capsys):
    """The worker cannot read it back (freed memory): NO_MUTATION, not a worker's failure."""
    case = Case(PINNED[SHARDED], (TensorSpec((4,), "float32"),) * 2).to_json()
    assert pcpcheck_check([ZOO / "triggers.py", "--function", "leaves_an_input_past_its_storage",
                           "--replay", case]) == 1
    out = capsys.readouterr().out
    assert "NO_MUTATION violated on rank(s) [0, 1, 2]" in out, out


@pytest.mark.parametrize("regime", list(PINNED))
def test_pinned_cases_hold_for_the_correct_gather(regime, pcpcheck_check):
    """A trigger's case is one the correct gather passes: the violation is the trigger's."""
    case = Case(PINNED[regime], (TensorSpec((4,), "float32"),)).to_json()
    assert pcpcheck_check([ZOO / "correct.py", "--replay", case]) == 0


def test_counterexample_is_reduced_past_hypothesis_local_minimum():
    """The search's greedy reductions (reduce.smaller) take a large counterexample to the
    smallest one showing the same first violation."""
    large = Batch(SHARDED, 4, (_request(1, False, 0, 1), _request(9, True, 1, 1),
                              Request(0, True, 3, (20,))), 4, graph_size=5)
    with make_backend("threads") as backend:
        target = backend.load(str(ZOO / "bug05_rows_padded_after_map.py"))
        observation = run_case(Case(large, TENSOR_SPECS[:3]), target, backend)
        assert observation.violations[0].invariant == PAD_HYGIENE
        reduced = reduce_greedily(observation, target, backend)
    assert reduced.violations[0].invariant == PAD_HYGIENE
    assert _size(json.loads(reduced.prepared.case.to_json())) == (2, 1, 2)
    assert len(reduced.prepared.case.tensors) == 1


def _measure(case: Case) -> tuple:
    b = case.batch
    return (b.pcp_size, len(b.requests), sum(r.num_tokens for r in b.requests),
            sum(r.context_len for r in b.requests), sum(r.prefilling for r in b.requests),
            reference.layout(b).width, b.dp_pad, b.pad_slot_map, b.block_size, b.interleave,
            len(case.tensors),
            case.tensors != (TensorSpec((4,), "float32"),))


@settings(max_examples=200, deadline=None)
@given(case=cases(regimes=REGIMES))
def test_reductions_are_well_formed_and_smaller(case):
    """Each reduction is a well-formed step and strictly smaller: no measure grows (the rank
    width W, not the graph size), one shrinks (or only the blocks are renumbered lower)."""
    for reduced in smaller(case):
        reference.layout(reduced.batch)  # raises on a malformed step
        blocks = [b for r in reduced.batch.requests for b in r.blocks]
        assert len(set(blocks)) == len(blocks)  # WF_SLOTS: distinct blocks
        before, after = _measure(case), _measure(reduced)
        assert all(a <= b for a, b in zip(after, before)), (case, reduced)
        assert after != before or sorted(blocks) < sorted(b for r in case.batch.requests for b in r.blocks)


def test_correct_zoo_gather_holds_everywhere(check_json):
    code, verdict = check_json([ZOO / "correct.py"])
    assert (code, verdict["verdict"], verdict["counterexamples"]) == (0, "holds", [])


def test_upstream_holds_by_default_and_fails_only_the_hazard_regime(check_json, capsys):
    """vLLM's own behaviour (class 10 latent): the default run passes; draft-mixed, run by name or
    with `--regime all`, fails tagged hazard."""
    code, verdict = check_json([ZOO / "upstream.py"])
    assert (code, list(verdict["regimes"])) == (0, list(DEFAULT_REGIMES))
    # the default regimes were searched above: here draft-mixed must fail (within 10 cases)
    code, verdict = check_json([ZOO / "upstream.py", "--regime", "all"], examples=50)
    assert (code, list(verdict["regimes"])) == (1, list(REGIMES))
    assert [(c["regime"], c["hazard"]) for c in verdict["counterexamples"]] == [(DRAFT_MIXED, True)]
    assert "REPLICA violated [hazard]" in capsys.readouterr().out


def test_report_folds_one_bug_and_explains_its_notation_once(check_json, capsys):
    code, verdict = check_json([ZOO / "bug12_token_major.py"])
    out = capsys.readouterr().out
    shown = [c for c in verdict["counterexamples"] if c["folded_into"] is None]
    assert code == 1 and len(shown) < len(verdict["counterexamples"])
    assert out.count("Counterexample ") == len(shown) and "folded: " in out
    assert out.count("How to read this report") == 1 and "B = block size" in out


def test_call_line_shows_what_the_target_was_called_with(pcpcheck_check, capsys):
    case = Case(PINNED[SHARDED], (TensorSpec((4,), "float32"),)).to_json()
    assert pcpcheck_check([ZOO / "legacy_no_shard.py", "--replay", case]) == 1
    out = capsys.readouterr().out
    assert "call: _gather_prefill_cache_inputs(tensors, slot_mapping, nd) (no shard_decode_requests" in out
    assert pcpcheck_check([ZOO / "bug03_nd_ownership.py", "--replay", case]) == 1
    assert ("call: _gather_prefill_cache_inputs(tensors, slot_mapping, nd, shard_decode_requests=True)"
            in capsys.readouterr().out)


def test_legacy_gather_passes_replicated_and_sharded_is_not_applicable(check_json, capsys):
    """A gather without the shard flag predates decode sharding: the sharded regime is not its
    era (reported not applicable, with the reason), never a violation. Replayed on a sharded case
    by name, it still runs (class 2: see test_call_line_shows_what_the_target_was_called_with)."""
    code, verdict = check_json([ZOO / "legacy_no_shard.py", "--regime", "replicated",
                        "--regime", "sharded"])
    sharded = verdict["regimes"]["sharded"]
    assert (code, verdict["counterexamples"], sharded["cases"]) == (0, [], 0)
    assert "no shard_decode_requests" in sharded["not_applicable"]
    assert verdict["regimes"]["replicated"]["not_applicable"] is None
    assert "sharded      not applicable: the gather has no shard_decode_requests" in capsys.readouterr().out


def test_console_script_reports_the_invariant(tmp_path):
    run = subprocess.run(["pcpcheck", "check", str(ZOO / "bug03_nd_ownership.py"), "--regime",
                          "sharded", "--max-examples", MAX_EXAMPLES], capture_output=True, text=True)
    assert run.returncode == 1
    assert "Counterexample 1: REPLICA violated" in run.stdout
    assert "replay: pcpcheck check" in run.stdout


@pytest.mark.parametrize("new, expected", [("bug01_local_block.py", 1), (None, 0)])
def test_diff_reports_a_difference_only_where_there_is_one(new, expected, capsys):
    other = str(ZOO / new) if new else "impl"
    # bug01's difference shows within 10 cases; impl against itself must never differ
    assert main(["diff", "impl", other, "--max-examples", "50"]) == expected
    out = capsys.readouterr().out
    assert ("Outcomes differ" in out) == bool(expected)
    if expected:
        assert "old = impl: satisfies the spec" in out and "violates REPLICA" in out
