"""What the release path keeps between launches, ranks and steps gives what fresh work gives
(issue 45): triton's interpreter patches found once and replayed per launch, its overflow checks
skipped where they assert nothing, each builtin's type-level work planned once per signature
(pcpcheck.worker.release_interpreter), the worker's per-step facts and the driver's reference
work made once per step. Each test compares against the fresh computation, never a time.
"""

from __future__ import annotations

import dataclasses
import random
import types

import numpy as np
import pytest
import torch

import pcpcheck_reference as reference
from pcpcheck.judge.release_case import expected_views, reference_view
from pcpcheck.shared.protocol import Capabilities
from pcpcheck.shared.step_inputs import dummy_tokens, global_maps
from pcpcheck_reference import ERA_CURRENT
from pcpcheck_spec.invariants import layout_conformance
from pcpcheck_spec.names import DCP, REPLICATED, SHARDED, Batch, Request

pytestmark = pytest.mark.xdist_group("vllm_0_34_0_wheel")

STEPS = (
    Batch(DCP, 3, (Request(1, False, 4, (2, 7)), Request(6, True, 1, (3, 5))), 2, 1, 5),
    Batch(DCP, 2, (Request(3, True, 0, (1,)), Request(1, False, 2, (4,))), 4, 2),
    Batch(SHARDED, 2, (Request(1, False, 3, (6,)), Request(5, True, 0, (1, 2))), 4, 1, 6),
    Batch(REPLICATED, 3, (Request(2, True, 0, (9,)),), 2),
)


def _fresh_view(batch: Batch, caps: Capabilities, rank: int) -> dict:
    """Rank `rank`'s expected view made from nothing (what judge_release_case built per rank)."""
    view = reference_view(batch, caps.era, caps.replicated_method)
    lay = reference.layout(batch, era=caps.era)
    view["expanded"] = [reference.expand_slot_mapping(lay.gidx, lay.wmask, group).tolist()
                        for group in global_maps(batch, rank if batch.regime == DCP else 0,
                                                 caps.replicated_kv_group)]
    view["dummy_slots"] = [[-1] * dummy_tokens(batch, caps)] * 2
    return view


@pytest.mark.parametrize("replicated_kv_group", [False, True])
@pytest.mark.parametrize("batch", STEPS, ids=lambda b: f"{b.regime}-P{b.pcp_size}")
def test_the_driver_reference_made_once_per_step_is_each_ranks_own(batch, replicated_kv_group):
    """expected_views lays the step out once and shares what every rank sees; each rank's
    expanded maps are its own DCP rank's (asked out of order, and again)."""
    caps = Capabilities(era=ERA_CURRENT, manager_shards=True, gather_shard=True,
                        wrapper_shard_keyword=None, graph_padding=True, replicated_method=True,
                        replicated_kv_group=replicated_kv_group, dummy_requests=True)
    views = expected_views(batch, caps)
    ranks = [*reversed(range(batch.pcp_size)), 0]
    for rank in ranks:
        assert views(rank) == _fresh_view(batch, caps, rank), rank
    if batch.regime == DCP:  # a map shared across DCP ranks would have passed the loop only here
        assert views(0)["expanded"] != views(1)["expanded"]


# --- triton's interpreter: what the worker changes about it ----------------------------------


def _kernels():
    """(triton.language, a jit kernel: tests/interpreted_kernels.py) in interpreter mode."""
    from pcpcheck.worker.release_kernels import import_triton

    loaded = import_triton()
    if loaded is None:
        pytest.skip("needs the kernels extra (triton)")
    from tests import interpreted_kernels

    return loaded[1], interpreted_kernels.scale


def _launch(kernel, values: list[int], factor: int) -> list[int]:
    src = torch.tensor(values, dtype=torch.int32)
    dst = torch.zeros_like(src)
    kernel[(2,)](src, dst, factor, len(values), BLOCK=4)
    return dst.tolist()


def _wrapped(values: list[int], factor: int) -> list[int]:
    """int32 x * factor + 7 - 1, wrapping as the device does."""
    return (np.array(values, dtype=np.int64) * factor + 6).astype(np.int32).tolist()


@pytest.mark.kernels
def test_interpreter_patches_are_replayed_per_launch_and_restored_after():
    """Launches after launches (a helper called inside each) compute what the first did, and
    between launches triton.language is triton's own: its builtins refuse a call from outside a
    kernel, as before any launch."""
    tl, kernel = _kernels()
    first = _launch(kernel, [1, 2, 3, 4, 5], 3)
    other = _launch(kernel, [9, -4, 0], -2)
    assert first == _wrapped([1, 2, 3, 4, 5], 3) and other == _wrapped([9, -4, 0], -2)
    assert _launch(kernel, [1, 2, 3, 4, 5], 3) == first
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)
    with pytest.raises(ValueError, match="_semantic"):
        tl.program_id(0)


@pytest.mark.kernels
def test_overflow_checks_are_skipped_only_where_they_assert_nothing():
    """With this triton's options (no debug) its overflow checks end in a device_assert that
    asserts nothing: a kernel wrapping past 2**31 gives the same values with the checks as
    without. Where device_assert does assert, the checks stay on."""
    from triton.runtime import interpreter

    from pcpcheck.worker import release_interpreter

    tl, kernel = _kernels()
    builder = interpreter.interpreter_builder
    skipped = builder.options
    assert not skipped.sanitize_overflow and not skipped.debug
    values, factor = [2**30, -(2**30), 5, 2**31 - 1, 1], 4
    try:
        builder.options = dataclasses.replace(skipped, sanitize_overflow=True)
        checked = _launch(kernel, values, factor)
    finally:
        builder.options = skipped
    assert _launch(kernel, values, factor) == checked == _wrapped(values, factor)

    def asserting(cond, msg, mask):
        raise AssertionError(msg)

    strict = types.SimpleNamespace(
        interpreter_builder=types.SimpleNamespace(options=dataclasses.replace(
            skipped, sanitize_overflow=True)),
        interpreter_semantic=types.SimpleNamespace(device_assert=asserting),
        TensorHandle=interpreter.TensorHandle)
    release_interpreter._skip_inert_overflow_checks(strict, tl)
    assert strict.interpreter_builder.options.sanitize_overflow


def _plans():
    from triton.runtime import interpreter

    return interpreter._pcpcheck_plans


@pytest.mark.kernels
def test_planned_builtins_compute_what_triton_computes():
    """Launches with plans (each builtin's first call per signature recorded, its builder calls
    replayed on later calls' handles) equal the same launches by triton's own builtins, over
    many inputs: int32 wrapping, a jit helper, a handle given twice, an int64 promotion, a
    where, a loop on a loaded bound, and a scalar `other` whose value the interpreter's load
    reads to decide whether one is given (that call is never planned: a plan of it made with
    `other` 0 would fill 0 where 5 is asked)."""
    _, scale = _kernels()
    from tests import interpreted_kernels

    plans = _plans()
    rng = np.random.default_rng(45)

    def launches(values: list[int], factor: int, shift: int, other: int) -> list[list[int]]:
        src = torch.tensor(values, dtype=torch.int32)
        picked, scalars = torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int32)
        interpreted_kernels.mixed[(2,)](src, picked, len(values), shift, BLOCK=4)
        interpreted_kernels.scalar_other[(8,)](src, scalars, len(values), other)
        return [_launch(scale, values, factor), picked.tolist(), scalars.tolist()]

    recorded = plans.recorded
    for trial in range(40):
        values = rng.integers(-2**31, 2**31, size=int(rng.integers(1, 8))).tolist()
        values[0] = int(rng.integers(0, 9))  # the loop's bound
        factor, shift = int(rng.integers(-9, 9)), int(rng.integers(-2**40, 2**40))
        other = (0, 5, -3)[trial % 3]
        with plans.off():
            own = launches(values, factor, shift, other)
        assert launches(values, factor, shift, other) == own, trial
    assert plans.recorded > recorded  # the launches were planned: each signature once
    assert plans.recorded - recorded < 40 * 10


# --- the worker: a release's steps one after another ----------------------------------------


@pytest.mark.kernels
def test_a_step_after_other_steps_is_laid_out_as_the_first_time(release_0_34):
    """The worker's manager views of steps through the release's kernels (filled tables and
    results kept, per-step facts kept, interpreter patches replayed), asked again after the
    other steps, rank order reversed, equal the first ones, and each equals the reference's
    (LAYOUT: 0.34.0 holds, so a view left stale by an earlier step would differ)."""
    from pcpcheck.worker.release_code import kernel_step, manager_view

    # the sharded step again as replicated: D = 1 in both, its filled block tables and slot
    # kernel results reused
    steps = [*STEPS, dataclasses.replace(STEPS[2], regime=REPLICATED)]
    release = release_0_34
    assert all(kernel_step(release, step) for step in steps)
    seen = [[manager_view(release, step, rank) for rank in range(step.pcp_size)]
            for step in steps]
    launches = release.kernels.launches
    again = [[manager_view(release, step, rank) for rank in reversed(range(step.pcp_size))][::-1]
             for step in reversed(steps)][::-1]
    assert _plain(again) == _plain(seen)
    assert release.kernels.launches == launches  # the second time, every result was reused
    for step, views in zip(steps, seen):
        expected = expected_views(step, release.caps)
        for rank, (view, _) in enumerate(views):
            assert layout_conformance(expected(rank), view), (step, rank)


@pytest.fixture(scope="module")
def release_0_34(wheel_0_34):
    """0.34.0 loaded once for the module (a process loads a release's modules once: torch
    keeps what they register)."""
    from pcpcheck.worker.release_code import load_release

    return load_release(str(wheel_0_34))


def _drawn_steps(release, count: int, seed: int) -> list[Batch]:
    """`count` steps of the expanded regimes as the strategy draws them and the release would
    see them (its era, its batch order), P <= 4."""
    from pcpcheck.search.draw import draw_case
    from pcpcheck.search.release_search import era_case
    from pcpcheck.worker.release_step import in_release_order

    rng, steps = random.Random(seed), []
    while len(steps) < count:
        drawn, _ = draw_case(rng, regimes=(SHARDED, REPLICATED, DCP), max_ranks=4)
        case = era_case(drawn, release.caps)
        if case is not None:
            steps.append(in_release_order(case, release)[0].batch)
    return steps


@pytest.mark.kernels
def test_the_release_kernels_planned_lay_steps_out_as_triton_own(release_0_34):
    """Every rank's manager view of 60 drawn steps (graph padding and its dummy request,
    interleaves, both KV groups), made with plans and made by triton's own builtins, each from
    empty caches (no filled block tables, no kernel result kept), are equal: the slot kernel and
    the staged writes that fill the block tables, as 0.34.0 ships them."""
    from pcpcheck.worker.release_code import kernel_step, manager_view

    release = release_0_34
    steps = _drawn_steps(release, 60, seed=45)
    assert all(kernel_step(release, step) for step in steps)

    def views():
        release.kernels._filled.clear()
        return [[manager_view(release, step, rank) for rank in range(step.pcp_size)]
                for step in steps]

    with _plans().off():
        own = views()
    assert _plain(views()) == _plain(own)


def _plain(views) -> list:
    return [[(view, dataclasses.asdict(local)) for view, local in step] for step in views]
