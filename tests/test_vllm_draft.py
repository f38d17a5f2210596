"""`pcpcheck vllm` lays a later draft step out through the release's own draft path: its
speculators' `block_tables.compute_slot_mappings(...)` on the global batch, under triton's CPU
interpreter (pcpcheck.worker.release_draft), and LAYOUT compares that map with the reference's.

Checkouts are built at test time from the 0.34.0 wheel (nothing of vLLM is committed). The
changed line is in the slot kernel's padding program, which only a draft step's map reads
(an expanded map selects its real tokens alone): before draft steps ran the release's path,
the change passed (exit 0).
"""

from __future__ import annotations

import re

import pytest

from pcpcheck.api import check_release
from pcpcheck.render.report import not_applicable_reason
from pcpcheck.shared.protocol import SLOT_MAPPING
from pcpcheck.worker.release_draft import SPEC_DECODE
from pcpcheck.worker.release_kernels import BLOCK_TABLE
from pcpcheck_spec.names import DRAFT, DRAFT_MIXED, LAYOUT, REPLICA, SHARDED
from tests.test_vllm_kernels import checkout

pytestmark = [pytest.mark.xdist_group("vllm_0_34_0_wheel"), pytest.mark.kernels]

# the padding program writes slot 0 past the real tokens, where PAD_ID (-1) belongs
PADDING_TO_SLOT_0 = (BLOCK_TABLE,
                     "tl.store(slot_mapping_ptr + offset, PAD_ID, mask=offset < max_num_tokens)",
                     "tl.store(slot_mapping_ptr + offset, 0, mask=offset < max_num_tokens)")
OPTIONS = dict(regimes=(SHARDED, DRAFT), max_examples=40, max_ranks=2)


def _slot_stage(result):
    return next(p for p in result.release.paths if p.stage == SLOT_MAPPING)


# LAYOUT's draft regimes (the trigger test_vllm.py's every-ID-fires check defers to), and what
# else the release violates there unchanged (draft-mixed: the latent class 10, docs/releases.md)
LAYOUT_TRIGGERED = {DRAFT: "", DRAFT_MIXED: f", {REPLICA}"}


@pytest.mark.parametrize("regime", LAYOUT_TRIGGERED)
def test_a_padded_draft_map_aimed_at_a_slot_violates_layout(wheel_0_34, tmp_path, regime):
    """A DP-padded draft step's map from the changed kernel aims its padding rows at slot 0:
    LAYOUT (the gather's branch A writes only the decode rows, so no cache shows it); the
    expanded regime, whose maps never read the padding program, holds."""
    result = check_release(checkout(wheel_0_34, tmp_path / "changed", PADDING_TO_SLOT_0),
                           **{**OPTIONS, "regimes": (SHARDED, regime)})
    assert result.verdicts() == {SHARDED: "holds",
                                 regime: f"VIOLATED: {LAYOUT}{LAYOUT_TRIGGERED[regime]}"}
    shown = next(c for c in result.counterexamples if c.regime == regime)
    assert "draft path (its speculators' slot map) differs" in shown.report, shown.report
    assert re.search(r"unexpanded +reference \[(\d+, )*-1\]\n +release +\[(\d+, )*0\]",
                     shown.report), shown.report


def test_draft_steps_run_the_speculators_call(wheel_0_34, tmp_path):
    """The release holds; its path table names the speculators' call sites, LAYOUT is checked
    on the draft steps whose maps the kernel computed, and the slot-mapping row counts them."""
    result = check_release(checkout(wheel_0_34, tmp_path / "release"), **OPTIONS)
    assert result.verdicts() == {SHARDED: "holds", DRAFT: "holds"}
    stage = _slot_stage(result)
    assert f"draft steps through the speculators' own call ({SPEC_DECODE}" in stage.reason, stage
    draft = result.summary(DRAFT)
    assert 0 < draft.count(LAYOUT).checked <= draft.cases
    assert dict(draft.real_stages)[SLOT_MAPPING] == draft.count(LAYOUT).checked
    assert result.release.capabilities["draft_path"] is True


def test_without_the_speculators_call_draft_maps_stay_the_references(wheel_0_34, tmp_path):
    """The speculators' call renamed (say, a fork's own draft path): no draft path pcpcheck
    recognises, so draft steps take the reference's map, LAYOUT is n/a under draft and says why
    from the path table."""
    root = checkout(wheel_0_34, tmp_path / "no-speculators")
    for path in (root / SPEC_DECODE).rglob("*.py"):
        text = path.read_text()
        path.write_text(text.replace(".compute_slot_mappings(", ".fork_slot_mappings("))
    result = check_release(root, **OPTIONS)
    assert result.verdicts() == {SHARDED: "holds", DRAFT: "holds"}
    assert result.summary(DRAFT).count(LAYOUT).checked == 0
    assert "draft steps take the reference's unexpanded map" in _slot_stage(result).reason
    reason = not_applicable_reason(result, result.summary(DRAFT), LAYOUT)
    assert reason.startswith(f"{LAYOUT} under {DRAFT}: no manager lays a draft step out"), reason
