"""Asynchronous replication (bug class 16; SPEC.md "Asynchronous replication"): the CPU model
of CUDA streams (pcpcheck.worker.cuda_model), the model runner's drive
(pcpcheck.worker.async_step) and the four ASYNC_* invariants.

A correct protocol holds (impl's, and tests/zoo/async_fork.py's written the way a fork writes
it); each mutant of the issue's list fails with its own invariant, and with nothing else: every
cache a mutant writes is right, on CPU, so only the stream trace can tell. With the
happens-before relation made to order everything (the race detector off), every mutant passes:
the verdicts are the detector's. The gloo backend: tests/test_procs.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pcpcheck.api import check, replay_case
from pcpcheck.judge.coverage import (
    ASYNC_CAPTURED,
    ASYNC_DECLINED,
    ASYNC_STARTED,
    MAIN_STREAM_ONLY,
    SIDE_STREAMS,
)
from pcpcheck.render import report
from pcpcheck.shared.case import Case
from pcpcheck_spec.names import (
    ASYNC_FALLBACK,
    ASYNC_INPUT,
    ASYNC_LIFETIME,
    ASYNC_READ,
    HOST,
    SHARDED,
    STARTED,
)

FORK = Path(__file__).resolve().parent / "zoo" / "async_fork.py"
EXAMPLES = 120

# (protocol class of tests/zoo/async_fork.py, the caller's order or None, the invariant)
MUTANTS = [
    ("NoReadyWait", None, ASYNC_INPUT),  # the side stream's wait for the ready event dropped
    ("PCPAsyncCacheUpdate", "start,attention,release,finish-nowait,reader", ASYNC_READ),
    ("PCPAsyncCacheUpdate", "start,attention,release,reader,finish", ASYNC_READ),  # reader between
    ("NoRecordStream", None, ASYNC_LIFETIME),
    ("StartsWhileCapturing", None, ASYNC_FALLBACK),
]


def _check(threads_backend, protocol: str | None, order: str | None = None, target=FORK,
           regimes=(SHARDED,), examples: int = EXAMPLES):
    kwargs = {} if order is None else {"async_order": order.split(",")}
    return check(str(target), regimes=regimes, max_examples=examples, runner=threads_backend,
                 asynchronous=protocol, **kwargs)


@pytest.mark.parametrize("target, protocol", [("impl", ""), (FORK, "PCPAsyncCacheUpdate")])
def test_a_correct_protocol_holds(threads_backend, target, protocol):
    result = _check(threads_backend, protocol, target=target)
    assert result.holds, result.counterexamples[0].report if result.counterexamples else ""
    sharded = result.regimes[0]
    features = dict(sharded.features)
    # started on every step but those a graph capture makes fall back (docs/async.md): most of
    # them; the orderings judged on exactly those; the fallback's own rule on every step
    started = features[ASYNC_STARTED]
    assert started + features[ASYNC_CAPTURED] == sharded.cases and features[ASYNC_DECLINED] == 0
    assert started > sharded.cases // 2 and features[ASYNC_CAPTURED] > 0, features
    assert sharded.checked[ASYNC_FALLBACK] == sharded.cases
    for invariant in (ASYNC_INPUT, ASYNC_READ, ASYNC_LIFETIME):
        assert sharded.checked[invariant] == started


@pytest.mark.parametrize("protocol, order, invariant", MUTANTS,
                         ids=[f"{p}-{o or 'default'}" for p, o, _ in MUTANTS])
def test_each_mutant_fails_with_its_invariant_alone(threads_backend, protocol, order, invariant):
    result = _check(threads_backend, protocol, order)
    violated = {v.invariant for c in result.counterexamples for v in c.violations}
    assert violated == {invariant}, [c.report for c in result.counterexamples]
    report = result.counterexamples[0].report
    assert f"streams of rank {result.counterexamples[0].ranks[0]} ({invariant})" in report
    assert "main stream" in report and ("side stream 1" in report or invariant == ASYNC_FALLBACK)


@pytest.mark.parametrize("protocol, order, invariant", MUTANTS,
                         ids=[f"{p}-{o or 'default'}" for p, o, _ in MUTANTS])
def test_without_the_race_detector_every_mutant_passes(threads_backend, monkeypatch, protocol,
                                                       order, invariant):
    """What catches a mutant is the happens-before relation: made to order every pair, no
    verdict is left (ASYNC_FALLBACK aside, which reads start's answer, not an order)."""
    from pcpcheck_spec import streams
    monkeypatch.setattr(streams, "ordered", lambda *args: True)
    result = _check(threads_backend, protocol, order, examples=40)
    assert result.holds == (invariant != ASYNC_FALLBACK)


def test_the_async_path_keeps_every_other_regime_synchronous(threads_backend):
    """Only sharded steps take the protocol; the other regimes' verdicts are the gather's."""
    result = _check(threads_backend, "", target="impl",
                    regimes=("replicated", "dcp", "draft"), examples=40)
    assert result.holds
    for regime in result.regimes:
        assert regime.checked.get(ASYNC_READ, 0) == 0


# P = 2, two decodes, CUDA-graph padding: a FULL graph captures the step, start must fall back.
CAPTURED = ('{"batch":{"regime":"sharded","pcp_size":2,"requests":[{"num_tokens":1,'
            '"prefilling":false,"context_len":1,"blocks":[0,1]},{"num_tokens":1,'
            '"prefilling":false,"context_len":2,"blocks":[2,3,4]}],"block_size":1,"interleave":1,'
            '"graph_size":2,"dp_pad":0,"pad_slot_map":false,"num_decode_tokens":null},'
            '"tensors":[{"trailing":[4],"dtype":"float32"}]}')
# The same padding with a 2-token prefill: its attention runs eagerly between graph pieces.
EAGER = CAPTURED.replace('"prefilling":false,"context_len":2', '"prefilling":true,"context_len":0')


@pytest.mark.parametrize("target, protocol", [("impl", ""), (FORK, "PCPAsyncCacheUpdate")])
def test_under_a_graph_capture_start_falls_back_and_the_gather_writes_the_replica(
        threads_backend, target, protocol):
    result = replay_case(str(target), CAPTURED, runner=threads_backend, asynchronous=protocol)
    assert result.holds
    observation = result.counterexamples and result.counterexamples[0].observation
    assert not observation
    # the fallback ran: every rank's trace says start answered False (seen through a mutant that
    # does not, on the same case)
    failed = replay_case(str(FORK), CAPTURED, runner=threads_backend,
                         asynchronous="StartsWhileCapturing")
    assert [v.invariant for v in failed.counterexamples[0].violations] == [ASYNC_FALLBACK]
    traces = [view.streams for view in failed.counterexamples[0].observation.ranks]
    assert all((STARTED, HOST) == entry[:2] and entry[3] == 1
               for trace in traces for entry in trace if entry[0] == STARTED)


def test_a_padded_step_with_a_prefill_is_not_captured(threads_backend):
    """Graph padding alone is no capture: the mutant that starts under capture holds there."""
    assert replay_case(str(FORK), EAGER, runner=threads_backend,
                       asynchronous="StartsWhileCapturing").holds
    assert not replay_case(str(FORK), CAPTURED, runner=threads_backend,
                           asynchronous="StartsWhileCapturing").holds


def test_the_report_replays_the_protocol(threads_backend, capsys):
    """The replay line names --async and a caller's order other than the default."""
    result = _check(threads_backend, "PCPAsyncCacheUpdate",
                    "start,attention,release,finish-nowait,reader")
    replay = result.counterexamples[0].replay
    assert "--async PCPAsyncCacheUpdate --async-order start,attention,release,finish-nowait,reader" in replay
    case = Case.from_json(result.counterexamples[0].case)
    again = replay_case(str(FORK), case, runner=threads_backend, asynchronous="PCPAsyncCacheUpdate",
                        async_order=("start", "attention", "release", "finish-nowait", "reader"))
    assert [v.invariant for v in again.counterexamples[0].violations] == [ASYNC_READ]


@pytest.mark.parametrize("argv, message", [
    (["--async", "Nope"], "no class Nope"),
    (["--async", "_runs"], "_runs is not a class with start and finish"),
    (["--async", "PCPAsyncCacheUpdate", "--async-order", "attention,start,release,finish,reader"],
     "start first"),
    (["--async", "PCPAsyncCacheUpdate", "--async-order", "start,attention,finish,reader"],
     "start first"),
])
def test_bad_async_options_name_the_problem(argv, message, capsys):
    from pcpcheck.faces import cli
    assert cli.main(["check", str(FORK), "--regime", "sharded", "--max-examples", "1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_several_protocol_classes_need_a_name(capsys):
    from pcpcheck.faces import cli
    assert cli.main(["check", str(FORK), "--async", "--max-examples", "1"]) == 2
    err = capsys.readouterr().err
    assert "found NoReadyWait, NoRecordStream, PCPAsyncCacheUpdate, StartsWhileCapturing" in err


def test_the_stream_model_does_not_import_torchs_compiler():
    """The deployment's modes (the stream model's dispatch mode, the device mapping's function
    mode) run without torch._dynamo, which torch would import at a mode's first op (1.6 s of
    CPU in every worker: a loaded machine pushed a gloo load past its bound). A fresh
    interpreter: this one may have imported it for another test."""
    probe = ("import sys, torch\n"
             "from pcpcheck.worker import deployment\n"
             "deployment.enter(torch.device('cpu'))\n"
             "with deployment.judged(torch.device('cpu')), deployment.on_rank():\n"
             "    torch.zeros(2, device='cuda').add(1)\n"
             "print('torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.strip() == "False", done.stdout + done.stderr[-2000:]


def test_a_protocol_that_never_starts_leaves_its_orderings_not_applicable(threads_backend,
                                                                          tmp_path):
    """A start that falls back on every step exercises no asynchronous order: those rows say n/a
    with the reason, never "ok", and the coverage table counts the fallbacks and why."""
    target = tmp_path / "never_starts.py"
    target.write_text(FORK.read_text() + "\n\nclass NeverStarts(PCPAsyncCacheUpdate):\n"
                      "    def start(self, *args):\n        return False\n")
    result = _check(threads_backend, "NeverStarts", target=target, examples=20)
    assert result.holds
    sharded = result.regimes[0]
    features = dict(sharded.features)
    assert features[ASYNC_STARTED] == 0 and features[ASYNC_DECLINED] > 0
    assert features[ASYNC_DECLINED] + features[ASYNC_CAPTURED] == sharded.cases
    assert sharded.checked[ASYNC_FALLBACK] == sharded.cases
    for invariant in (ASYNC_INPUT, ASYNC_READ, ASYNC_LIFETIME):
        assert sharded.checked.get(invariant, 0) == 0
    text = report.result_text(result)
    assert "the asynchronous protocol started on no step" in text, text
    assert f"{ASYNC_DECLINED}" in text


# --- streams judged without --async (one stream model) ----------------------------------------

CORRECT = FORK.parent / "correct.py"
# tests/zoo/correct.py's gather run on a side stream, as a fork might (no protocol): the side
# stream waits for the inputs' producer, the caller's stream for the side stream.
SIDE_STREAM = (CORRECT.read_text().replace("def _gather_prefill_cache_inputs(", "def _gather(")
               + "\n\ndef _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,\n"
                 "                                 shard_decode_requests=False):\n"
                 "    main = torch.cuda.current_stream()\n"
                 "    side = torch.cuda.Stream()\n"
                 "    side.wait_stream(main)\n"
                 "    with torch.cuda.stream(side):\n"
                 "        out = _gather(tensors, slot_mapping, num_decode_tokens,\n"
                 "                      shard_decode_requests)\n"
                 "    main.wait_stream(side)\n"
                 "    return out\n")
SIDE_STREAM_MUTANTS = [("    side.wait_stream(main)\n", ASYNC_INPUT),
                       ("    main.wait_stream(side)\n", ASYNC_LIFETIME)]


def test_a_gather_using_a_side_stream_has_its_streams_judged_in_every_regime(threads_backend,
                                                                            tmp_path):
    """Without --async: whenever a gather's file uses the stream API, every step's streams are
    judged (the orderings, counted where a side stream did work); its two missing joins each
    fail with exactly their invariant."""
    correct = tmp_path / "side_stream.py"
    correct.write_text(SIDE_STREAM)
    result = check(str(correct), max_examples=40, runner=threads_backend)
    assert result.holds
    for summary in result.regimes:
        features = dict(summary.features)
        assert features[SIDE_STREAMS] == summary.cases, (summary.regime, features)
        for invariant in (ASYNC_INPUT, ASYNC_LIFETIME):
            assert summary.checked[invariant] > 0, (summary.regime, invariant)
        assert not summary.checked.get(ASYNC_FALLBACK) and not summary.checked.get(ASYNC_READ)
    text = report.result_text(result)
    assert "ASYNC_READ under sharded: only an asynchronous protocol can break it" in text
    for line, invariant in SIDE_STREAM_MUTANTS:
        mutant = tmp_path / f"without_{invariant}.py"
        mutant.write_text(SIDE_STREAM.replace(line, ""))
        failed = check(str(mutant), regimes=(SHARDED,), max_examples=40, runner=threads_backend)
        assert {v.invariant for c in failed.counterexamples for v in c.violations} == {invariant}


def test_a_gather_whose_file_names_no_stream_api_is_not_judged_for_streams(threads_backend):
    result = check(str(CORRECT), regimes=(SHARDED,), max_examples=10, runner=threads_backend)
    assert not set(dict(result.regimes[0].features)) & {SIDE_STREAMS, MAIN_STREAM_ONLY}
    assert "ASYNC_INPUT" not in report.result_text(result)


def test_a_stream_api_the_gather_never_uses_leaves_the_orderings_not_applicable(
        threads_backend, tmp_path):
    """The protocol's file without --async: its gather uses the main stream alone, so no order
    between streams was exercised, and the rows say so."""
    result = check(str(FORK), regimes=(SHARDED,), max_examples=20, runner=threads_backend)
    assert result.holds
    (summary,) = result.regimes
    assert dict(summary.features)[MAIN_STREAM_ONLY] == summary.cases
    assert not any(summary.checked.get(i) for i in (ASYNC_FALLBACK, ASYNC_INPUT, ASYNC_READ,
                                                     ASYNC_LIFETIME))
    assert "no step's gather used a stream but the main one" in report.result_text(result)
