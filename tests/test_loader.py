"""pcpcheck.worker.loader: loading targets without vLLM installed."""

from __future__ import annotations

import re
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from pcpcheck.shared.errors import LoadError
from pcpcheck.worker import rankctx
from pcpcheck.worker.loader import Target, exec_source, load_target
from pcpcheck.worker.standins import StandInSpace
from pcpcheck_spec.names import ASYNC_READ, PAIRING, REPLICA, REPLICATED, SHARDED

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "tests" / "zoo"
ZOO_FILES = sorted(ZOO.glob("*.py"))


class _ThreadGroup:
    """A minimal vLLM-style group over threads (barrier-based all_gather), for these tests."""

    class _World:
        def __init__(self, size):
            self.size = size
            self.barrier = threading.Barrier(size, timeout=10)
            self.slots = [None] * size

    def __init__(self, world, rank):
        self._world = world
        self.world_size = world.size
        self.rank_in_group = rank

    def all_gather(self, tensor, dim=0):
        world = self._world
        world.slots[self.rank_in_group] = tensor.clone()
        world.barrier.wait()
        out = torch.cat(list(world.slots), dim=dim)
        world.barrier.wait()
        return out


def _run_ranks(target: Target, per_rank, shard, pass_group=True):
    """per_rank: list of (tensors, slot_mapping, nd); returns per-rank outputs."""
    size = len(per_rank)
    world = _ThreadGroup._World(size)
    results = [None] * size
    errors = [None] * size

    def work(rank):
        group = _ThreadGroup(world, rank)
        tensors, slots, nd = per_rank[rank]
        try:
            with rankctx.bound_group(group):
                results[rank] = target.call(tensors, slots, nd, shard, group if pass_group else None)
        except Exception as exc:  # noqa: BLE001 - each rank's error is what it checks
            errors[rank] = exc

    threads = [threading.Thread(target=work, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [None] * size, errors
    return results


def _vllm_modules():
    return sorted(k for k in sys.modules if k == "vllm" or k.startswith("vllm."))


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- zoo ------------------------------------------------------------------------------------


def test_zoo_is_present():
    names_found = {p.name for p in ZOO_FILES}
    assert {"correct.py", "upstream.py", "legacy_no_shard.py", "bug01_local_block.py"} <= names_found


@pytest.mark.parametrize("path", ZOO_FILES, ids=lambda p: p.name)
def test_loads_each_zoo_file(path):
    before = _vllm_modules()
    target = load_target(str(path))
    assert target.function.__name__ == "_gather_prefill_cache_inputs"
    assert target.name == f"{path.name}:_gather_prefill_cache_inputs"
    assert target.source == str(path)
    assert not target.accepts_group
    assert target.accepts_shard == (path.name != "legacy_no_shard.py")
    assert "vllm.distributed.parallel_state.get_pcp_group" in target.stand_ins
    assert _vllm_modules() == before  # no stand-in left in sys.modules
    assert target.function.__module__ not in sys.modules  # the target module is not left registered


def test_zoo_correct_golden_sharded_example():
    # docs/semantics.md section 2: P=2 sharded, three 1-token decodes, slots [123, 456, 789].
    target = load_target(str(ZOO / "correct.py"))
    slots = torch.tensor([123, 789, 456, -1])
    per_rank = [
        ((torch.tensor([[11.0], [33.0]]),), slots, 2),
        ((torch.tensor([[22.0], [0.0]]),), slots, 1),
    ]
    for rows, out_slots in _run_ranks(target, per_rank, shard=True):
        assert rows[0].flatten().tolist() == [11.0, 33.0, 22.0, 0.0]
        assert out_slots.tolist() == [123, 789, 456, -1]


def test_zoo_correct_golden_mixed_example():
    # docs/semantics.md section 2: legacy mixed gather, nd=1, W=4.
    target = load_target(str(ZOO / "correct.py"))
    slots = torch.tensor([10, 11, 12, 13, -1, 21, 22, 23])
    per_rank = [
        ((torch.tensor([0.0, 1.0, 2.0, 3.0]),), slots, 1),
        ((torch.tensor([0.0, 5.0, 6.0, 7.0]),), slots, 1),
    ]
    for rows, out_slots in _run_ranks(target, per_rank, shard=False):
        assert out_slots.tolist() == [10, 11, 12, 13, 21, 22, 23]
        assert rows[0].tolist() == [0.0, 1.0, 2.0, 3.0, 5.0, 6.0, 7.0]


def test_zoo_upstream_keeps_only_decodes_in_branch_a():
    correct = load_target(str(ZOO / "correct.py"))
    upstream = load_target(str(ZOO / "upstream.py"))
    t = (torch.arange(3.0),)
    s = torch.tensor([5, 6, 7])
    with rankctx.bound_group(_ThreadGroup(_ThreadGroup._World(1), 0)):
        assert correct.call(t, s, 1, False, None)[1].tolist() == [5, 6, 7]
        assert upstream.call(t, s, 1, False, None)[1].tolist() == [5]


def test_legacy_signature_is_called_without_shard():
    target = load_target(str(ZOO / "legacy_no_shard.py"))
    assert target.accepts_shard is False
    t = (torch.arange(2.0),)
    s = torch.tensor([1, 2])
    with rankctx.bound_group(_ThreadGroup(_ThreadGroup._World(1), 0)):
        rows, slots = target.call(t, s, 2, True, None)  # shard flag dropped, not a TypeError
    assert slots.tolist() == [1, 2]


# --- stand-ins --------------------------------------------------------------------------------

MANY_IMPORTS = '''
import torch
from typing import Optional

import vllm.envs as envs
from vllm import _custom_ops as ops
from vllm.distributed import get_dcp_group, get_tp_group
from vllm.distributed.parallel_state import get_pcp_group, GroupCoordinator
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backends.utils import PAD_SLOT_ID, CommonAttentionMetadata
from vllm.model_executor.custom_op import CustomOp

logger = init_logger(__name__)

FLAG = envs.VLLM_SOME_FLAG  # bound, never used as a value


@triton.jit
def _helper_kernel(x_ptr, BLOCK: tl.constexpr):
    pass


@triton.jit(do_not_specialize=["n"])
def _helper_kernel2(x_ptr, n):
    pass


@CustomOp.register("pcp_thing")
class PcpThing(CustomOp):
    def forward(self, x):
        return x


class Meta(CommonAttentionMetadata, GroupCoordinator):
    pass


def annotated(x: GroupCoordinator | None = None) -> Optional[CommonAttentionMetadata]:
    return x


def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
    from vllm.distributed.parallel_state import get_pcp_group as late  # call-time import
    from vllm.v1.attention.ops.common import cp_lse_ag_out_rs  # noqa: F401
    logger.debug("gather %d", num_decode_tokens)
    group = get_pcp_group()
    assert late() is group
    assert callable(_helper_kernel) and _helper_kernel.__name__ == "_helper_kernel"
    assert _helper_kernel2.__name__ == "_helper_kernel2"
    assert PcpThing().forward(1) == 1
    pad = torch.full((1,), PAD_SLOT_ID)
    return tensors, torch.cat([slot_mapping, pad]), group, cdiv(7, 2)
'''


def test_many_vllm_imports_triton_and_platform(tmp_path):
    before = _vllm_modules()
    path = _write(tmp_path, "pcp_many.py", MANY_IMPORTS)
    target = load_target(str(path))
    assert _vllm_modules() == before
    for name in (
        "vllm.platforms.current_platform",
        "vllm.triton_utils.triton",
        "vllm.logger.init_logger",
        "vllm.distributed.parallel_state.get_pcp_group",
        "vllm.v1.attention.backends.utils.PAD_SLOT_ID",
    ):
        assert name in target.stand_ins
    group = object()
    with rankctx.bound_group(group):
        tensors, slots, got_group, ceil = target.function((torch.zeros(1),), torch.tensor([4]), 0)
    assert got_group is group
    assert slots.tolist() == [4, -1]
    assert ceil == 4
    assert "vllm.v1.attention.ops.common.cp_lse_ag_out_rs" in target.stand_ins  # recorded at call
    assert _vllm_modules() == before


# An inert is never a silent answer: each use that would need a real value stops the load, one
# line naming the file, line and name.
REFUSED_USES = {
    "a truth value": "if envs.VLLM_PCP_ASYNC:\n    pass",
    "a container (iterated)": "for _ in current_platform.supported_dtypes:\n    pass",
    "a container (in)": "_ = 3 in envs.VLLM_DISABLED_KERNELS",
    "a value (compared)": "_ = envs.VLLM_CP_LEVEL > 2",
    "a number": "_ = envs.VLLM_CP_LEVEL + 1",
}


@pytest.mark.parametrize("use", REFUSED_USES)
def test_a_stand_in_used_as_a_value_stops_the_load_naming_file_line_and_name(tmp_path, use):
    text = ("import vllm.envs as envs\nfrom vllm.platforms import current_platform\n"
            f"{REFUSED_USES[use]}\n"
            "def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens):\n"
            "    return tensors, slot_mapping\n")
    path = tmp_path / "pcp_refused.py"
    path.write_text(text)
    with pytest.raises(LoadError) as raised:
        load_target(str(path))
    message = str(raised.value)
    assert f"{path}:3: " in message and f"used as {use}" in message, message
    assert "vllm.platforms.current_platform" in message or "vllm.envs.VLLM_" in message, message


def test_a_stand_in_used_as_a_value_at_call_time_stops_the_run_even_if_caught(tmp_path,
                                                                              pcpcheck_check):
    """Inside the gather, on every rank, with the error caught by the code: still no verdict."""
    path = tmp_path / "pcp_late.py"
    path.write_text(
        "import vllm.envs as envs\n"
        "from vllm.distributed.parallel_state import get_pcp_group\n"
        "def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,\n"
        "                                 shard_decode_requests=False):\n"
        "    try:\n"
        "        asynchronous = bool(envs.VLLM_PCP_ASYNC)\n"
        "    except TypeError:\n"
        "        asynchronous = False\n"
        "    group = get_pcp_group()\n"
        "    return (tuple(group.all_gather(t, dim=0) for t in tensors),\n"
        "            group.all_gather(slot_mapping, dim=0))\n")
    with pytest.raises(LoadError, match=rf"{path}:6: vllm.envs.VLLM_PCP_ASYNC "
                                        r"is a stand-in, used as a truth value"):
        pcpcheck_check([path, "--max-examples", "3", "--regime", "replicated"])


def test_get_pcp_group_is_the_bound_group(tmp_path):
    path = _write(
        tmp_path,
        "pcp_group.py",
        """
        import vllm.distributed.parallel_state as ps
        from vllm.distributed import get_pcp_group

        def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
            return get_pcp_group(), ps.get_pcp_group()
        """,
    )
    target = load_target(str(path))
    group_a, group_b = object(), object()
    with rankctx.bound_group(group_a):
        assert target.function(None, None, 0) == (group_a, group_a)
        # call() binds the group it is given for the duration of the call
        assert target.call(None, None, 0, False, group_b) == (group_b, group_b)
        assert target.function(None, None, 0) == (group_a, group_a)


def test_get_pcp_group_per_thread():
    target = load_target(str(ZOO / "correct.py"))
    get = target.function.__globals__["get_pcp_group"]
    seen = {}

    def work(rank):
        with rankctx.bound_group(f"group{rank}"):
            seen[rank] = get()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {0: "group0", 1: "group1", 2: "group2"}


def test_accepts_group_and_kwargs(tmp_path):
    path = _write(
        tmp_path,
        "kw.py",
        """
        def with_group(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False, *, group=None):
            return shard_decode_requests, group

        def with_kwargs(tensors, slot_mapping, num_decode_tokens, **kwargs):
            return kwargs
        """,
    )
    target = load_target(str(path), "with_group")
    assert target.accepts_shard and target.accepts_group
    group = object()
    assert target.call(None, None, 0, True, group) == (True, group)
    target = load_target(str(path), "with_kwargs")
    assert target.accepts_shard and not target.accepts_group
    assert target.call(None, None, 0, True, group) == {"shard_decode_requests": True}


def test_relative_vllm_import_inside_a_vllm_tree(tmp_path):
    ops = tmp_path / "checkout" / "vllm" / "v1" / "attention" / "ops"
    ops.mkdir(parents=True)
    path = _write(
        ops,
        "pcp.py",
        """
        from ..backends.utils import PAD_SLOT_ID
        from .common import something

        def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
            return PAD_SLOT_ID
        """,
    )
    target = load_target(str(path))
    assert target.function(None, None, 0) == -1
    assert "vllm.v1.attention.ops.common.something" in target.stand_ins


def test_real_vllm_entries_are_restored(tmp_path, monkeypatch):
    import types

    fake = types.ModuleType("vllm")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    target = load_target(str(ZOO / "correct.py"))
    assert sys.modules["vllm"] is fake
    assert target.function.__globals__["get_pcp_group"] is rankctx.current_group


# --- module:function -------------------------------------------------------------------------


def test_module_function_form(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    before = _vllm_modules()
    target = load_target("tests.zoo.bug01_local_block:_gather_prefill_cache_inputs")
    assert target.function.__name__ == "_gather_prefill_cache_inputs"
    assert target.source == "tests.zoo.bug01_local_block:_gather_prefill_cache_inputs"
    assert "vllm.distributed.parallel_state.get_pcp_group" in target.stand_ins
    assert "get_pcp_group" in target.function.__globals__
    assert _vllm_modules() == before
    default = load_target("tests.zoo.correct")
    assert default.function_name == "_gather_prefill_cache_inputs"


def test_module_with_helper_importing_vllm(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg_loader_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("from vllm.distributed import get_pcp_group\n")
    (pkg / "pcp.py").write_text(
        "from .helpers import get_pcp_group\n"
        "def gather(tensors, slot_mapping, num_decode_tokens):\n"
        "    return get_pcp_group()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    before = _vllm_modules()
    target = load_target("mypkg_loader_test.pcp:gather")
    assert not target.accepts_shard
    with rankctx.bound_group("g"):
        assert target.call(None, None, 0, True, None) == "g"
    (pkg / "many.py").write_text(textwrap.dedent(MANY_IMPORTS))
    target = load_target("mypkg_loader_test.many")
    assert "vllm.platforms.current_platform" in target.stand_ins
    with rankctx.bound_group("h"):  # call-time vllm import inside the target module's function
        assert target.call((torch.zeros(1),), torch.tensor([4]), 0, False, None)[2] == "h"
    assert _vllm_modules() == before
    for key in [k for k in sys.modules if k.startswith("mypkg_loader_test")]:
        monkeypatch.delitem(sys.modules, key)


def test_dataclass_and_type_hints_with_stand_ins(tmp_path):
    path = _write(
        tmp_path,
        "dc.py",
        """
        import dataclasses
        from vllm.config import VllmConfig
        from vllm.v1.attention.backends.utils import CommonAttentionMetadata

        @dataclasses.dataclass
        class Meta:
            config: VllmConfig | None = None
            common: CommonAttentionMetadata = None

        def gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens, shard_decode_requests=False):
            return Meta()
        """,
    )
    target = load_target(str(path))
    assert target.function_name == "gather_prefill_cache_inputs"
    assert target.call(None, None, 0).config is None


# --- errors ----------------------------------------------------------------------------------


def _error(*args) -> str:
    with pytest.raises(LoadError) as info:
        load_target(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_file(tmp_path):
    assert "no such file" in _error(str(tmp_path / "nope.py"))


def test_not_a_python_file(tmp_path):
    path = tmp_path / "pcp.txt"
    path.write_text("x = 1\n")
    assert "not a Python file" in _error(str(path))
    assert "not a file" in _error(str(tmp_path) + "/")


def test_syntax_error(tmp_path):
    path = _write(tmp_path, "bad.py", "x = 1\ndef f(:\n    pass\n")
    message = _error(str(path))
    assert f"{path}:2" in message and "syntax error" in message


@pytest.mark.parametrize("prefix, encoding", [
    (b"\xef\xbb\xbf", "utf-8"),  # a UTF-8 byte order mark
    (b"# -*- coding: latin-1 -*-\n", "latin-1"),  # PEP 263
    (b"#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\n", "cp1252"),
], ids=["bom", "coding-latin-1", "fileencoding-cp1252"])
def test_encoded_file_loads(tmp_path, prefix, encoding):
    path = tmp_path / "pcp.py"
    text = ('NAME = "K\u00e4che"\n\n'
            "def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,\n"
            "                                 shard_decode_requests=False):\n"
            "    return tuple(tensors), slot_mapping\n")
    path.write_bytes(prefix + text.encode(encoding))
    target = load_target(str(path))
    assert target.function.__globals__["NAME"] == "K\u00e4che"  # decoded as declared


def test_undeclared_encoding_is_a_one_line_error(tmp_path):
    path = tmp_path / "pcp.py"
    path.write_bytes('NAME = "K\u00e4che"\n'.encode("latin-1"))
    message = _error(str(path))
    assert f"{path}:" in message and "utf-8" in message


def test_no_gather_function(tmp_path):
    path = _write(tmp_path, "nothing.py", "def helper():\n    pass\n\nVALUE = 3\n")
    message = _error(str(path))
    assert "_gather_prefill_cache_inputs" in message and "helper" in message


def test_named_function_missing(tmp_path):
    path = _write(tmp_path, "other.py", "def helper():\n    pass\n")
    assert "no function gather" in _error(str(path), "gather")


def test_not_callable(tmp_path):
    path = _write(tmp_path, "nc.py", "_gather_prefill_cache_inputs = 42\n")
    assert "not callable" in _error(str(path))


def test_reexport_from_vllm_is_reported(tmp_path):
    path = _write(tmp_path, "reexport.py", "from vllm.v1.attention.ops.pcp import _gather_prefill_cache_inputs\n")
    message = _error(str(path))
    assert "vllm.v1.attention.ops.pcp" in message


def test_unknown_module():
    assert "no module named" in _error("definitely_not_a_module_xyz:gather")
    assert "no module named" in _error("definitely_not_a_module_xyz.sub")


def test_module_function_not_found(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    assert "no function nope" in _error("tests.zoo.correct:nope")


def test_really_missing_import_names_the_module(tmp_path):
    path = _write(tmp_path, "needs.py", "import torch\nimport definitely_not_installed_pkg\n")
    message = _error(str(path))
    assert "definitely_not_installed_pkg" in message and f"{path}:2" in message


def test_triton_itself_is_not_stood_in_for(tmp_path):
    try:
        import triton  # noqa: F401 - whether it is installed

        pytest.skip("triton installed")
    except ImportError:
        pass
    path = _write(tmp_path, "tri.py", "import triton\n")
    assert "'triton'" in _error(str(path))


def test_inert_used_as_number(tmp_path):
    before = _vllm_modules()
    path = _write(tmp_path, "num.py", "import vllm.envs as envs\nBLOCK = envs.VLLM_BLOCK * 2\n")
    message = _error(str(path))
    assert "vllm.envs.VLLM_BLOCK" in message and f"{path}:2" in message and "number" in message
    assert _vllm_modules() == before


def test_import_time_exception(tmp_path):
    path = _write(tmp_path, "boom.py", "raise ValueError('boom')\n")
    message = _error(str(path))
    assert "ValueError: boom" in message and f"{path}:1" in message


def test_bad_target_string():
    assert "not an existing file" in _error("not a module!")


def test_impl_target_loads_lazily():
    try:
        target = load_target(None)
    except LoadError as exc:  # impl/ is being written concurrently
        pytest.skip(f"impl not ready: {exc}")
    assert target.source == "impl"
    assert target.accepts_shard and target.accepts_group
    assert load_target("impl").function is target.function


# --- copies of the bundled files ------------------------------------------------------------
# A reviewer's first try: `cp impl/gather.py /tmp/ && pcpcheck check /tmp/gather.py`. impl's
# modules import each other by absolute name, so a copy alone, anywhere, still imports.

IMPL = REPO / "impl"


def _copy(directory: Path, name: str, stem: str, old: str = "", new: str = "") -> Path:
    """impl/NAME copied alone to directory/STEM.py, `old` (one line of it) replaced by `new`."""
    text = (IMPL / name).read_text()
    if old:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = directory / f"{stem}.py"
    path.write_text(text)
    return path


def _violated(out: str) -> set[str]:
    return set(re.findall(r"^Counterexample \d+: (\w+) violated", out, re.M))


@pytest.mark.parametrize("name", sorted(p.name for p in IMPL.glob("*.py") if p.name != "__init__.py"))
def test_a_copy_of_each_bundled_module_loads_as_a_lone_file(tmp_path, name):
    path = _copy(tmp_path, name, f"my_{name[:-3]}")
    module = exec_source(path.read_bytes(), str(path), StandInSpace())
    assert module.__package__ == ""  # no package to resolve a relative import against


def test_a_copy_of_the_bundled_gather_holds_and_a_planted_bug_names_its_invariant(
        tmp_path, pcpcheck_check, capsys):
    argv = ["--regime", REPLICATED, "--max-examples", "50"]
    assert pcpcheck_check([_copy(tmp_path, "gather.py", "mygather"), *argv]) == 0
    capsys.readouterr()
    # branch C (replicated, all decode) pairs the rows with rank 1's block of the map, not rank 0's
    broken = _copy(tmp_path, "gather.py", "mygather_c", "return tensors, slot_mapping[:num_rows]",
                   "return tensors, slot_mapping[num_rows:2 * num_rows]")
    assert pcpcheck_check([broken, *argv]) == 1
    assert _violated(capsys.readouterr().out) == {REPLICA}
    # branch E takes the map's first slots in order, dropping the rank-major reordering that
    # pairs them with the all_gather's rows
    broken = _copy(tmp_path, "gather.py", "mygather_e",
                   "slots_out = slot_mapping[torch.cat((decode_idx, prefill_idx))]",
                   "slots_out = slot_mapping[:nd + world_size * (num_rows - nd)]")
    assert pcpcheck_check([broken, *argv]) == 1
    assert PAIRING in _violated(capsys.readouterr().out)


def test_a_copy_of_the_bundled_async_protocol_is_an_async_target(tmp_path, pcpcheck_check, capsys):
    argv = ["--async", "--regime", SHARDED, "--max-examples", "50"]
    assert pcpcheck_check([_copy(tmp_path, "async_update.py", "myasync"), *argv]) == 0
    capsys.readouterr()
    # finish() no longer makes the current stream wait for the side stream's writes
    broken = _copy(tmp_path, "async_update.py", "myasync_nowait",
                   "torch.cuda.current_stream().wait_event(self._done)", "pass")
    assert pcpcheck_check([broken, *argv]) == 1
    assert _violated(capsys.readouterr().out) == {ASYNC_READ}


def test_a_copy_of_the_bundled_mla_wrapper_runs_as_module_function(tmp_path, monkeypatch):
    """Not a `check` target (its signature is vLLM's MLA wrapper's, not the gather's), but a
    copy loads in the module:function form and answers as the bundled wrapper on every rank."""
    from pcpcheck_impl import gather_mla_cache_inputs

    _copy(tmp_path, "mla.py", "my_mla_copy")
    monkeypatch.syspath_prepend(str(tmp_path))
    copy = load_target("my_mla_copy:gather_mla_cache_inputs").function
    size, rows, nd = 2, 3, 1
    world = _ThreadGroup._World(size)
    answers: dict = {}

    def work(rank, fn, key):
        kv = torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4) + 100 * rank
        k_pe = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 1, 2) - 100 * rank
        slots = torch.arange(size * rows, dtype=torch.int64) + 10
        answers[key, rank] = fn(kv, k_pe, slots, nd, True, group=_ThreadGroup(world, rank))

    for fn, key in ((copy, "copy"), (gather_mla_cache_inputs, "impl")):
        threads = [threading.Thread(target=work, args=(r, fn, key)) for r in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    for rank in range(size):
        kv, k_pe, slots = answers["copy", rank]
        assert k_pe.shape == (size * rows - nd, 1, 2)
        for got, want in zip(answers["copy", rank], answers["impl", rank]):
            assert torch.equal(got, want)
