"""The in-process rank runner: real data movement, and no way for a target to hang it."""

from __future__ import annotations

import time

import torch

from pcpcheck.rankctx import current_group
from pcpcheck.runner import ThreadRunner
from spec.invariants import INCOMPLETE


def _incomplete(outcome) -> list[str]:
    return [entry[1] for entry in outcome.trace if entry[0] == INCOMPLETE]


def test_all_gather_is_rank_major_and_every_rank_gets_its_own_copy():
    def gather(rank):
        result = current_group().all_gather(torch.full((2,), rank), 0)
        result.add_(100 * rank)  # a rank scribbling on its result must not reach its peers
        return result

    outcomes = ThreadRunner(timeout=5).run(3, gather)
    assert [o.value.tolist() for o in outcomes] == [[0, 0, 1, 1, 2, 2], [100, 100, 101, 101, 102, 102],
                                                    [200, 200, 201, 201, 202, 202]]
    assert all(o.trace == [("all_gather", 0, (2,), "torch.int64")] for o in outcomes)


def test_a_rank_that_skips_the_collective_releases_its_peers_at_once():
    def skip(rank):
        if rank == 1:
            return "skipped"
        return current_group().all_gather(torch.zeros(1), 0)

    started = time.monotonic()
    outcomes = ThreadRunner(timeout=30).run(3, skip)
    assert time.monotonic() - started < 5  # deadlock detected, not timed out
    assert outcomes[1].value == "skipped" and not _incomplete(outcomes[1])
    for rank in (0, 2):
        assert "a peer never joined it (ranks that returned or raised instead: [1])" in _incomplete(outcomes[rank])[0]


def test_unequal_shapes_fail_the_collective_on_every_rank():
    outcomes = ThreadRunner(timeout=5).run(2, lambda rank: current_group().all_gather(torch.zeros(rank + 1), 0))
    assert all("shapes disagree" in _incomplete(o)[0] for o in outcomes)


def test_a_swallowed_abort_stays_in_the_trace():
    def swallow(rank):
        try:
            return current_group().all_gather(torch.zeros(1), 0) if rank else "left"
        except Exception:  # noqa: BLE001 - what a careless target does
            return "swallowed"

    outcomes = ThreadRunner(timeout=5).run(2, swallow)
    assert outcomes[1].value == "swallowed" and _incomplete(outcomes[1])


def test_a_hung_rank_times_out_and_the_runner_keeps_working():
    runner = ThreadRunner(timeout=0.3)

    def hang(rank):
        if rank == 0:
            time.sleep(2)
        return current_group().all_gather(torch.zeros(1), 0)

    outcomes = runner.run(2, hang)
    assert _incomplete(outcomes[0]) == ["rank 0 did not return within 0.3 s"]
    assert _incomplete(outcomes[1]) == ["rank 1 never ran: rank 0 hung first"]
    healthy = runner.run(2, lambda rank: current_group().all_gather(torch.full((1,), rank), 0))
    assert [o.value.tolist() for o in healthy] == [[0, 1], [0, 1]]


def test_errors_exits_and_prints_are_caught_per_rank(capsys):
    def hostile(rank):
        print(f"noise from rank {rank}")
        if rank == 0:
            raise SystemExit(3)
        raise ValueError("bad input")

    outcomes = ThreadRunner(timeout=5).run(2, hostile)
    assert [o.error for o in outcomes] == ["SystemExit: 3", "ValueError: bad input"]
    assert [o.output for o in outcomes] == ["noise from rank 0\n", "noise from rank 1\n"]
    assert "noise" not in capsys.readouterr().out
