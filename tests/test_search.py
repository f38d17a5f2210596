"""The engine's generate-then-shrink search (pcpcheck.search.engine): cases drawn fast from a seeded
random source replay through the hypothesis strategy as the same cases, so hypothesis shrinks
what the fast generation found."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.database import choices_to_bytes

from pcpcheck.backends import make_backend
from pcpcheck.judge.observe import decode_rows
from pcpcheck.judge.run import run_cases
from pcpcheck.search.draw import TENSOR_SPECS, cases, draw_case
from pcpcheck.search.engine import _Stored, search
from pcpcheck.shared.case import as_tensor, describe, row_content
from pcpcheck_spec.names import NO_ROW, REGIMES, REPLICA, SHARDED

ZOO = Path(__file__).parent / "zoo"


@pytest.mark.parametrize("regimes, max_ranks, pcp_sizes", [
    ((regime,), 8, None) for regime in REGIMES] + [(REGIMES, 4, None), ((SHARDED,), 8, (2, 4))])
def test_fast_drawn_choices_replay_through_the_strategy_as_the_same_case(regimes, max_ranks,
                                                                         pcp_sizes):
    rng = random.Random(7)
    drawn = [draw_case(rng, regimes, max_ranks, pcp_sizes) for _ in range(60)]
    replayed = []

    @settings(database=_Stored([choices_to_bytes(choices) for _, choices in drawn]),
              phases=(Phase.reuse,), max_examples=len(drawn), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases(regimes=regimes, max_ranks=max_ranks, pcp_sizes=pcp_sizes))
    def replay(case):
        replayed.append(case)

    replay()
    assert sorted(c.to_json() for c in replayed) == sorted(c.to_json() for c, _ in drawn)


@pytest.fixture(scope="module")
def backend():
    with make_backend("threads", timeout=10.0) as runner:
        yield runner


def _recording(seen: list):
    def run_many(batch, target, runner):
        for observation in run_cases(batch, target, runner):
            seen.append(observation)
            yield observation
    return run_many


def test_generation_is_seeded(backend):
    target = backend.load("impl")
    runs = []
    for seed in (None, None, 5):
        seen = []
        search(target, SHARDED, backend, max_examples=40, derandomize=seed is None, seed=seed,
               run_many=_recording(seen))
        runs.append([o.prepared.case.to_json() for o in seen])
    assert len(runs[0]) == 40 and runs[0] == runs[1]  # derandomized: the same cases every run
    assert runs[2] != runs[0]


def test_hypothesis_shrinks_what_the_generation_found(backend):
    target = backend.load(str(ZOO / "bug01_local_block.py"))
    seen = []
    result = search(target, "replicated", backend, max_examples=300, run_many=_recording(seen),
                    reduce=False)  # no greedy reductions: only hypothesis' shrinking
    first = next(o for o in seen if o.violations)
    [shrunk] = result.counterexamples
    assert shrunk.violations[0].invariant == REPLICA
    def size(o):
        batch = o.prepared.case.batch
        return batch.pcp_size, len(batch.requests), sum(r.num_tokens for r in batch.requests)

    assert size(shrunk) < size(first), (describe(first.prepared.case), describe(shrunk.prepared.case))


@pytest.mark.parametrize("spec", [s for s in TENSOR_SPECS if s.row_bytes == 4] + [TENSOR_SPECS[0]])
def test_a_zero_filled_row_is_no_input_row(spec):
    """Padding is often zeros: a zero row must never read as an input row (it did as token 0's
    row in a 4-byte tensor, an int8 or fp8 row of 4, before labels were stored XOR a key)."""
    labels = np.arange(-3, 8)  # padding rows' labels are negative, tokens' from 0
    rows = torch.cat([as_tensor(row_content(labels, 0, spec.row_bytes), spec),
                      torch.zeros((1, *spec.trailing), dtype=spec.torch_dtype)])
    assert decode_rows(rows, 0, labels) == [*labels.tolist(), NO_ROW]


class _Judged:
    """An observation as the engine reads one: a case, its violations, the IDs that ran."""

    def __init__(self, case, violated):
        from pcpcheck.judge.verdict import Violation
        from pcpcheck_reference import ERA_CURRENT
        self.prepared = type("Prepared", (), {"case": case, "era": ERA_CURRENT})()
        self.violations = [Violation(i, [0]) for i in violated]
        self.checked = ("UNIQUE", REPLICA)
        self.ranks, self.costly, self.note = [], False, ""


def _unique_and_replica_when_large(cases_, target, runner):
    """Every case with a token violates UNIQUE; REPLICA too from 6 tokens on: the shrunk UNIQUE
    case (one token) no longer shows REPLICA."""
    for case in cases_:
        tokens = sum(r.num_tokens for r in case.batch.requests)
        yield _Judged(case, ["UNIQUE"] * bool(tokens) + [REPLICA] * (tokens >= 6))


def test_an_invariant_violated_only_beside_an_earlier_one_still_cites_a_case():
    result = search(None, SHARDED, None, max_examples=300, run_many=_unique_and_replica_when_large)
    assert result.violated[REPLICA] and result.violated["UNIQUE"]
    firsts = [o.violations[0].invariant for o in result.counterexamples]
    assert firsts[0] == "UNIQUE"
    assert sum(r.num_tokens for r in result.counterexamples[0].prepared.case.batch.requests) == 1
    shows = [o for o in result.counterexamples if REPLICA in {v.invariant for v in o.violations}]
    assert len(shows) == 1 and sum(r.num_tokens for r in shows[0].prepared.case.batch.requests) >= 6


@pytest.mark.parametrize("reported, mutated, holds", [
    ("all unchanged", [], True),
    ("slot map changed", ["slot_mapping"], False),
    ("one entry too many", [], False),
    ("never reported", [], True),
])
def test_what_a_rank_reports_of_its_inputs_is_what_no_mutation_judges(reported, mutated, holds):
    """None for an input: as the driver sent it (its bytes stand in); None for the whole: the
    rank never reported; a report of another length is never read as unchanged."""
    import pcpcheck_spec.invariants as inv
    from pcpcheck.judge.observe import observe
    from pcpcheck.judge.prepare import prepare
    from pcpcheck.shared.protocol import RankResult
    case = draw_case(random.Random(3), (SHARDED,), 2)[0]
    prepared = prepare(case)
    count = len(case.tensors) + 1
    after = {"all unchanged": [None] * count,
             "slot map changed": [None] * (count - 1) + [b"\xff" * 8],
             "one entry too many": [None] * (count + 1),
             "never reported": None}[reported]
    view = observe(prepared, 0, RankResult(error="raised", inputs_after=after))
    assert view.mutated == mutated
    assert inv.no_input_mutation(view.inputs_before, view.inputs_after) == holds
