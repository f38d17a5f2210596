"""Hypothesis profiles: `ci` (deterministic, what CI runs), `dev` (quick, random), `thorough`.

Picked by HYPOTHESIS_PROFILE; under CI=true the default is `ci`, else `dev`.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=200,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=30,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


# .ci/run's stage that installs the kernels extra sets it: there a missing triton fails the tests
# that need it, where a newcomer's run (the README's command, no extra) skips them.
REQUIRE_KERNELS = "PCPCHECK_REQUIRE_KERNELS"


def pytest_runtest_setup(item):
    """A test marked `kernels` (it runs a release's triton kernels) skips, naming the extra, where
    triton is not installed."""
    import importlib.util

    if item.get_closest_marker("kernels") is None or importlib.util.find_spec("triton"):
        return
    if os.environ.get(REQUIRE_KERNELS):
        pytest.fail(f"triton is missing where {REQUIRE_KERNELS} is set: .ci/run installs "
                    "pcpcheck[kernels] for this stage", pytrace=False)
    pytest.skip("needs the kernels extra (triton): pip install 'pcpcheck[kernels]'")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two test processes per core. Many tests mostly wait (on a worker's timeout, a
    pcpcheck subprocess, a hang being detected); a second process per core fills that time."""
    return 2 * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@pytest.fixture(scope="session")
def runner():
    """One in-process rank scheduler for the session (trusted code: impl only)."""
    from pcpcheck.worker.runner import ThreadRunner

    return ThreadRunner()


@pytest.fixture(scope="session")
def threads_backend():
    """One threads backend for the session's well-behaved targets: each backend a check starts
    costs a worker (forked by the fork server) and a load of the target, and the first one in a
    test process a fork server importing torch (about 1.2 s)."""
    from pcpcheck.backends import make_backend

    with make_backend("threads") as backend:
        yield backend


@pytest.fixture
def pcpcheck_check(threads_backend):
    """`pcpcheck check ARGV` as the command line runs it, on the session's threads backend;
    returns the exit code (a usage or load error raises: main() turns those into exit 2)."""
    from pcpcheck.faces import commands, options

    return lambda argv: commands.run_check(options.parse(["check", *map(str, argv)]), threads_backend)


STALL_SECONDS = 60.0  # wall seconds in which gloo workers that use no CPU at all are hung
CPU_SECONDS = 300.0  # CPU seconds past which gloo workers are spinning, not working


def _cpu_seconds(pids) -> float:
    """CPU time (user + system, every thread) the live processes have used."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def spawn_gloo():
    """Run `worker(rank, port, *args)` on `nprocs` spawned processes that meet on a free loopback
    port; the test fails, killing them, if they hang. No wall-clock deadline (a loaded machine
    can exceed any): hung is STALL_SECONDS in which they used no CPU (blocked on each other),
    or more than CPU_SECONDS of CPU in all (a loop)."""
    import socket
    import time

    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")

    def spawn(worker, nprocs: int, *args) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ctx = mp.spawn(worker, args=(port, *args), nprocs=nprocs, join=False)
        used, progressed = 0.0, time.monotonic()
        while not ctx.join(timeout=1):
            now_used = _cpu_seconds(p.pid for p in ctx.processes if p.is_alive())
            if now_used > used + 0.01:
                used, progressed = max(used, now_used), time.monotonic()
            stalled = time.monotonic() - progressed > STALL_SECONDS
            if stalled or used > CPU_SECONDS:
                for process in ctx.processes:
                    if process.is_alive():
                        process.kill()
                pytest.fail("gloo workers hung: " + (f"no CPU used for {STALL_SECONDS:g} s" if stalled
                                                     else f"over {CPU_SECONDS:g} s of CPU"))

    return spawn


def _release_wheel(version: str):
    """A vLLM release's wheel, fetched at test time into pcpcheck's wheel cache, once (a copy per
    module, through pip's own cache, cost each module seconds of CPU)."""
    from pcpcheck.shared.errors import SourceError
    from pcpcheck.shared.source import fetch_release

    try:
        return fetch_release(version)
    except SourceError as exc:
        pytest.fail(f"cannot fetch vllm=={version} from the package registry: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def wheel():
    return _release_wheel("0.33.0")


@pytest.fixture(scope="session")
def wheel_0_34():
    return _release_wheel("0.34.0")
