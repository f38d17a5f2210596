"""`pcpcheck vllm` runs the release's own `PCPManager.partition_batch` on every expanded step: each
rank's gather gets the rows of the local batch it builds, and the decode/prefill split reads that
batch's request boundaries (docs/semantics.md section 11; pcpcheck.worker.release_batch).

Checkouts are built at test time from the 0.34.0 wheel (fetched as test_vllm.py fetches it;
nothing of vLLM is committed), with one line of partition_batch changed. Neither change touches
`_build_batch_layout` or the slot maps, so LAYOUT cannot see them: before partition_batch ran,
both held (exit 0).
"""

from __future__ import annotations

import pytest

from pcpcheck.api import check_release
from pcpcheck.shared.protocol import MANAGER_STAGE
from pcpcheck.shared.source import MANAGER
from pcpcheck.worker.release_builder import BUILDER
from pcpcheck.worker.release_excerpts import MODEL_RUNNER
from pcpcheck_spec.names import COLLECTIVE, DCP, PAIRING, REPLICA, REPLICATED, SHARD, SHARDED
from tests.test_vllm_kernels import checkout

pytestmark = pytest.mark.xdist_group("vllm_0_34_0_wheel")

INPUT_BATCH = "vllm/v1/worker/gpu/input_batch.py"
GATHER_INDEX = "        self._local_gather_idx = local_gather_idx\n"
# the rank's rows gathered in reverse: row i computes another token than the slot map's row i
ROWS_REVERSED = (MANAGER, GATHER_INDEX,
                 "        local_gather_idx = local_gather_idx.flip(0)\n" + GATHER_INDEX)
CUMSUM = "        np.cumsum(local_num_scheduled_tokens, out=local_query_start_loc_out)\n"
# every boundary between two local requests one token later
BOUNDARIES_SHIFTED = (MANAGER, CUMSUM,
                      CUMSUM + "        local_query_start_loc_np[1:num_local_reqs] += 1\n")
OPTIONS = dict(max_examples=40, max_ranks=2)
EXPANDED = (SHARDED, REPLICATED, DCP)


def _violated(result) -> dict[str, set[str]]:
    """regime -> the invariants its counterexample violates."""
    return {c.regime: {v.invariant for v in c.violations} for c in result.counterexamples}


@pytest.mark.parametrize("without_input_batch", [False, True],
                         ids=["its-input-batch", "stand-in-input-batch"])
def test_rows_out_of_order_violate_pairing(wheel_0_34, tmp_path, without_input_batch):
    """Each rank's K/V rows are the local batch's, reversed against the slot map: every cache
    holds the wrong token at a slot (PAIRING; REPLICA where ranks are replicas, SHARD under DCP,
    and REPLICA there too for the second KV group where its call runs).
    Without input_batch.py the global batch is pcpcheck's stand-in, with the same verdict."""
    root = checkout(wheel_0_34, tmp_path / "changed", ROWS_REVERSED)
    if without_input_batch:
        (root / INPUT_BATCH).unlink()
    result = check_release(root, regimes=EXPANDED, **OPTIONS)
    assert result.verdicts() == {regime: f"VIOLATED: {PAIRING}" for regime in EXPANDED}
    # under DCP, REPLICA judges the second KV group's call, which runs where the release's
    # block tables run (the kernels extra: Capabilities.replicated_kv_group)
    replicated_group = {REPLICA} if result.release.capabilities["replicated_kv_group"] else set()
    assert _violated(result) == {SHARDED: {PAIRING, REPLICA}, REPLICATED: {PAIRING, REPLICA},
                                 DCP: {PAIRING, SHARD, *replicated_group}}
    assert any(("StandInInputBatch" in note) == without_input_batch
               and note.startswith("PCPManager.partition_batch runs")
               for note in result.release.adapted), result.release.adapted


def test_shifted_request_boundaries_violate_collective(wheel_0_34, tmp_path):
    """A rank whose first local request is a decode, followed by another, now reads a 2-token
    first query: the split classes it prefill (nd 0), while a rank holding that decode alone
    keeps nd 1. The ranks' gathers disagree (COLLECTIVE), the caches stay unwritten (REPLICA).
    Where every rank's nd moves alike (sharded, dcp) the gathers still write the right caches."""
    root = checkout(wheel_0_34, tmp_path / "changed", BOUNDARIES_SHIFTED)
    result = check_release(root, regimes=(REPLICATED,), max_examples=100, max_ranks=2)
    assert result.verdicts() == {REPLICATED: f"VIOLATED: {COLLECTIVE}"}
    assert _violated(result) == {REPLICATED: {COLLECTIVE, REPLICA}}


def test_the_release_holds_and_its_path_table_names_partition_batch(wheel_0_34, tmp_path):
    result = check_release(checkout(wheel_0_34, tmp_path / "release"), regimes=EXPANDED,
                           **OPTIONS)
    assert result.verdicts() == {regime: "holds" for regime in EXPANDED}
    row = next(p for p in result.release.paths if p.stage == MANAGER_STAGE)
    assert row.status == "real" and row.reason.startswith(
        f"built by {BUILDER} as the model runner calls it ({MODEL_RUNNER}:"), row
    assert "; partition_batch builds each rank's local batch" in row.reason, row
