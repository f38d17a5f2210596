"""The recorder plugin (pcpcheck.vllm_plugin) on vLLM 0.33.0's own code, as pcpcheck loads it
from the wheel: found through pyproject.toml's `vllm.general_plugins` entry point by 0.33.0's own
plugin loader (`vllm/plugins/__init__.py`, read from the wheel, `vllm.envs` stood in), it patches
the release's manager and MLA wrapper; steps driven through them on every rank (threads, a
barrier all_gather) are recorded, and `--steps` replays the recording to the same verdict and the
same integers; 0.29.0's batch-order step, whose collective fails, is on disk and replays
COLLECTIVE."""

from __future__ import annotations

import importlib.metadata
import json
import random
import sys
import threading
import tomllib
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pcpcheck import vllm_plugin as record
from pcpcheck.api import check_steps
from pcpcheck.search.release_search import release_order
from pcpcheck.search.step_replay import MLA_TENSORS
from pcpcheck.shared.case import Case
from pcpcheck.shared.errors import SourceError
from pcpcheck.shared.recording import OUTPUTS, read_lines
from pcpcheck.shared.source import fetch_release, resolve
from pcpcheck.worker import release_step as step_module
from pcpcheck.worker.rankctx import bound_group
from pcpcheck.worker.release_code import release_from_spec
from pcpcheck.worker.release_step import rank_step
from pcpcheck_spec.names import COLLECTIVE, DCP, DRAFT, REPLICATED, SHARDED, Batch, Request

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 16


class BarrierGroup:
    """A PCP group of threads: all_gather is the rank-major concatenation of equal shapes."""

    def __init__(self, size: int):
        self.world_size, self.parts, self.barrier = size, [None] * size, threading.Barrier(size)

    def rank(self, rank: int):
        group = types.SimpleNamespace(world_size=self.world_size, rank_in_group=rank,
                                      trace=[])  # as pcpcheck's rank groups: rank_step reads it
        group.all_gather = lambda tensor, dim=0: self._all_gather(rank, tensor, dim)
        return group

    def _all_gather(self, rank, tensor, dim):
        self.parts[rank] = tensor
        self.barrier.wait()
        shapes = {tuple(part.shape) for part in self.parts}
        out = torch.cat(self.parts, dim=dim) if len(shapes) == 1 else None
        self.barrier.wait()
        if out is None:  # a real collective hangs or crashes here
            raise RuntimeError(f"all_gather: shapes disagree across ranks: {sorted(shapes)}")
        return out


def wheel(version: str = "0.33.0"):
    try:
        return fetch_release(version)
    except SourceError as exc:
        pytest.fail(f"cannot fetch vllm=={version}: {exc}", pytrace=False)


def drawn_steps(count: int, pcp: int, seed: int = 5):
    """Random steps in the release's batch order on P ranks (a server's P is fixed), each
    regime in turn, every other one padded to a CUDA-graph size."""
    rng = random.Random(seed)
    steps = []
    for n in range(count):
        regime = (SHARDED, REPLICATED, DCP)[n % 3]
        requests, next_block = [], 0
        for _ in range(rng.randint(1, 4)):
            prefilling = rng.random() < 0.5
            q = rng.randint(1, 20) if prefilling else 1
            ctx = rng.randint(0, 40)
            span = BLOCK * (pcp if regime == DCP else 1)
            blocks = tuple(range(next_block, next_block + (ctx + q - 1) // span + 1))
            next_block += len(blocks)
            requests.append(Request(q, prefilling, ctx, blocks))
        graph = sum(r.num_tokens for r in requests) + 2 if n % 2 else 0  # CUDA-graph padding
        steps.append(Case(release_order(Batch(regime, pcp, tuple(requests), BLOCK,
                                              graph_size=graph)), MLA_TENSORS))
    return steps


def drawn_draft_steps(count: int, pcp: int, seed: int = 7):
    """Random later draft steps (one token per request, D = 1), some DP-padded, with padded
    maps or not."""
    rng = random.Random(seed)
    steps = []
    for _ in range(count):
        contexts = [rng.randint(0, 40) for _ in range(rng.randint(1, 4))]
        requests, next_block = [], 0
        for ctx in contexts:
            blocks = tuple(range(next_block, next_block + ctx // BLOCK + 1))
            next_block += len(blocks)
            requests.append(Request(1, False, ctx, blocks))
        pad = rng.choice((0, 0, 2))
        steps.append(Case(Batch(DRAFT, pcp, tuple(requests), BLOCK, dp_pad=pad,
                                pad_slot_map=bool(pad) and rng.random() < 0.5), MLA_TENSORS))
    return steps


def draft_inputs(release, batch: Batch, rank: int) -> None:
    """What the speculator does before each later draft step's model call: the rank's own
    PCPManager hands the draft model the global input buffers (its get_draft_input_buffers)."""
    manager = release.manager(pcp_world_size=batch.pcp_size, pcp_rank=rank,
                              device=torch.device("cpu"), shard_decode_requests=False)
    rows = len(batch.requests) + batch.dp_pad
    buffers = types.SimpleNamespace(
        positions=torch.tensor([r.context_len for r in batch.requests] + [0] * batch.dp_pad),
        is_padding=torch.arange(rows) >= len(batch.requests))
    assert manager.get_draft_input_buffers(buffers, rows)[0] is buffers  # a later draft step


@pytest.fixture
def plugins_loader(monkeypatch):
    """0.33.0's vllm/plugins/__init__.py from the wheel, with `vllm.envs` stood in, discovering
    the entry points pyproject.toml declares (an installed pcpcheck's metadata says the same)."""
    with zipfile.ZipFile(wheel()) as archive:
        source = archive.read("vllm/plugins/__init__.py").decode()
    vllm = types.ModuleType("vllm")
    vllm.envs = types.SimpleNamespace(VLLM_PLUGINS=None)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.envs", vllm.envs)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    points = importlib.metadata.EntryPoints(
        importlib.metadata.EntryPoint(name, value, group)
        for group, entries in declared.items() for name, value in entries.items())
    installed_points = importlib.metadata.entry_points  # triton, loaded later, asks for all
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **params: (
        points.select(**params) if "group" in params else installed_points(**params)))
    module = types.ModuleType("vllm.plugins")
    exec(compile(source, "vllm/plugins/__init__.py", "exec"), module.__dict__)
    return module


def recorded_through(version, cases, tmp_path, monkeypatch, plugins_loader):
    """Drive `cases` through the release's own path (rank_step on every rank, threads) with the
    recorder loaded by vLLM's plugin loader; (spec, each case's integers per rank, the
    recording's integers per step and rank)."""
    spec = resolve(str(wheel(version))).spec()
    release = release_from_spec(spec)  # the objects rank_step below drives
    monkeypatch.setitem(sys.modules, record.MANAGER_MODULE,
                        types.SimpleNamespace(PCPManager=release.manager))
    monkeypatch.setitem(sys.modules, record.GATHER_MODULE, release.gather_module)
    for attribute in ("__init__", "_build_batch_layout", "partition_batch",
                      "get_draft_input_buffers", "_convert_to_gathered_slot_mappings"):
        if hasattr(release.manager, attribute):  # 0.29.0 has no get_draft_input_buffers
            monkeypatch.setattr(release.manager, attribute, getattr(release.manager, attribute))
    monkeypatch.setattr(release.gather_module, record.MLA_WRAPPER,
                        getattr(release.gather_module, record.MLA_WRAPPER))
    # triton's interpreter (the release's slot kernel) is not thread-safe: the ranks lay their
    # steps out in turn, and meet only at the gather's collectives
    lock, rank_layout = threading.Lock(), step_module.rank_layout

    def in_turn(*args):
        with lock:
            return rank_layout(*args)

    monkeypatch.setattr(step_module, "rank_layout", in_turn)
    monkeypatch.setattr(record, "_RECORDER", None)
    monkeypatch.setenv(record.ENV_DIR, str(tmp_path / "rec"))
    monkeypatch.setenv(record.ENV_BLOCK_SIZE, str(BLOCK))
    plugins_loader.load_general_plugins()
    plugins_loader.plugins_loaded = False
    plugins_loader.load_general_plugins()  # loaded twice: harmless
    wrapper = getattr(release.gather_module, record.MLA_WRAPPER)
    assert getattr(wrapper, "__pcpcheck_recorder__", False)
    assert not getattr(wrapper.__wrapped__, "__pcpcheck_recorder__", False)  # wrapped once

    computed = []
    for case in cases:
        group, results = BarrierGroup(case.batch.pcp_size), {}

        def run(rank, case=case, group=group, results=results):
            if case.batch.regime == DRAFT:
                draft_inputs(release, case.batch, rank)
            with bound_group(group.rank(rank)):
                results[rank] = rank_step(case.to_json(), spec, rank)

        threads = [threading.Thread(target=run, args=(r,)) for r in range(case.batch.pcp_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(results[r]["layout_error"] is None for r in results), results
        computed.append({r: (results[r]["slot_map"], results[r]["nd"]) for r in results})
    recorded = {}
    for line in recorded_lines(tmp_path / "rec"):
        if line["kind"] != OUTPUTS:
            recorded.setdefault(line["step"], {})[line["rank"]] = (
                line["release"]["slot_mapping"], line["release"]["num_decode_tokens"])
    # each rank counts its own steps: step k of every rank is the k-th case driven
    return spec, computed, [recorded[k] for k in sorted(recorded)]


def recorded_lines(directory) -> list[dict]:
    return [json.loads(text) for path in sorted(Path(directory).glob("*.jsonl"))
            for text in path.read_text().splitlines()]


def outputs_of(directory) -> dict[tuple[int, int], str]:
    """(step, rank) -> the sha256 of the gather's outputs its outputs line carries."""
    return {(line["step"], line["rank"]): line["sha256"] for line in recorded_lines(directory)
            if line["kind"] == OUTPUTS}


@pytest.mark.parametrize("pcp", (2, 3))
def test_the_recording_of_0_33_0s_own_path_replays_to_the_same_verdict_and_integers(
        tmp_path, monkeypatch, plugins_loader, pcp):
    spec, computed, recorded = recorded_through("0.33.0", drawn_steps(9, pcp), tmp_path,
                                                monkeypatch, plugins_loader)
    assert recorded == computed
    # every recorded step's gather returned: each rank's step line has its outputs line
    assert sorted(outputs_of(tmp_path / "rec")) == [(k, r) for k in range(len(computed))
                                                   for r in range(pcp)]
    result = check_steps(spec["location"], str(tmp_path / "rec"))
    assert result.findings == [] and result.judged == len(computed), result.text()
    assert result.outputs_hashed == len(computed) * pcp
    assert f"gather outputs hashed on {len(computed) * pcp} ranks' steps" in result.text()


def test_later_draft_steps_of_0_33_0s_own_path_are_recorded_and_replay_to_the_same_integers(
        tmp_path, monkeypatch, plugins_loader):
    """Target and later draft steps interleaved, as a speculating server runs them."""
    targets, drafts = drawn_steps(3, 2), drawn_draft_steps(6, 2)
    cases = [c for pair in zip(targets, drafts[::2], drafts[1::2]) for c in pair]
    spec, computed, recorded = recorded_through("0.33.0", cases, tmp_path, monkeypatch,
                                                plugins_loader)
    assert recorded == computed
    kinds = {line["step"]: line["kind"] for line in recorded_lines(tmp_path / "rec")
             if line["kind"] != OUTPUTS}
    assert [kinds[k] for k in sorted(kinds)] == ["target", "draft", "draft"] * 3
    result = check_steps(spec["location"], str(tmp_path / "rec"))
    assert result.findings == [] and result.judged == len(cases), result.text()


def test_0_29_0s_batch_order_defect_is_recorded_before_its_collective_and_replays_collective(
        tmp_path, monkeypatch, plugins_loader):
    """The step whose ranks' all_gathers disagree (a live run hangs or crashes there)."""
    step = Case(Batch(REPLICATED, 2, (Request(1, True, 4, (0,)), Request(1, False, 2, (1,))),
                      BLOCK), MLA_TENSORS)
    decode = Case(Batch(REPLICATED, 2, (Request(1, False, 2, (1,)),), BLOCK), MLA_TENSORS)
    spec, computed, recorded = recorded_through("0.29.0", [decode, step, decode], tmp_path,
                                                monkeypatch, plugins_loader)
    assert recorded == computed and computed[1] == {0: ([4, 18, -1, -1], 0),
                                                    1: ([4, 18, -1, -1], 1)}
    # step 1's collective raised: its step lines are on disk, its outputs lines are not
    assert sorted(outputs_of(tmp_path / "rec")) == [(0, 0), (0, 1), (2, 0), (2, 1)]
    result = check_steps(spec["location"], str(tmp_path / "rec"))
    assert [(f.kind, f.step) for f in result.findings] == [(COLLECTIVE, 1)], result.text()


class Manager:
    """A PCPManager's interface at the boundary the recorder wraps (the layout is not its test)."""

    def __init__(self, pcp_world_size, pcp_rank, shard_decode_requests=False):
        self.calls = 0

    def _build_batch_layout(self, num_scheduled_tokens, num_computed_tokens, is_prefilling,
                            query_start_loc, padded_num_tokens=None):
        self.calls += 1
        return "layout"

    def partition_batch(self, input_batch, batch_desc):
        """As the release's: the step entry, laying out the global batch it gets."""
        self._build_batch_layout(input_batch.num_scheduled_tokens,
                                 input_batch.num_computed_tokens_np, input_batch.is_prefilling_np,
                                 input_batch.query_start_loc_np)
        return input_batch

    def _convert_to_gathered_slot_mappings(self, global_batch_slot_mappings):
        return global_batch_slot_mappings

    def get_draft_input_buffers(self, input_buffers, num_tokens):
        return input_buffers, None


def mla_wrapper(kv_c_normed, k_pe, slot_mapping, num_decode_tokens, use_pcp):
    if kv_c_normed.isnan().any():  # stands for a collective that crashes
        raise RuntimeError("all_gather failed")
    return kv_c_normed[:num_decode_tokens], k_pe[:num_decode_tokens], slot_mapping


def installed(tmp_path, every=1, max_steps=100):
    recorder = record.Recorder(str(tmp_path), every, max_steps, BLOCK)
    manager_module = types.SimpleNamespace(PCPManager=type("PCPManager", (Manager,), {}))
    gather_module = types.SimpleNamespace(maybe_gather_mla_latent_cache_inputs=mla_wrapper)
    record.install(recorder, manager_module, gather_module)
    record.install(recorder, manager_module, gather_module)  # twice: wrapped once
    return recorder, manager_module.PCPManager(2, 0), gather_module


def step(manager, gather, slots=(3, -1), fill=0.0):
    manager._build_batch_layout([1], [3], [False], [0, 1])
    manager._convert_to_gathered_slot_mappings(torch.tensor([[3]]))
    rows = torch.full((2, 4), fill)
    return gather.maybe_gather_mla_latent_cache_inputs(rows, rows, list(slots), 1, True)


def recorded_steps(tmp_path) -> list[int]:
    return [line["step"] for line in recorded_lines(tmp_path) if line["kind"] != OUTPUTS]


def test_off_unless_pcpcheck_record_is_set(monkeypatch):
    monkeypatch.delenv(record.ENV_DIR, raising=False)
    monkeypatch.setattr(record, "install", lambda *args: pytest.fail("installed while off"))
    record.register()


def test_a_sampling_rate_and_a_cap(tmp_path, caplog):
    recorder, manager, gather = installed(tmp_path, every=2, max_steps=2)
    for _ in range(7):
        step(manager, gather)
    assert recorded_steps(tmp_path) == [0, 2] and recorder.stopped and manager.calls == 7
    assert [r.getMessage() for r in caplog.records] == [
        f"pcpcheck recorder: 2 steps recorded ({record.ENV_MAX_STEPS}); recording stops"]


def test_a_recorder_failure_is_logged_once_and_never_reaches_vllm(tmp_path, caplog):
    recorder, manager, gather = installed(tmp_path)
    assert step(manager, gather, slots=("x",))[2] == ["x"]  # vLLM's result, untouched
    assert step(manager, gather)[2] == [3, -1]
    assert recorder.stopped and recorded_steps(tmp_path) == []
    assert len(caplog.records) == 1 and "recorder stopped: ValueError" in caplog.text


def test_a_caller_that_bound_the_wrapper_before_the_plugin_loaded_calls_the_recorder(
        tmp_path, monkeypatch):
    caller = types.SimpleNamespace(maybe_gather_mla_latent_cache_inputs=mla_wrapper)
    monkeypatch.setitem(sys.modules, record.MLA_CALLER, caller)
    _, manager, gather = installed(tmp_path)
    assert caller.maybe_gather_mla_latent_cache_inputs is getattr(gather, record.MLA_WRAPPER)
    step(manager, types.SimpleNamespace(**vars(caller)))
    assert recorded_steps(tmp_path) == [0]


def test_each_recorded_step_gets_an_outputs_line_with_the_sha256_of_what_the_gather_returned(
        tmp_path):
    _, manager, gather = installed(tmp_path, every=2)
    returned = [step(manager, gather) for _ in range(3)]
    records = [record for _, record in read_lines(sorted(tmp_path.glob("*.jsonl")))]
    assert [(r["kind"], r["step"]) for r in records] == [
        ("target", 0), (OUTPUTS, 0), ("target", 2), (OUTPUTS, 2)]
    assert records[1]["sha256"] == record._digest(*returned[0])
    assert records[1]["sha256"] != records[0]["release"]["sha256"]["inputs"]  # not the inputs'


def test_a_gather_that_raises_leaves_its_step_line_and_no_outputs_line(tmp_path, caplog):
    recorder, manager, gather = installed(tmp_path)
    with pytest.raises(RuntimeError, match="all_gather failed"):  # vLLM's own error, untouched
        step(manager, gather, fill=float("nan"))
    step(manager, gather)
    assert [(line["kind"], line["step"]) for line in recorded_lines(tmp_path)] == [
        ("target", 0), ("target", 1), (OUTPUTS, 1)]
    assert not recorder.stopped and caplog.records == []


def test_each_requests_scheduled_draft_tokens_come_from_the_global_batch_partition_batch_got(
        tmp_path):
    """A verify step (a decode with 2 drafts before a 3-token prefill chunk), then a step
    without speculation (the batch has no per-request draft counts)."""
    _, manager, gather = installed(tmp_path)
    for drafts in ([2, 0], None):
        manager.partition_batch(types.SimpleNamespace(
            num_scheduled_tokens=np.array([3, 3]), num_computed_tokens_np=np.array([5, 0]),
            is_prefilling_np=np.array([False, True]), query_start_loc_np=np.array([0, 3, 6]),
            num_draft_tokens_per_req=None if drafts is None else np.array(drafts)), None)
        manager._convert_to_gathered_slot_mappings(torch.tensor([[5, 6, 7, 16, 17, 18]]))
        rows = torch.zeros(6, 4)
        gather.maybe_gather_mla_latent_cache_inputs(rows, rows, [5, 6, 7, 16, 17, 18], 3, True)
    lines = [line for line in recorded_lines(tmp_path) if line["kind"] != OUTPUTS]
    assert [[r["draft_tokens"] for r in line["requests"]] for line in lines] == [[2, 0], [0, 0]]


def test_a_draft_pass_on_an_expanded_map_is_not_recorded_as_a_later_draft_step(tmp_path):
    """A speculator that hands no draft prefill batch runs its first pass on the target step's
    expanded map (more slots than rows): only the pass on an unexpanded map is a draft step."""
    _, manager, gather = installed(tmp_path)
    buffers = types.SimpleNamespace(positions=torch.tensor([40, 7]))
    rows = torch.zeros(2, 4)
    manager.get_draft_input_buffers(buffers, 2)
    gather.maybe_gather_mla_latent_cache_inputs(rows, rows, [40, 7, -1, -1], 2, True)
    manager.get_draft_input_buffers(buffers, 2)
    gather.maybe_gather_mla_latent_cache_inputs(rows, rows, [40, -1], 1, True)
    [line] = [line for line in recorded_lines(tmp_path) if line["kind"] != OUTPUTS]
    assert (line["kind"], line["step"], line["dp_pad"]) == ("draft", 1, 1)
    assert [(r["computed"], r["first_block"], r["block_ids"]) for r in line["requests"]] == [
        (40, 2, [[2]])]


def test_the_inputs_hash_reads_any_strides():
    """A one-row view with stride 2 counts as contiguous, and a byte view of it fails: the
    recorder once stopped on such a correct step. Its hash is its contiguous copy's."""
    strided = torch.arange(10, dtype=torch.int64)[::2][:1]
    assert strided.stride() == (2,) and strided.is_contiguous()
    assert record._digest(strided) == record._digest(strided.clone())
    expanded = torch.tensor([[1.5, 2.5]]).expand(3, 2)
    assert record._digest(expanded) == record._digest(expanded.contiguous())
