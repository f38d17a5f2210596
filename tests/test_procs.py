"""Real ranks: torch.distributed processes over gloo (pcpcheck.procs).

One pool per world size (2 and 4) is shared by the file (module fixture); the tests that break a
pool (a hung or dead rank) use their own runner. Whole file: ~30-40 s on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch_dist = pytest.importorskip("torch.distributed")
if not torch_dist.is_available() or not torch_dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from pcpcheck import cli  # noqa: E402
from pcpcheck.cases import Case  # noqa: E402
from pcpcheck.engine import search  # noqa: E402
from pcpcheck.loader import load_target  # noqa: E402
from pcpcheck.procs import DeviceThreadRunner, ProcessRunner  # noqa: E402
from pcpcheck.runner import ThreadRunner  # noqa: E402
from spec.names import COLLECTIVE, REGIMES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ZOO_BUG = ROOT / "tests" / "zoo" / "bug04_truncated_slots.py"
HOSTILE = ROOT / "tests" / "hostile"
SIZES = (2, 4)
TIMEOUT = 5.0

# P=2, one 2-token prefill: every rank all_gathers once (branch B).
CASE = Case.from_json(
    '{"batch":{"regime":"sharded","pcp_size":2,"requests":[{"num_tokens":2,"prefilling":true,'
    '"context_len":0,"blocks":[0,1]}],"block_size":1,"interleave":1,"graph_size":0,"dp_pad":0,'
    '"pad_slot_map":false,"num_decode_tokens":null},"tensors":[{"trailing":[4],"dtype":"float32"}]}')


def _alive(pid: int) -> bool:
    try:
        import psutil
    except ImportError:
        try:
            os.kill(pid, 0)  # joined (reaped) processes are gone, not zombies
        except ProcessLookupError:
            return False
        return True
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


@pytest.fixture(scope="module")
def gloo():
    runner = ProcessRunner("gloo", timeout=TIMEOUT)
    runner.start(SIZES)
    yield runner
    runner.close()
    assert not [pid for pid in runner.retired_pids if _alive(pid)]


def _first_invariants(target, runner, regimes, examples=15):
    """regime -> first invariant of each counterexample (derandomized: repeatable)."""
    return {regime: [o.violations[0].invariant
                     for o in search(target, regime, runner, max_examples=examples,
                                     pcp_sizes=SIZES).counterexamples]
            for regime in regimes}


def test_bundled_impl_holds_on_gloo_ranks(gloo):
    target = load_target("impl")
    before = gloo.pids()
    for regime in REGIMES:
        result = search(target, regime, gloo, max_examples=10, pcp_sizes=SIZES)
        assert not result.counterexamples, (regime, result.counterexamples[0].violations)
        assert result.cases >= 10
    assert gloo.pids() == before  # a holding target never breaks a pool


def test_each_drawn_case_uses_a_pool_world_size(gloo):
    sizes = set()

    class Spy:
        def observe_case(self, case, target):
            sizes.add(case.batch.pcp_size)
            return gloo.observe_case(case, target)

    search(load_target("impl"), "sharded", Spy(), max_examples=15, pcp_sizes=SIZES)
    assert sizes <= set(SIZES) and sizes


def test_zoo_bug_same_invariant_as_threads(gloo):
    target = load_target(str(ZOO_BUG))
    regimes = ("sharded", "dcp")
    on_gloo = _first_invariants(target, gloo, regimes, 40)
    on_threads = _first_invariants(target, ThreadRunner(timeout=TIMEOUT), regimes, 40)
    assert on_gloo == on_threads
    assert on_gloo["sharded"][:1] == ["REPLICA"]  # as tests/test_zoo.py expects in-process


def test_skipped_collective_is_collective_without_waiting(gloo):
    target = load_target(str(HOSTILE / "skip_collective_rank1.py"))
    before = gloo.pids()
    started = time.monotonic()
    observation = gloo.observe_case(CASE, target)
    elapsed = time.monotonic() - started
    assert observation.violations[0].invariant == COLLECTIVE
    assert any("a peer never joined it" in str(entry) for entry in observation.ranks[0].trace)
    assert elapsed < TIMEOUT  # detected by the FINISHED headers, not by a timeout
    assert gloo.pids() == before  # the group stayed aligned: no teardown needed
    assert gloo.observe_case(CASE, load_target("impl")).violations == []
    threads = _first_invariants(target, ThreadRunner(timeout=TIMEOUT), ("sharded",), 10)
    assert _first_invariants(target, gloo, ("sharded",), 10) == threads == {"sharded": [COLLECTIVE]}


@pytest.mark.parametrize("hostile, message", [
    ("hang_rank1.py", "rank 1 did not return within 2 s"),
    ("die_rank1.py", "rank 1 died (exit code 3) before returning; stderr: rank 1: simulated crash"),
])
def test_hung_or_dead_rank_is_collective_and_leaves_no_process(hostile, message, monkeypatch):
    monkeypatch.setenv("PCPCHECK_HANG_SECONDS", "120")
    runner = ProcessRunner("gloo", timeout=2.0)
    try:
        runner.start([2])
        first = runner.pids()
        started = time.monotonic()
        observation = runner.observe_case(CASE, load_target(str(HOSTILE / hostile)))
        elapsed = time.monotonic() - started
        assert observation.violations[0].invariant == COLLECTIVE
        assert observation.ranks[1].trace[-1][1] == message
        assert elapsed < 2.0 + 8.0  # timeout + 1.5 s grace + teardown, with room for a loaded box
        assert not [pid for pid in first if _alive(pid)]  # torn down at once, no orphans
        # the next case gets a fresh pool
        assert runner.observe_case(CASE, load_target("impl")).violations == []
        assert set(runner.pids()).isdisjoint(first)
    finally:
        runner.close()
    assert not [pid for pid in runner.retired_pids if _alive(pid)]


def test_device_thread_runner_on_cpu():
    result = search(load_target("impl"), "sharded", DeviceThreadRunner(device="cpu"),
                    max_examples=10)
    assert not result.counterexamples


@pytest.mark.parametrize("argv, words", [
    (["--backend", "mpi"], "invalid choice"),
    (["--backend", "gloo", "--world-sizes", "1,2"], "between 2 and 8"),
    (["--backend", "gloo", "--world-sizes", "2,x"], "comma list"),
    (["--world-sizes", "9"], "between 2 and 8"),
    (["--backend", "gloo", "--device", "cuda"], "--device cuda is for --backend threads"),
])
def test_backend_usage_errors_exit_2(argv, words, capsys):
    assert cli.main(["check", *argv]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


@pytest.mark.skipif(__import__("torch").cuda.device_count() >= 2, reason="has GPUs")
def test_nccl_without_gpus_exits_2(capsys):
    assert cli.main(["check", "--backend", "nccl"]) == cli.EXIT_USAGE
    assert "needs at least 2 GPUs" in capsys.readouterr().err


def test_cli_gloo_exit_code_and_report():
    command = [sys.executable, "-m", "pcpcheck", "check", str(HOSTILE / "skip_collective_rank1.py"),
               "--backend", "gloo", "--world-sizes", "2", "--regime", "sharded",
               "--max-examples", "10", "--timeout", "5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "COLLECTIVE violated" in done.stdout
    assert "(gloo, world sizes 2)" in done.stdout
