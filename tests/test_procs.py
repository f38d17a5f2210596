"""Backends (pcpcheck.backends): the target runs in worker processes only, on threads (one
worker hosting the P ranks) and gloo (one process per rank); every way a target can misbehave
ends in a verdict, and nothing it started outlives the backend.

Module-scoped backends are shared; tests that break a worker use their own. ~60-90 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch_dist = pytest.importorskip("torch.distributed")
if not torch_dist.is_available() or not torch_dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from pcpcheck.backends import make_backend  # noqa: E402 - after the gloo check above
from pcpcheck.faces import cli  # noqa: E402 - after the gloo check above
from pcpcheck.judge.run import run_case, run_cases  # noqa: E402 - after the gloo check above
from pcpcheck.search.engine import search  # noqa: E402 - after the gloo check above
from pcpcheck.shared.case import Case  # noqa: E402 - after the gloo check above
from pcpcheck.shared.errors import LoadError  # noqa: E402 - after the gloo check above
from pcpcheck.shared.results import EXIT_USAGE  # noqa: E402 - after the gloo check above
from pcpcheck_spec.names import COLLECTIVE, REGIMES, REPLICA  # noqa: E402 - after the gloo check above

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
CASE4 = Case.from_json(CASE.to_json().replace('"pcp_size":2', '"pcp_size":4').replace(
    '"num_tokens":2', '"num_tokens":4').replace('"blocks":[0,1]', '"blocks":[0,1,2,3]'))

HEAD = "from vllm.distributed.parallel_state import get_pcp_group\n"
GATHER = """
def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    group = get_pcp_group()
    {before}
    rows = tuple(group.all_gather(t.contiguous(), dim=0) for t in tensors)
    return {returned}
"""


# the tests using the module's backends (the gloo one starts a process pool) run in one xdist worker
SHARED_BACKENDS = pytest.mark.xdist_group("procs-backends")


def _target(tmp_path, name: str, before: str = "pass", returned: str = "rows, slot_mapping",
            top: str = "") -> str:
    """A vLLM-style target file: a correct sharded gather with `before` run first on each call."""
    path = tmp_path / f"{name}.py"
    path.write_text(HEAD + textwrap.dedent(top) + GATHER.format(before=before, returned=returned))
    return str(path)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def threads():
    backend = make_backend("threads", timeout=TIMEOUT)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def gloo():
    backend = make_backend("gloo", timeout=TIMEOUT, world_sizes=SIZES)
    yield backend
    backend.close()
    assert not [pid for pid in backend.retired_pids if _alive(pid)]


def _first_invariants(target, backend, regimes, examples=15):
    """regime -> first invariant of each counterexample (derandomized: repeatable)."""
    return {regime: [o.violations[0].invariant
                     for o in search(target, regime, backend, max_examples=examples,
                                     pcp_sizes=SIZES).counterexamples]
            for regime in regimes}


@SHARED_BACKENDS
def test_bundled_impl_holds_on_both_backends(threads, gloo):
    for backend in (threads, gloo):
        target = backend.load("impl")
        before = backend.pids
        for regime in REGIMES:
            result = search(target, regime, backend, max_examples=8, pcp_sizes=SIZES)
            assert not result.counterexamples, (backend.name, regime, result.counterexamples[0].violations)
        assert backend.pids == before  # a holding target never breaks a worker


@SHARED_BACKENDS
def test_zoo_bug_same_invariant_on_both_backends(threads, gloo):
    regimes = ("sharded", "dcp")
    on_gloo = _first_invariants(gloo.load(str(ZOO_BUG)), gloo, regimes, 30)
    on_threads = _first_invariants(threads.load(str(ZOO_BUG)), threads, regimes, 30)
    assert on_gloo == on_threads
    assert on_gloo["sharded"][:1] == [REPLICA]  # as tests/test_zoo.py expects


@SHARED_BACKENDS
def test_the_driver_never_imports_the_target(threads, tmp_path):
    # At import, the target makes every predicate hold and marks the process it runs in.
    path = _target(tmp_path, "forger", top="""
        import builtins, sys
        import pcpcheck_spec.invariants as inv
        for name in ("replica", "shard", "returns", "collective_agreement"):
            setattr(inv, name, lambda *args, **kwargs: True)
        builtins.PCPCHECK_TARGET_WAS_HERE = True
        """, returned="rows, slot_mapping[:1]")  # truncated slots: REPLICA fails
    observation = run_case(CASE, threads.load(path), threads)
    assert observation.violations[0].invariant == REPLICA
    import builtins
    assert not hasattr(builtins, "PCPCHECK_TARGET_WAS_HERE")
    assert not [name for name in sys.modules if "forger" in name]


@SHARED_BACKENDS
@pytest.mark.parametrize("backend_name", ["threads", "gloo"])
def test_each_rank_has_its_own_module_instance(backend_name, threads, gloo, tmp_path):
    # Rows exchanged through a module global instead of a collective: works only if the ranks
    # share the module, which real processes never do.
    path = _target(tmp_path, "shared_global", top="""
        import torch
        BOARD = {}
        def _gather_via_global(tensors, slot_mapping):
            group = get_pcp_group()
            BOARD[group.rank_in_group] = tensors
            group.all_gather(torch.zeros(1), 0)  # a barrier, so every rank has posted
            ranks = range(group.world_size)
            return tuple(torch.cat([BOARD.get(r, tensors)[k] for r in ranks]) for k in range(len(tensors)))
        """, before="return _gather_via_global(tensors, slot_mapping), slot_mapping")
    backend = threads if backend_name == "threads" else gloo
    observation = run_case(CASE, backend.load(path), backend)
    assert REPLICA in [v.invariant for v in observation.violations]  # rows never exchanged


@SHARED_BACKENDS
def test_a_lying_tensor_subclass_does_not_fool_the_verdict(threads, tmp_path):
    path = _target(tmp_path, "liar", top="""
        import torch
        class Honest(torch.Tensor):
            def tolist(self):
                return [0, 1]  # what a correct gather would return
        """, returned="rows, slot_mapping[:1].as_subclass(Honest)")
    observation = run_case(CASE, threads.load(path), threads)
    assert observation.violations[0].invariant == REPLICA
    assert observation.ranks[0].slots == [0]


def test_timeouts_are_per_rank_on_threads(tmp_path):
    # 4 ranks x 0.4 s per call: 1.6 s in all, each rank well under its 1 s.
    path = _target(tmp_path, "slow", before="__import__('time').sleep(0.4)")
    with make_backend("threads", timeout=1.0) as backend:
        observation = run_case(CASE4, backend.load(path), backend)
    assert observation.violations == []


def test_a_worker_that_has_not_begun_a_case_is_not_overtime():
    """Before a worker writes its status (its first case not yet begun), no rank runs: a status
    file of zeros read as "rank 0 running since time 0" and blamed rank 0 of a fresh pool for a
    hang it never had (a flaky COLLECTIVE on gloo)."""
    from pcpcheck.backends.pool import Workspace
    from pcpcheck.shared.protocol import STATUS
    workspace = Workspace("status-test")
    try:
        _, status_path = workspace.files("rank")
        running, since, *_ = STATUS.unpack(Path(status_path).read_bytes())
        assert running == -1
        assert running < 0 or time.monotonic() - since < 1.0  # never overtime at once
    finally:
        workspace.remove()


def test_status_read_while_a_worker_writes_it_never_shows_a_false_hang(tmp_path):
    """The driver reads a worker's status while the worker rewrites it at every switch. It once
    saw all zeros mid-write ("rank 0 running since time 0"), a false hang that killed healthy
    pools; a reader in another process must only ever see states the worker wrote."""
    from pcpcheck.backends.pool import Workspace
    from pcpcheck.shared.protocol import FINISHED, RUNNING
    from pcpcheck.worker.main import Status
    workspace = Workspace("status-test")
    try:
        _, status_path = workspace.files("rank")
        reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import mmap, time
            from pcpcheck.backends.pool import read_status
            with open({status_path!r}, "rb") as handle:
                status = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
            bad, end = 0, time.monotonic() + 1.5
            while time.monotonic() < end:
                running, since, _, _ = read_status(status)
                bad += running >= 0 and since == 0.0
            print(bad)
            """)], stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).parent.parent))
        status = Status(status_path)
        while reader.poll() is None:
            status.begin()
            status.switch(0, RUNNING)
            status.switch(0, FINISHED)
        assert reader.stdout.read().strip() == "0"
    finally:
        workspace.remove()


def _wait_telling(status) -> tuple[dict, list]:
    """wait_results (2 s timeout) on a worker whose rank never reports, its status from
    `status()`: the outcome, and what on_slow was told."""
    from pcpcheck.backends import pool
    read_end, write_end = os.pipe()

    class Silent:
        reader = pool.wire.Reader(read_end)
        overtime = pool.WorkerProcess.overtime

    Silent.status = staticmethod(status)
    told = []
    try:
        outcome = pool.wait_results([Silent()], 2.0, 0.1,
                                    on_slow=lambda rank, seconds: told.append((rank, seconds)))
    finally:
        os.close(read_end)
        os.close(write_end)
    return outcome, told


def _running_since(since: float) -> tuple:
    from pcpcheck.shared.protocol import MAX_RANKS
    return 0, since, [0.0] * MAX_RANKS, [0] * MAX_RANKS


def test_a_rank_long_running_before_the_driver_waits_is_told_before_its_hang():
    """The driver may come to wait for a case late (it drew the next cases first, on a loaded
    machine): a rank that has already run 1.5 s of a 2 s timeout is told at once, not a second
    later, when it is already hung (CI once printed no wait for a hang)."""
    began = time.monotonic() - 1.5
    outcome, told = _wait_telling(lambda: _running_since(began))
    assert outcome == {0: ("hung", 0)}
    assert told and told[0][0] == 0 and 1.5 <= told[0][1] < 2.0, told


def test_a_rank_that_begins_just_after_the_driver_waits_is_told_before_its_hang():
    """The worker starts the case a few ms after the driver began to wait: a tell a second
    later finds 0.99 s, and a clock of whole seconds from the wait's start would next tell
    after the 2 s hang was called (CI printed no wait line for a hang, twice)."""
    from pcpcheck.shared.protocol import MAX_RANKS
    began = []

    def status():
        if not began:  # the first look: the case has not begun
            began.append(time.monotonic() + 0.05)
        if time.monotonic() < began[0]:
            return -1, 0.0, [0.0] * MAX_RANKS, [0] * MAX_RANKS
        return _running_since(began[0])

    outcome, told = _wait_telling(status)
    assert outcome == {0: ("hung", 0)}
    assert told and told[0][0] == 0 and 1.0 <= told[0][1] < 2.1, told


@pytest.mark.parametrize("backend_name", ["threads", "gloo"])
@pytest.mark.parametrize("hostile, message", [
    ("hang_rank1.py", "rank 1 did not return within 2 s"),
    ("die_rank1.py", "rank 1 died (exit code 3) before returning; stderr: rank 1: simulated crash"),
])
def test_hung_or_dead_rank_is_collective_and_leaves_no_process(backend_name, hostile, message,
                                                              monkeypatch):
    monkeypatch.setenv("PCPCHECK_HANG_SECONDS", "120")
    backend = make_backend(backend_name, timeout=2.0, world_sizes=[2])
    try:
        target = backend.load(str(HOSTILE / hostile))
        first = backend.pids
        started = time.monotonic()
        observation = run_case(CASE, target, backend)
        elapsed = time.monotonic() - started
        assert observation.violations[0].invariant == COLLECTIVE
        assert observation.ranks[1].trace[-1][1] == message
        assert elapsed < 2.0 + 8.0  # timeout + grace + teardown, with room for a loaded box
        assert not [pid for pid in first if _alive(pid)]  # torn down at once, no orphans
        impl = backend.load("impl")  # the next case gets a fresh worker, targets reloaded
        assert run_case(CASE, impl, backend).violations == []
        assert set(backend.pids).isdisjoint(first)
    finally:
        backend.close()
    assert not [pid for pid in backend.retired_pids if _alive(pid)]


def _counting_target(tmp_path, on_call: int, failure: str) -> str:
    """Rank 1 prints its call number (counted in a file, across workers) and fails on call
    number `on_call`; every call gathers (branch B of CASE)."""
    calls = tmp_path / "calls"
    return _target(tmp_path, "counting", before=(
        f"n = _count()\n    print('call', n)\n    if n == {on_call}: {failure}"), top=f"""
        def _count():
            if get_pcp_group().rank_in_group != 1:
                return 0
            with open({str(calls)!r}, "a+") as handle:
                handle.write("x")
                handle.seek(0)
                return len(handle.read())
        """)


@pytest.mark.parametrize("backend_name", ["threads", "gloo"])
@pytest.mark.parametrize("failure, message", [
    ("__import__('time').sleep(120)", "rank 1 did not return within 2 s"),
    ("__import__('os')._exit(7)", "rank 1 died (exit code 7) before returning"),
])
def test_a_rank_failing_mid_batch_costs_only_its_case(backend_name, failure, message, tmp_path):
    """Batches double from 1 case (1, 2, 4, ...): call 7 is the third case of the batch of 4.
    The cases before it keep their results, it gets the verdict naming rank 1, and the cases
    after it run once each, on a fresh worker or pool, their output captured per case."""
    backend = make_backend(backend_name, timeout=2.0, world_sizes=[2])
    try:
        target = backend.load(_counting_target(tmp_path, 7, failure))
        first = backend.pids
        observations = list(run_cases([CASE] * 12, target, backend))
        assert [bool(o.violations) for o in observations] == [False] * 6 + [True] + [False] * 5
        assert observations[6].violations[0].invariant == COLLECTIVE
        assert observations[6].ranks[1].trace[-1][1].startswith(message)
        for number, observation in enumerate(observations, 1):
            if number != 7:
                assert observation.ranks[1].output == f"call {number}\n"
                assert observation.ranks[1].inputs_after == observation.ranks[1].inputs_before
        assert (tmp_path / "calls").read_text() == "x" * 12  # no case ran twice
        assert set(backend.pids).isdisjoint(first)
        assert not [pid for pid in first if _alive(pid)]
    finally:
        backend.close()


@SHARED_BACKENDS
@pytest.mark.parametrize("backend_name", ["threads", "gloo"])
def test_a_collective_skipped_mid_batch_fails_only_its_case(backend_name, threads, gloo, tmp_path):
    """Rank 1 returns without gathering in case 5 (the second of the batch of 4) and goes on to
    case 6 while rank 0 waits in case 5's gather: rank 0's gather is aborted (on gloo: rank 1's
    header says it is past case 5), and every other case is clean."""
    backend = threads if backend_name == "threads" else gloo
    target = backend.load(_counting_target(tmp_path, 5, "return tensors, slot_mapping"))
    observations = list(run_cases([CASE] * 12, target, backend))
    assert [bool(o.violations) for o in observations] == [False] * 4 + [True] + [False] * 7
    collective = [v for v in observations[4].violations if v.invariant == COLLECTIVE]
    assert collective and collective[0].ranks == [0, 1]  # 0 never completed it, 1 never issued it
    assert (tmp_path / "calls").read_text() == "x" * 12


@pytest.mark.parametrize("backend_name", ["threads", "gloo"])
def test_a_stream_abandoned_midway_leaves_the_workers_usable(backend_name, tmp_path):
    """A consumer that stops early (a deadline, a violation) leaves cases in flight: the next
    run drains their results, on the same workers, and gets its own."""
    backend = make_backend(backend_name, timeout=TIMEOUT, world_sizes=[2])
    try:
        target = backend.load(_counting_target(tmp_path, 0, "pass"))
        first = backend.pids
        stream = run_cases([CASE] * 40, target, backend)
        assert [next(stream).violations for _ in range(3)] == [[], [], []]
        del stream
        observation = run_case(CASE, target, backend)
        assert observation.violations == []
        calls = len((tmp_path / "calls").read_text())
        assert 3 + 1 < calls < 40 + 1  # more were in flight than consumed, not all of them
        assert observation.ranks[1].output == f"call {calls}\n"  # its own result, not a stale one
        assert backend.pids == first
    finally:
        backend.close()


@SHARED_BACKENDS
def test_exit_zero_in_a_call_is_a_verdict_and_at_import_a_load_error(threads, tmp_path):
    path = _target(tmp_path, "exits", before="if group.rank_in_group == 1: __import__('os')._exit(0)")
    observation = run_case(CASE, threads.load(path), threads)
    assert observation.violations[0].invariant == COLLECTIVE
    assert observation.ranks[1].trace[-1][1] == "rank 1 died (exit code 0) before returning"
    with pytest.raises(LoadError, match="exit code 0"):
        threads.load(_target(tmp_path, "exits_at_import", top="import os\nos._exit(0)\n"))
    assert run_case(CASE, threads.load("impl"), threads).violations == []


def test_a_hang_at_import_is_a_bounded_load_error(tmp_path):
    from pcpcheck.backends.threads import ThreadsBackend
    with ThreadsBackend(timeout=1.0, load_timeout=2.0) as backend:
        started = time.monotonic()
        with pytest.raises(LoadError, match="within 2 s"):
            backend.load(_target(tmp_path, "loops", top="while True:\n    pass\n"))
        assert time.monotonic() - started < 10


@SHARED_BACKENDS
@pytest.mark.parametrize("backend_name", ["threads", "gloo"])
def test_output_is_captured_per_rank_at_the_fd_level(backend_name, threads, gloo, tmp_path, capfd):
    path = _target(tmp_path, "noisy_fd", before=(
        "__import__('os').write(1, b'raw from rank %d\\n' % group.rank_in_group); "
        "print('printed by rank', group.rank_in_group)"))
    backend = threads if backend_name == "threads" else gloo
    observation = run_case(CASE, backend.load(path), backend)
    for rank in (0, 1):
        assert observation.ranks[rank].output == f"raw from rank {rank}\nprinted by rank {rank}\n"
    assert "raw from rank" not in capfd.readouterr().out


def test_nothing_a_target_started_outlives_the_backend(tmp_path):
    marker = tmp_path / "pids"
    path = _target(tmp_path, "spawner", before="_spawn()", top=f"""
        import os, threading, time
        def _spawn():
            threading.Thread(target=time.sleep, args=(600,)).start()  # non-daemon
            if os.fork() == 0:  # a child, and a grandchild in a session of its own
                os.setsid()
                if os.fork() == 0:
                    with open({str(marker)!r}, "a") as out:
                        out.write(f"{{os.getpid()}}\\n")
                    time.sleep(600)
                os._exit(0)
        """)
    backend = make_backend("threads", timeout=TIMEOUT)
    workspace = backend._workspace.path
    run_case(CASE, backend.load(path), backend)
    deadline = time.monotonic() + 10
    while (not marker.exists() or len(marker.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    escaped = [int(pid) for pid in marker.read_text().split()]
    assert escaped and all(_alive(pid) for pid in escaped)
    worker = backend.pids[0]
    backend.close()
    time.sleep(0.2)
    assert not [pid for pid in [worker, *escaped] if _alive(pid)]
    assert not os.path.exists(workspace)


# --- the fork server (pcpcheck.backends.forkserver) -------------------------------------------
@pytest.fixture
def own_fork_server(monkeypatch):
    """A fork server of this test's own: the process's one serves workers other tests hold."""
    from pcpcheck.backends import pool
    from pcpcheck.backends.forkserver import ForkServer
    server = ForkServer()
    monkeypatch.setattr(pool, "FORK_SERVER", server)
    yield server
    server.stop()


def test_a_worker_starts_in_the_drivers_environment_and_directory_of_now(threads, tmp_path,
                                                                        monkeypatch):
    # the server (and the module's threads worker) started in another environment and directory
    assert run_case(CASE, threads.load("impl"), threads).violations == []
    monkeypatch.setenv("PCPCHECK_TEST_MARK", "set after the server started")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "helper_in_cwd.py").write_text("WHERE = 'the directory of now'\n")
    path = _target(tmp_path, "environ", before=(
        "import os; from helper_in_cwd import WHERE; "
        "print(os.environ.get('PCPCHECK_TEST_MARK'), os.getcwd(), WHERE)"))
    backend = make_backend("threads", timeout=TIMEOUT)
    try:
        observation = run_case(CASE, backend.load(path), backend)
    finally:
        backend.close()
    assert observation.violations == []
    assert observation.ranks[0].output == f"set after the server started {tmp_path} the directory of now\n"


def test_a_fork_server_killed_from_outside_is_replaced(own_fork_server):
    import signal
    backend = make_backend("threads", timeout=TIMEOUT)
    try:
        assert run_case(CASE, backend.load("impl"), backend).violations == []
        first_server, first_worker = own_fork_server.pid, backend.pids[0]
        os.kill(first_server, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _alive(first_worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(first_worker)  # its workers die with it
        # the case sent to the dead worker gets its verdict; the next worker comes from a new server
        dead = run_case(CASE, backend.load("impl"), backend)
        assert dead.violations[0].invariant == COLLECTIVE
        assert "killed with pcpcheck's fork server, which is gone" in dead.ranks[0].trace[-1][1]
        assert run_case(CASE, backend.load("impl"), backend).violations == []
        assert own_fork_server.pid not in (None, first_server)
    finally:
        backend.close()


def test_a_fork_server_that_cannot_start_is_a_one_line_error(own_fork_server, tmp_path, monkeypatch):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch in this environment')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    backend = make_backend("threads", timeout=TIMEOUT)
    try:
        with pytest.raises(LoadError, match=r"fork server did not start \(ImportError: no torch in"):
            backend.load("impl")
    finally:
        backend.close()


@pytest.mark.parametrize("argv, words", [
    (["--backend", "mpi"], "invalid choice"),
    (["--backend", "gloo", "--world-sizes", "1,2"], "between 2 and 8"),
    (["--backend", "gloo", "--world-sizes", "2,x"], "comma list"),
    (["--world-sizes", "9"], "between 2 and 8"),
    (["--backend", "gloo", "--device", "cuda"], "--device cuda is for --backend threads"),
    (["--timeout", "nan"], "--timeout must be positive and finite"),
    (["--timeout", "inf"], "--timeout must be positive and finite"),
    (["--timeout", "0"], "--timeout must be positive and finite"),
])
def test_backend_usage_errors_exit_2(argv, words, capsys):
    assert cli.main(["check", *argv]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


@pytest.mark.skipif(__import__("torch").cuda.device_count() >= 2, reason="has GPUs")
def test_nccl_without_gpus_exits_2(capsys):
    assert cli.main(["check", "--backend", "nccl"]) == EXIT_USAGE
    assert "needs at least 2 GPUs" in capsys.readouterr().err


def test_cli_gloo_exit_code_and_report():
    command = [sys.executable, "-m", "pcpcheck", "check", str(HOSTILE / "skip_collective_rank1.py"),
               "--backend", "gloo", "--world-sizes", "2", "--regime", "sharded",
               "--max-examples", "10", "--timeout", "5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "COLLECTIVE violated" in done.stdout
    assert "(gloo, world sizes 2)" in done.stdout


def test_torchrun_prints_only_the_report_and_exits_with_the_verdict(tmp_path):
    """Under torchrun (through pcpcheck's launcher) a violation is rank 0's report and exit 1:
    no torch traceback or ChildFailedError block, nothing from the other ranks."""
    command = [sys.executable, "-m", "pcpcheck.faces.torchrun", "--standalone", "--nproc-per-node", "2",
               "--", str(ROOT / "tests" / "zoo" / "bug01_local_block.py"), "--regime",
               "replicated", "--max-examples", "30", "--json", str(tmp_path / "out.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("pcpcheck: torchrun, 2 ranks") == 1  # rank 0 alone prints
    assert "REPLICA violated on rank(s) [1] (regime replicated)" in done.stdout
    usage = subprocess.run([sys.executable, "-m", "pcpcheck.faces.torchrun", "--standalone"],
                           capture_output=True, text=True, timeout=60)
    assert (usage.returncode, usage.stderr.count("\n")) == (2, 1)


@pytest.mark.parametrize("ranks", [3, 4])
def test_torchrun_runs_every_case_at_the_world_size_it_launched(ranks, tmp_path):
    """The search draws and shrinks P only to torchrun's world: a real bug is exit 1 with its
    ID at that size (a shrink to P = 2 once made it a usage error, exit 2)."""
    out = tmp_path / "out.json"
    command = [sys.executable, "-m", "pcpcheck.faces.torchrun", "--standalone", "--nproc-per-node",
               str(ranks), "--", str(ROOT / "tests" / "zoo" / "bug01_local_block.py"), "--regime",
               "replicated", "--max-examples", "30", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    (first,) = [c for c in json.loads(out.read_text())["counterexamples"] if c["folded_into"] is None]
    assert (first["invariant"], first["case"]["batch"]["pcp_size"]) == (REPLICA, ranks)


def test_torchrun_two_nodes_only_the_driver_node_prints(tmp_path):
    """Two launchers meeting at a loopback master (torchrun's static rendezvous), as two
    machines would: the node with rank 0 prints the report, the other prints nothing; both exit
    with the verdict."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def node(rank: int) -> list[str]:
        return [sys.executable, "-m", "pcpcheck.faces.torchrun", "--nnodes", "2", "--nproc-per-node",
                "1", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port",
                str(port), "--", str(ROOT / "tests" / "zoo" / "bug01_local_block.py"),
                "--regime", "replicated", "--max-examples", "30"]
    nodes = [subprocess.Popen(node(rank), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path) for rank in range(2)]
    outputs = [node.communicate(timeout=180) for node in nodes]
    assert [node.returncode for node in nodes] == [1, 1]
    assert [err for _, err in outputs] == ["", ""]
    assert "REPLICA violated on rank(s) [1]" in outputs[0][0] and outputs[1][0] == ""


@SHARED_BACKENDS
def test_an_asynchronous_protocol_is_judged_alike_on_both_backends(threads, gloo):
    """The CPU model of CUDA streams runs in a gloo rank's process as in the threads worker:
    impl's protocol holds on both, and a side stream that skips its wait for the ready event
    fails ASYNC_INPUT on both (tests/test_async.py has the rest)."""
    from pcpcheck.shared.protocol import async_function
    from pcpcheck_spec.names import ASYNC_INPUT, ASYNC_ORDER
    fork = str(ROOT / "tests" / "zoo" / "async_fork.py")
    for backend in (threads, gloo):
        impl = backend.load("impl", async_function(None, "", ASYNC_ORDER))
        assert not search(impl, "sharded", backend, max_examples=12, pcp_sizes=SIZES).counterexamples
        mutant = backend.load(fork, async_function(None, "NoReadyWait", ASYNC_ORDER))
        found = search(mutant, "sharded", backend, max_examples=12, pcp_sizes=SIZES).counterexamples
        assert [o.violations[0].invariant for o in found] == [ASYNC_INPUT], backend.name
