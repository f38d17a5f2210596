"""vLLM's code runs in the deployment it is written for (pcpcheck.worker.deployment): a CUDA
platform, one GPU per rank, modelled on CPU. Checkouts are 0.34.0's Python files, written at
test time (nothing of vLLM is committed), each with one change a pull request could make
without changing what any deployment computes: each holds, on the release path and, where the
change is in the gather file, as that file alone. A question only a real GPU can answer is
refused by name (exit 2), never turned into a verdict.

Without the model each drift below was a false violation (RETURNS and REPLICA on every case) or
an aborted worker blamed on vLLM (COLLECTIVE).
"""

from __future__ import annotations

import pytest

from pcpcheck.api import check, check_release
from pcpcheck.judge.coverage import ASYNC_CAPTURED, ASYNC_DECLINED, ASYNC_STARTED
from pcpcheck.shared.errors import LoadError
from pcpcheck.shared.source import GATHERS, Source
from pcpcheck.worker import deployment
from pcpcheck.worker.standins import StandInSpace
from pcpcheck_spec.names import DCP, SHARDED
from tests.test_async import FORK, MUTANTS
from tests.test_vllm_drift import drifted
from tests.test_vllm_kernels import checkout

pytestmark = pytest.mark.xdist_group("vllm_drift")  # beside test_vllm_drift's checkouts

GATHER = GATHERS[0]  # vllm/v1/attention/ops/pcp.py
BODY = "    local_num_tokens = tensors[0].shape[0]\n"
PLATFORM = "    from vllm.platforms import current_platform\n\n"


def _gather_starts_with(lines: str) -> tuple[str, str, str]:
    return GATHER, BODY, PLATFORM + lines + BODY


# The gather refuses to run off a CUDA-alike platform.
PLATFORM_QUESTION = _gather_starts_with(
    "    if not current_platform.is_cuda_alike():\n"
    "        raise RuntimeError('PCP needs a CUDA-alike platform')\n")
# The gather runs only on the tree's own CUDA platform class, as vLLM makes it where NVML finds
# no GPU (pcpcheck's model of a platform, which a file alone gets, is another class).
OWN_PLATFORM = _gather_starts_with(
    "    if (type(current_platform).__module__, type(current_platform).__qualname__) != (\n"
    "            'vllm.platforms.cuda', 'NonNvmlCudaPlatform'):\n"
    "        raise RuntimeError(f'PCP needs the CUDA platform, not {current_platform!r}')\n")
# Staging in pinned host memory where the platform offers it (a CUDA platform does).
PINNED = _gather_starts_with(
    "    staging = torch.empty(2, pin_memory=current_platform.is_pin_memory_available())\n"
    "    staging = torch.zeros(2).pin_memory()\n")
# The slot map moved to the platform's device, a scratch tensor made on "cuda".
PLATFORM_DEVICE = _gather_starts_with(
    "    slot_mapping = slot_mapping.to(current_platform.device_type, non_blocking=True)\n"
    "    assert torch.zeros(1, device='cuda').device == slot_mapping.device\n"
    "    tensors = tuple(t.cuda() for t in tensors)\n")
# A profiling range around the gather, a mark inside it.
PROFILING = (GATHER, "def _gather_prefill_cache_inputs(\n",
             "def _gather_prefill_cache_inputs(tensors, slot_mapping, num_decode_tokens,\n"
             "                                 shard_decode_requests=False):\n"
             "    torch.cuda.nvtx.range_push('pcp gather')\n"
             "    try:\n"
             "        with torch.cuda.nvtx.range('pcp gather body'):\n"
             "            torch.cuda.nvtx.mark('pcp')\n"
             "            return _gather(tensors, slot_mapping, num_decode_tokens,\n"
             "                           shard_decode_requests)\n"
             "    finally:\n"
             "        torch.cuda.nvtx.range_pop()\n\n\n"
             "def _gather(\n")
# The indexer's gather a vLLM custom op (direct_register_custom_op), the MLA wrapper's gather a
# torch.library custom op; the wrappers call them through torch.ops.vllm.
INDEXER_CALL = ("    (cache_k,), cache_slot_mapping = _gather_prefill_cache_inputs(\n"
                "        (k,), slot_mapping, num_decode_tokens, pcp_shard_decode_requests\n"
                "    )\n")
CUSTOM_OPS = (
    (GATHER, "import torch\n",
     "import torch\n\nfrom vllm.utils.torch_utils import direct_register_custom_op\n"),
    (GATHER, INDEXER_CALL,
     "    cache_k, cache_slot_mapping = torch.ops.vllm.pcp_gather_indexer_k(\n"
     "        k, slot_mapping, num_decode_tokens, pcp_shard_decode_requests\n"
     "    )\n"),
    (GATHER, "def finalize_mla_pcp_decode(",
     "def _gather_indexer_k(\n"
     "    k: torch.Tensor, slot_mapping: torch.Tensor, num_decode_tokens: int, shard: bool\n"
     ") -> tuple[torch.Tensor, torch.Tensor]:\n"
     "    (cache_k,), cache_slot_mapping = _gather_prefill_cache_inputs(\n"
     "        (k,), slot_mapping, num_decode_tokens, shard\n"
     "    )\n"
     "    return cache_k, cache_slot_mapping\n\n\n"
     "direct_register_custom_op('pcp_gather_indexer_k', _gather_indexer_k)\n\n\n"
     "@torch.library.custom_op('vllm::pcp_gather_mla', mutates_args=())\n"
     "def _gather_mla(kv_c: torch.Tensor, k_pe_flat: torch.Tensor, slot_mapping: torch.Tensor,\n"
     "                num_decode_tokens: int, shard: bool\n"
     "                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:\n"
     "    (a, b), s = _gather_prefill_cache_inputs((kv_c, k_pe_flat), slot_mapping,\n"
     "                                             num_decode_tokens, shard)\n"
     "    return a, b, s\n\n\n"
     "@_gather_mla.register_fake\n"
     "def _(kv_c, k_pe_flat, slot_mapping, num_decode_tokens, shard):\n"
     "    return torch.empty_like(kv_c), torch.empty_like(k_pe_flat), slot_mapping.clone()\n\n\n"
     "def finalize_mla_pcp_decode("),
    (GATHER, "    (cache_kv_c, cache_k_pe_flat), cache_slot_mapping = _gather_prefill_cache_inputs(\n"
             "        (kv_c_normed, k_pe_flat),\n"
             "        slot_mapping,\n"
             "        num_decode_tokens,\n"
             "        pcp_shard_decode_requests,\n"
             "    )\n",
     "    cache_kv_c, cache_k_pe_flat, cache_slot_mapping = torch.ops.vllm.pcp_gather_mla(\n"
     "        kv_c_normed, k_pe_flat, slot_mapping, num_decode_tokens, pcp_shard_decode_requests\n"
     "    )\n"),
)


def _verdicts(root):
    return check_release(root, regimes=(SHARDED, DCP), max_examples=15, max_ranks=3).verdicts()


HOLDS = {SHARDED: "holds", DCP: "holds"}
DRIFTS = {"platform-question": (PLATFORM_QUESTION,), "platform-device": (PLATFORM_DEVICE,),
          "pinned-staging": (PINNED,), "profiling-range": (PROFILING,), "custom-ops": CUSTOM_OPS}


@pytest.mark.parametrize("drift", DRIFTS)
def test_a_drift_that_asks_about_the_deployment_holds(wheel_0_34, tmp_path, drift):
    """Exit 0 with no refused use (a refusal raises LoadError): the release path's gather and
    wrappers run in the modelled deployment."""
    root = drifted(wheel_0_34, tmp_path / drift, *DRIFTS[drift])
    assert _verdicts(root) == HOLDS


@pytest.mark.parametrize("drift", ["platform-question", "platform-device", "pinned-staging",
                                   "profiling-range"])
def test_the_drifted_gather_file_alone_holds(wheel_0_34, tmp_path, drift, pcpcheck_check):
    """The same gather copied out of its tree: vllm.platforms is a stand-in module there, and
    current_platform still answers as the deployment."""
    root = drifted(wheel_0_34, tmp_path / drift, *DRIFTS[drift])
    alone = tmp_path / "pcp.py"
    alone.write_text((root / GATHER).read_text())
    assert pcpcheck_check([alone, "--regime", SHARDED, "--regime", DCP, "--max-examples", "20"]) == 0


def test_the_platform_in_a_tree_is_the_trees_own_class(wheel_0_34, tmp_path, pcpcheck_check):
    """current_platform is an instance of the tree's own class (vllm/platforms/cuda.py run on
    CPU), on the release path, whose adapted notes name it, and for the gather file checked
    inside its tree."""
    root = drifted(wheel_0_34, tmp_path / "own-platform", OWN_PLATFORM)
    result = check_release(root, regimes=(SHARDED,), max_examples=15, max_ranks=3)
    assert result.verdicts() == {SHARDED: "holds"}
    assert any(note.startswith("vllm.platforms.current_platform: vllm.platforms.cuda."
                               "NonNvmlCudaPlatform(), the tree's own")
               for note in result.release.adapted)
    assert pcpcheck_check([root / GATHER, "--regime", SHARDED, "--max-examples", "20"]) == 0


def _tree_space(root, cuda_module: str) -> StandInSpace:
    """A furnished space over a two-module tree whose vllm/platforms/cuda.py is `cuda_module`."""
    (root / "vllm" / "platforms").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "platforms" / "__init__.py").write_text("")
    (root / "vllm" / "platforms" / "cuda.py").write_text(cuda_module)
    space = StandInSpace(Source(kind="checkout", location=str(root), release="unknown"))
    deployment.furnish(space)
    return space


def test_the_trees_platform_is_made_once_per_process_and_tree(tmp_path):
    """A later load of the same tree (each rank's copy of a file) reuses the instance: the
    platform module runs once."""
    module = "class NonNvmlCudaPlatform:\n    device_type = 'cuda'\n"
    first, second = (_tree_space(tmp_path, module) for _ in range(2))
    platform = first.module("vllm.platforms").current_platform
    assert type(platform).__name__ == "NonNvmlCudaPlatform"
    assert second.module("vllm.platforms").current_platform is platform
    assert "vllm.platforms.cuda" in first.executed and "vllm.platforms.cuda" not in second.executed


def test_a_platform_module_that_cannot_run_here_leaves_the_model_and_says_why(tmp_path):
    space = _tree_space(tmp_path, "import zmq\n")
    assert space.module("vllm.platforms").current_platform is deployment.PLATFORM
    assert ("vllm.platforms.current_platform: pcpcheck's model of a CUDA platform (working "
            "stand-in; vllm.platforms.cuda: imports 'zmq', not among pcpcheck's "
            "dependencies)") in space.provided


@pytest.mark.parametrize("question, name", [
    ("    if current_platform.get_device_capability().major < 9:\n        return tensors, slot_mapping\n",
     "current_platform.get_device_capability"),
    ("    assert torch.cuda.mem_get_info()[0] > 0\n", "torch.cuda.mem_get_info"),
    ("    assert current_platform.device_count() > 0\n", "current_platform.device_count"),
], ids=["platform-capability", "device-memory", "device-count"])
def test_a_question_only_a_gpu_answers_exits_2_naming_it(wheel_0_34, tmp_path, question, name):
    root = drifted(wheel_0_34, tmp_path / "device", _gather_starts_with(question))
    with pytest.raises(LoadError, match=rf"pcp\.py:\d+: .*{name}.*not modelled"):
        _verdicts(root)


def test_a_fork_style_protocol_inside_its_tree_starts_and_its_mutants_fail(wheel_0_34, tmp_path,
                                                                           threads_backend):
    """tests/zoo/async_fork.py (the whole torch.cuda and capture API a fork's protocol uses) as
    the checkout's pcp.py, checked with --async inside the tree: the tree's own platform module
    and capture class answer, the protocol starts on every step no graph capture stops, and
    each ordering mutant fails with exactly its invariant (tests/test_async.py checks the same
    file alone)."""
    root = checkout(wheel_0_34, tmp_path / "fork")
    (root / GATHER).write_text(FORK.read_text())
    target = str(root / GATHER)
    result = check(target, regimes=(SHARDED,), max_examples=60, runner=threads_backend,
                   asynchronous="PCPAsyncCacheUpdate")
    assert result.holds
    features = dict(result.regimes[0].features)
    assert features[ASYNC_STARTED] + features[ASYNC_CAPTURED] == result.regimes[0].cases
    # started on most steps: only a step of decodes alone under graph padding is captured
    assert features[ASYNC_STARTED] > result.regimes[0].cases // 2 and features[ASYNC_DECLINED] == 0
    for protocol, order, invariant in MUTANTS:
        kwargs = {} if order is None else {"async_order": order.split(",")}
        failed = check(target, regimes=(SHARDED,), max_examples=60, runner=threads_backend,
                       asynchronous=protocol, **kwargs)
        assert {v.invariant for c in failed.counterexamples for v in c.violations} == {invariant}
