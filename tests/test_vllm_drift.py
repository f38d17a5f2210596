"""A vLLM checkout that drifts from the release it came from, as pull requests do: each change
either holds (pcpcheck runs the checkout's own modules, wherever the code moved them) or exits 2
naming what drifted; never a verdict built on a stand-in. Checkouts are the 0.33.0 wheel's
Python files, written at test time (nothing of vLLM is committed), with one change each.
"""

from __future__ import annotations

import pytest

from pcpcheck.api import check_release
from pcpcheck.shared.errors import LoadError
from pcpcheck.shared.source import GATHERS, MANAGER
from pcpcheck.worker.release_builder import BUILDER
from pcpcheck.worker.release_calls import CALLER_FILES
from pcpcheck.worker.release_excerpts import BACKEND_UTILS, MODEL_RUNNER
from pcpcheck_spec.names import DCP, REPLICATED, SHARDED
from tests.test_vllm_kernels import checkout

pytestmark = pytest.mark.xdist_group("vllm_drift")  # its own process: beside the kernels tests

GATHER_BODY = "    local_num_tokens = tensors[0].shape[0]\n"
MLA_CALLER, INDEXER_CALLER = CALLER_FILES
# The gather returns early unless a setting is on; it is on by default (vllm/envs.py), so in a
# deployment the line does nothing.
SETTINGS_READ = (GATHERS[0], GATHER_BODY,
                 "    import vllm.envs as envs\n"
                 "    if not envs.VLLM_ENABLE_V1_MULTIPROCESSING:\n"
                 "        return tensors, slot_mapping\n" + GATHER_BODY)
# The manager's host-to-device helper, imported from a module the refactor adds.
HELPER_MOVED = (MANAGER, "from vllm.utils.torch_utils import async_tensor_h2d\n",
                "from vllm.v1.worker.gpu.pcp_copies import async_tensor_h2d\n")
HELPER_MODULE = ("vllm/v1/worker/gpu/pcp_copies.py",
                 "from vllm.utils.torch_utils import async_tensor_h2d as _copy\n\n\n"
                 "def async_tensor_h2d(data, *args, **kwargs):\n"
                 "    return _copy(data, *args, **kwargs)\n")
# The pad slot read from a table in a module the refactor adds.
TABLE_MOVED = (MANAGER, "torch.tensor(PAD_SLOT_ID, dtype=torch.int64, device=device)",
               "torch.tensor(PAD_IDS['slot'], dtype=torch.int64, device=device)")
TABLE_MODULE = ("vllm/v1/worker/gpu/pcp_constants.py",
                "from vllm.v1.attention.backends.utils import PAD_SLOT_ID\n\n"
                "PAD_IDS = {'slot': PAD_SLOT_ID}\n")
TABLE_IMPORT = (MANAGER, "from vllm.v1.worker.gpu.block_table import BlockTables\n",
                "from vllm.v1.worker.gpu.block_table import BlockTables\n"
                "from vllm.v1.worker.gpu.pcp_constants import PAD_IDS\n")


def drifted(wheel, root, *changes, added=()):
    checkout(wheel, root)
    for relpath, old, new in changes:
        text = (root / relpath).read_text()
        assert text.count(old) == 1, f"{old!r} is not once in {relpath}"
        (root / relpath).write_text(text.replace(old, new))
    for relpath, text in added:
        (root / relpath).write_text(text)
    return root
# A switch a pull request adds to the process groups' module, off by default (read from a
# setting it adds to vllm/envs.py): the gather asks it, and takes the path it had when off.
PARALLEL_STATE = "vllm/distributed/parallel_state.py"
SWITCH_SETTING = ("vllm/envs.py",
                  "    # If set, enable multiprocessing in LLM for the V1 code path.\n",
                  "    \"VLLM_PCP_GATHER_ON_GROUP\": lambda: bool(\n"
                  "        int(os.getenv(\"VLLM_PCP_GATHER_ON_GROUP\", \"0\"))\n    ),\n"
                  "    # If set, enable multiprocessing in LLM for the V1 code path.\n")
SWITCH = (PARALLEL_STATE, "def get_pcp_group() -> GroupCoordinator:\n",
          "def pcp_gather_on_group() -> bool:\n"
          "    return envs.VLLM_PCP_GATHER_ON_GROUP and _PCP is not None\n\n\n"
          "def get_pcp_group() -> GroupCoordinator:\n")
SWITCH_READ = (GATHERS[0], GATHER_BODY,
               "    from vllm.distributed.parallel_state import pcp_gather_on_group\n"
               "    if pcp_gather_on_group():\n"
               "        raise NotImplementedError('the group-side gather')\n" + GATHER_BODY)


def _verdicts(root, regimes=(REPLICATED,)):
    return check_release(root, regimes=regimes, max_examples=15, max_ranks=3).verdicts()


def test_a_settings_read_in_the_gather_holds(wheel, tmp_path):
    """The release's own vllm/envs.py answers the setting with its default (an inert answered
    False, and the gather returned early: LENGTH violated on correct code)."""
    root = drifted(wheel, tmp_path / "envs", SETTINGS_READ)
    assert _verdicts(root, (REPLICATED, SHARDED)) == {REPLICATED: "holds", SHARDED: "holds"}


def test_a_helper_moved_into_a_new_module_holds(wheel, tmp_path):
    root = drifted(wheel, tmp_path / "helper", HELPER_MOVED, added=[HELPER_MODULE])
    assert _verdicts(root) == {REPLICATED: "holds"}


def test_a_table_moved_into_a_new_module_holds(wheel, tmp_path):
    root = drifted(wheel, tmp_path / "table", TABLE_MOVED, TABLE_IMPORT, added=[TABLE_MODULE])
    assert _verdicts(root) == {REPLICATED: "holds"}


def test_a_switch_added_to_parallel_state_holds(wheel, tmp_path):
    """The tree's own vllm/distributed/parallel_state.py runs (only its groups are the ranks'):
    a switch added there answers as the release's code does (it was a stand-in: exit 2)."""
    root = drifted(wheel, tmp_path / "switch", SWITCH_SETTING, SWITCH, SWITCH_READ)
    assert _verdicts(root, (REPLICATED, SHARDED)) == {REPLICATED: "holds", SHARDED: "holds"}


def test_the_wrappers_keyword_renamed_with_its_callers_holds(wheel_0_34, tmp_path):
    """The wrappers are called as the release's layers call them (read from the tree): the
    shard keyword renamed in the wrappers and at every call site changes nothing a deployment
    computes (by a remembered name, the wrappers were called without it: COLLECTIVE, REPLICA)."""
    root = tmp_path / "keyword"
    checkout(wheel_0_34, root)
    renames = {GATHERS[0]: ("pcp_shard_decode_requests", "shard_decodes"),
               MLA_CALLER: ("pcp_shard_decode_requests=self", "shard_decodes=self"),
               INDEXER_CALLER: ("pcp_shard_decode_requests=pcp", "shard_decodes=pcp")}
    for relpath, (old, new) in renames.items():
        text = (root / relpath).read_text()
        assert old in text, (relpath, old)
        (root / relpath).write_text(text.replace(old, new))
    result = check_release(root, regimes=(SHARDED, DCP), max_examples=15, max_ranks=3)
    assert result.verdicts() == {SHARDED: "holds", DCP: "holds"}
    assert result.release.capabilities["wrapper_shard_keyword"] == "shard_decodes"


def test_the_managers_keyword_renamed_with_its_builder_holds(wheel_0_34, tmp_path):
    """The manager is built as the model runner builds it, through the manager file's own
    maybe_build_pcp_manager (release_builder): its DCP-rank keyword renamed in the constructor
    and the builder changes nothing a deployment computes (called by a remembered keyword, the
    constructor lacked it: exit 2)."""
    root = drifted(wheel_0_34, tmp_path / "manager",
                   (MANAGER, "        dcp_rank: int = 0,\n", "        dcp_rank_in_group: int = 0,\n"),
                   (MANAGER, "self.dcp_rank = dcp_rank\n", "self.dcp_rank = dcp_rank_in_group\n"),
                   (MANAGER, "        dcp_rank=dcp_rank,\n", "        dcp_rank_in_group=dcp_rank,\n"))
    result = check_release(root, regimes=(DCP, REPLICATED), max_examples=15, max_ranks=3)
    assert result.verdicts() == {DCP: "holds", REPLICATED: "holds"}
    assert any(note.startswith(f"PCPManager built by its {BUILDER}(")
               for note in result.release.adapted), result.release.adapted


def test_a_builder_argument_pcpcheck_cannot_give_exits_2_naming_it(wheel_0_34, tmp_path):
    """The model runner passes the builder something new: no remembered answer stands in."""
    root = drifted(wheel_0_34, tmp_path / "builder",
                   (MANAGER, "    cls: type[PCPManager] = PCPManager,\n",
                    "    cls: type[PCPManager] = PCPManager,\n    moe_config=None,\n"),
                   (MODEL_RUNNER, "            cls=self.pcp_manager_cls,\n",
                    "            cls=self.pcp_manager_cls,\n            moe_config=self.moe_config,\n"))
    with pytest.raises(LoadError, match=f"{BUILDER}: its caller .* passes 'moe_config'"):
        _verdicts(root)


def test_an_internal_renamed_without_its_callers_exits_2_naming_it(wheel, tmp_path):
    """A broken refactor: the helper the manager imports is renamed where it is defined."""
    root = drifted(wheel, tmp_path / "renamed",
                    (BACKEND_UTILS, "def get_dcp_local_seq_lens(", "def dcp_local_seq_lens("))
    with pytest.raises(LoadError, match="get_dcp_local_seq_lens"):
        _verdicts(root)


def test_a_gather_file_inside_a_checkout_runs_the_checkouts_own_modules(wheel, tmp_path,
                                                                        pcpcheck_check):
    """`pcpcheck check CHECKOUT/vllm/v1/attention/ops/pcp.py`: the file's vllm.* imports run
    from the tree it lives in (its settings read answered by its own envs.py)."""
    root = drifted(wheel, tmp_path / "envs", SETTINGS_READ)
    assert pcpcheck_check([root / GATHERS[0], "--max-examples", "20"]) == 0
