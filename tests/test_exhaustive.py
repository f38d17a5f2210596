"""`pcpcheck check --exhaustive`: every well-formed step within a scope, each once, smallest
first. The enumeration (pcpcheck.search.scope) is held against a brute-force generator written here
(every raw step, any block ids, canonicalised by the stated symmetries); the default scope finds
every zoo bug with its exact ID, no larger than the random search's shrunk case, and the
bundled implementation holds within it."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from pcpcheck import api
from pcpcheck.judge import coverage
from pcpcheck.render import report
from pcpcheck.search import scope
from pcpcheck.search.draw import kernel_decode_tokens, validate_case
from pcpcheck.search.reduce import size
from pcpcheck.shared.case import Case
from pcpcheck.shared.errors import UsageError
from pcpcheck_spec.names import DCP, DRAFT_MIXED, DRAFT_REGIMES, REGIMES, Batch, Request
from tests.test_zoo import ZOO, ZOO_CASES, _size

SMALL = [
    scope.Scope(pcp_sizes=(2,), max_requests=2, max_tokens=2, max_context=1, block_sizes=(1, 2),
                interleaves=(1, 2), max_graph_pad=1, max_dp_pad=1),
    scope.Scope(pcp_sizes=(2, 3), max_requests=1, max_tokens=3, max_context=2, block_sizes=(2,),
                interleaves=(1, 2), max_graph_pad=2, max_dp_pad=2),
]


def _canonical(batch: Batch) -> Batch:
    """The stated symmetries, applied by hand: block ids renumbered 0.. in order of first use;
    a request scheduling nothing as (0, decode, no context, no block); a graph size that pads
    nothing as none; a draft map "padded" without padding rows as unpadded."""
    rename = {}
    requests = []
    for r in batch.requests:
        if r.num_tokens == 0:
            requests.append(Request(0, False, 0, ()))
            continue
        for b in r.blocks:
            rename.setdefault(b, len(rename))
        requests.append(dataclasses.replace(r, blocks=tuple(rename[b] for b in r.blocks)))
    batch = dataclasses.replace(batch, requests=tuple(requests))
    import pcpcheck_reference as reference
    if batch.graph_size and batch.graph_size == int(reference.layout(
            dataclasses.replace(batch, graph_size=0)).counts.max(initial=0)):
        batch = dataclasses.replace(batch, graph_size=0)
    if batch.regime in DRAFT_REGIMES and not batch.dp_pad:
        batch = dataclasses.replace(batch, pad_slot_map=False)
    return batch


def _brute_force(bounds: scope.Scope, regime: str) -> set[Batch]:
    """Every raw step within the bounds (any flag and context on an empty request, block ids
    permuted, graph sizes from none up), kept when well formed, canonicalised."""
    import pcpcheck_reference as reference
    found = set()
    drafts = regime in DRAFT_REGIMES
    one = [(q, pf, c) for q in range(0 if not drafts else 1, bounds.max_tokens + 1)
           for pf in ((False,) if drafts else (False, True)) for c in range(bounds.max_context + 1)]
    for p, b, i in itertools.product(bounds.pcp_sizes, bounds.block_sizes,
                                     bounds.interleaves if regime == DCP else (1,)):
        if b % i:  # WF_SLOTS: the interleave divides the block size
            continue
        span = b * (p if regime == DCP else 1)
        for n in range(bounds.max_requests + 1):
            for drawn in itertools.product(one, repeat=n):
                needs = [-(-(c + q) // span) for q, _, c in drawn]
                total = sum(needs)
                orders = list(itertools.permutations(range(total)))[:6]  # any relabelling
                for order in orders:
                    requests, k = [], 0
                    for (q, pf, c), need in zip(drawn, needs):
                        requests.append(Request(q, pf, c, tuple(order[k:k + need])))
                        k += need
                    base = Batch(regime, p, tuple(requests), b, i)
                    if drafts:
                        nd = kernel_decode_tokens(base.requests) if regime == DRAFT_MIXED else None
                        variants = [dataclasses.replace(base, dp_pad=d, pad_slot_map=m,
                                                        num_decode_tokens=nd)
                                    for d in range(bounds.max_dp_pad + 1) for m in (False, True)]
                    else:
                        try:
                            widest = int(reference.layout(base).counts.max(initial=0))
                        except ValueError:
                            continue
                        variants = [dataclasses.replace(base, graph_size=g)
                                    for g in (0, *range(widest, widest + bounds.max_graph_pad + 1))]
                    for batch in variants:
                        try:
                            validate_case(Case(batch))
                        except ValueError:
                            continue
                        found.add(_canonical(batch))
    return found


@pytest.mark.parametrize("bounds", SMALL)
@pytest.mark.parametrize("regime", REGIMES)
def test_the_enumeration_counts_every_step_once_as_a_brute_force_does(bounds, regime):
    listed = [case.batch for case in scope.steps(bounds, regime)]
    for batch in listed:
        validate_case(Case(batch))  # well formed
    assert len({_canonical(b) for b in listed}) == len(listed), "two steps equal up to symmetry"
    assert len(listed) == scope.count(bounds, regime) == len(_brute_force(bounds, regime))


def test_steps_come_in_order_of_size():
    listed = list(scope.steps(SMALL[1], "sharded"))
    levels = [size(case)[:3] for case in listed]
    assert levels == sorted(levels)


def test_scope_text_round_trips_and_bad_scopes_are_one_line():
    assert scope.parse_scope(scope.DEFAULT_SCOPE.spec()) == scope.DEFAULT_SCOPE
    assert scope.parse_scope("ranks=2..3,tokens=2").pcp_sizes == (2, 3)
    for text, named in [("ranks=1..3", "ranks"), ("colour=2", "colour"), ("tokens=x", "tokens")]:
        with pytest.raises(ValueError, match=named):
            scope.parse_scope(text)
    with pytest.raises(UsageError, match="--exhaustive"):
        api.check("impl", scope="ranks=2")


def test_a_small_scope_holds_for_impl_and_says_so(pcpcheck_check, capsys):
    code = pcpcheck_check(["impl", "--exhaustive", "--scope", "ranks=2,requests=1,tokens=2"])
    out = capsys.readouterr().out
    total = sum(scope.count(scope.parse_scope("ranks=2,requests=1,tokens=2"), r)
                for r in ("sharded", "replicated", "dcp", "draft"))
    assert code == 0
    assert f"exhaustive: {total:,} steps (" in out and ": every invariant holds" in out


@pytest.mark.parametrize("filename, regime, invariant, minimal", ZOO_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in ZOO_CASES])
def test_every_zoo_bug_is_found_exhaustively_at_its_smallest(filename, regime, invariant, minimal,
                                                            threads_backend):
    result = api.check(ZOO / filename, regimes=(regime,), exhaustive=True, runner=threads_backend)
    assert result.exit_code == 1
    first = result.counterexamples[0]
    assert (first.invariant, first.regime) == (invariant, regime), first.report
    ranks, rows, tokens = _size(json.loads(first.case))
    assert ranks == minimal[0] and rows <= minimal[1] and tokens <= minimal[2], first.report
    assert "none needed: exhaustive" in first.report
    drawn = api.check(ZOO / filename, regimes=(regime,), max_examples=300, runner=threads_backend)
    shrunk = _size(json.loads(drawn.counterexamples[0].case))
    assert all(mine <= theirs for mine, theirs in zip((ranks, rows, tokens), shrunk)), (
        (ranks, rows, tokens), shrunk)  # no larger than the random search's shrunk case
    assert result.summary(regime).scope_steps == scope.count(scope.DEFAULT_SCOPE, regime)


def test_a_release_is_checked_exhaustively_in_its_own_order():
    """`pcpcheck vllm --exhaustive`: every step of the scope in the release's batch order, each
    distinct one once (its order can map two steps to one), empty steps left out as a release
    never runs them."""
    from tests.test_vllm import RELEASE_TREE
    bounds = "ranks=2,requests=2,tokens=2,context=0,block-sizes=1/2"
    result = api.check_release(RELEASE_TREE, regimes=("sharded", "draft"), exhaustive=True,
                               scope=bounds)
    assert result.exit_code == 0
    for summary in result.regimes:
        steps = list(scope.steps(scope.parse_scope(bounds), summary.regime))
        assert 0 < summary.cases == summary.scope_steps < len(steps)


@pytest.mark.heavy  # .ci/run's stage of the heaviest evidence
def test_impl_holds_within_the_default_scope(threads_backend):
    """The whole default scope (benchmarks/README.md times it); it reaches
    every gather branch and every layout feature but several KV groups (a release's: a file
    target's gather is called once per step) and the asynchronous protocol's starts (no
    --async), as its coverage counts them from each step."""
    result = api.check("impl", exhaustive=True, runner=threads_backend)
    assert result.holds
    assert all(s.complete for s in result.regimes)
    assert {b for s in result.regimes for b, n in s.branches if n} == set(coverage.BRANCHES)
    assert {f for s in result.regimes for f, n in s.features if n} == \
        set(coverage.FEATURES) - {coverage.KV_GROUPS, *coverage.TRACE_FEATURES}
    again = api.CheckResult.from_json(result.to_json())
    assert again.options.scope == scope.DEFAULT_SCOPE.spec()
    assert [s.scope_steps for s in again.regimes] == [
        scope.count(scope.DEFAULT_SCOPE, r) for r in result.options.regimes]


def test_several_drivers_give_the_same_exhaustive_result(threads_backend):
    """--jobs: each regime's steps in another driver process; counts, coverage and the
    counterexample are the same as one driver's."""
    small = "ranks=2,requests=2,tokens=2,context=0"
    target = ZOO / "bug03_nd_ownership.py"
    alone = api.check(target, regimes=("sharded", "replicated"), exhaustive=True, scope=small,
                      runner=threads_backend)
    shared = api.check(target, regimes=("sharded", "replicated"), exhaustive=True, scope=small,
                       jobs=2)
    assert [(s.cases, s.scope_steps, s.branches, s.features, s.invariants) for s in alone.regimes] \
        == [(s.cases, s.scope_steps, s.branches, s.features, s.invariants) for s in shared.regimes]
    assert [c.case for c in alone.counterexamples] == [c.case for c in shared.counterexamples]
    assert alone.summary("sharded").cases < alone.summary("sharded").scope_steps  # stopped early


def test_a_budget_cuts_an_exhaustive_run_and_the_report_says_so(threads_backend):
    result = api.check("impl", regimes=("dcp",), exhaustive=True, budget_s=0.5,
                       runner=threads_backend)
    summary = result.summary("dcp")
    assert summary.budget_reached and 0 < summary.cases < summary.scope_steps
    assert f"steps (dcp {scope.count(scope.DEFAULT_SCOPE, 'dcp'):,}) within" in \
        report.result_text(result)
    assert "checked: the budget ran out" in report.result_text(result)


@pytest.mark.parametrize("argv, message", [
    (["--exhaustive", "--scope", "ranks=9"], "scope: ranks must be between 2 and 8"),
    (["--scope", "ranks=2"], "--scope bounds an exhaustive check: add --exhaustive"),
    (["--exhaustive", "--backend", "gloo"], "--exhaustive runs on the threads backend"),
    (["--exhaustive", "--replay", "{}"], "--replay judges one case"),
])
def test_bad_exhaustive_options_are_one_line_exit_2(argv, message, capsys):
    from pcpcheck.faces.cli import main
    assert main(["check", "impl", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_an_exhaustive_result_follows_the_documented_schema_and_round_trips(threads_backend):
    from tests.test_api import _schema, conforms
    result = api.check(ZOO / "bug07_zero_pad.py", regimes=("sharded",), exhaustive=True,
                       scope="ranks=2,requests=1,tokens=2", runner=threads_backend)
    document = json.loads(result.to_json())
    assert conforms(document, _schema("pcpcheck check result")) == []
    assert document["options"]["scope"] == scope.parse_scope("ranks=2,requests=1,tokens=2").spec()
    regime = document["regimes"]["sharded"]
    assert regime["scope_steps"] == scope.count(scope.parse_scope("ranks=2,requests=1,tokens=2"),
                                                "sharded")
    # every feature a gather check can reach (several KV groups: a release's alone, left out)
    assert set(regime["coverage"]["features"]) == \
        set(coverage.FEATURES) - {coverage.KV_GROUPS, *coverage.TRACE_FEATURES}
    again = api.CheckResult.from_json(result.to_json())
    assert again.regimes == result.regimes and again.options == result.options


@pytest.mark.heavy  # .ci/run's stage of the heaviest evidence
def test_vllm_0_33_0_gather_holds_within_the_default_scope(tmp_path, threads_backend):
    """vLLM 0.33.0's own pcp.py, read from its wheel (fetched at test time, never committed):
    every step of the default scope holds; its class-10 hazard is a smallest draft-mixed step."""
    import zipfile

    from pcpcheck.shared.errors import SourceError
    from pcpcheck.shared.source import fetch_release
    try:
        wheel = fetch_release("0.33.0")
    except SourceError as exc:
        pytest.fail(f"cannot fetch vllm==0.33.0 from the package registry: {exc}", pytrace=False)
    gather = tmp_path / "pcp.py"
    gather.write_bytes(zipfile.ZipFile(wheel).read("vllm/v1/attention/ops/pcp.py"))
    result = api.check(gather, exhaustive=True, runner=threads_backend)
    assert result.holds and all(s.complete for s in result.regimes), report.result_text(result)
    hazard = api.check(gather, regimes=("draft-mixed",), exhaustive=True, runner=threads_backend)
    first = hazard.counterexamples[0]
    assert (first.invariant, _size(json.loads(first.case))) == ("REPLICA", (2, 2, 2)), first.report


def test_the_help_states_the_default_scopes_the_search_uses():
    from pcpcheck.faces.options import CHECK_SCOPE, RELEASE_SCOPE
    assert (CHECK_SCOPE, RELEASE_SCOPE) == (scope.DEFAULT_SCOPE.spec(),
                                            scope.RELEASE_DEFAULT_SCOPE.spec())
    assert scope.count(scope.DEFAULT_SCOPE, "dcp") > 0
    total = sum(scope.count(scope.DEFAULT_SCOPE, r) for r in ("sharded", "replicated", "dcp", "draft"))
    assert total >= 100_000  # 3 requests: where interleavings multiply

