"""`pcpcheck vllm`: a release's own manager, gather and wrappers, judged on every rank.

Fixtures are the project's own vLLM-style files (tests/vllmlike/): a correct release tree and
bug files that each change one method; a test assembles a checkout with one file swapped.
The real 0.33.0 wheel is fetched at test time (pip download into a temporary directory).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pcpcheck.cli import main
from pcpcheck.runner import ThreadRunner
from pcpcheck.vllm.release import InterfaceDrift, load_release
from pcpcheck.vllm.source import GATHERS, MANAGER, SourceError, fetch_release
from pcpcheck.vllm.verdict import check_release, counterexample
from spec.names import DCP, DRAFT, DRAFT_MIXED, LAYOUT, REPLICATED, RETURNS, SHARDED

VLLMLIKE = Path(__file__).parent / "vllmlike"
RELEASE = VLLMLIKE / "release"
EXAMPLES = 150


def checkout(tmp_path: Path, manager: str | None = None, gather: str | None = None) -> Path:
    """The fixture release tree, with its manager or gather file replaced by a fixture file."""
    root = tmp_path / "checkout"
    shutil.copytree(RELEASE, root)
    if manager:
        shutil.copy(VLLMLIKE / manager, root / MANAGER)
    if gather:
        shutil.copy(VLLMLIKE / gather, root / GATHERS[0])
    return root


def run(source, regimes, examples=EXAMPLES, **kwargs):
    source = str(source) if isinstance(source, Path) else source
    return check_release(source, ThreadRunner(timeout=10), regimes=regimes,
                         max_examples=examples, max_ranks=4, **kwargs)


def test_correct_fixture_release_holds_and_names_its_files(tmp_path):
    outcome = run(RELEASE, (SHARDED, REPLICATED, DCP, DRAFT))
    assert outcome.verdicts() == {r: "holds" for r in (SHARDED, REPLICATED, DCP, DRAFT)}
    release = outcome.release
    assert set(release.files) == {MANAGER, GATHERS[0]}
    assert all(len(digest) == 64 for digest in release.files.values())
    assert "vllm.config.CUDAGraphMode (working stand-in)" in release.adapted
    assert any(name.endswith("get_pcp_group") for name in release.stand_ins)
    assert all(r.cases == EXAMPLES for r in outcome.results)
    assert (release.caps.era, release.caps.wrapper_shard_keyword) == ("0.30",
                                                                      "pcp_shard_decode_requests")


# file, replaced part, regime, the exact ID, extra options
BUGS = [
    ("bug09_mla_zero_rows.py", "gather", SHARDED, RETURNS, {"empty_steps": True}),
    ("bug13_decodes_not_prefix.py", "manager", REPLICATED, LAYOUT, {}),
    ("bug14_rank_dependent_order.py", "manager", DCP, LAYOUT, {}),
    ("bug15_dcp_short_prefill.py", "manager", DCP, LAYOUT, {}),
]


@pytest.mark.parametrize("fixture, part, regime, invariant, options", BUGS)
def test_bug_fixture_reports_its_exact_id(tmp_path, fixture, part, regime, invariant, options):
    root = checkout(tmp_path, **{part: fixture})
    outcome = run(root, (regime,), **options)
    first = [o.violations[0].invariant for _, o in outcome.counterexamples]
    assert first and first[0] == invariant, outcome.verdicts()


def test_zero_rows_are_a_hazard_only_when_asked(tmp_path):
    """Class 9 needs a step with no token, which the model runner never runs: opt-in."""
    root = checkout(tmp_path, gather="bug09_mla_zero_rows.py")
    assert run(root, (SHARDED,)).verdicts() == {SHARDED: "holds"}


def test_layout_counterexample_is_shrunk_and_shows_both_layouts(tmp_path):
    outcome = run(checkout(tmp_path, manager="bug15_dcp_short_prefill.py"), (DCP,))
    _, observation = outcome.counterexamples[0]
    batch = observation.prepared.case.batch
    # the minimal witness: P = 2 and one 3-token prefill, (2P-1)*ceil(3/4) == 3
    assert (batch.pcp_size, [r.num_tokens for r in batch.requests if r.num_tokens]) == (2, [3])
    text = counterexample(outcome.release, DCP, observation)
    assert "LAYOUT violated" in text and "replay: pcpcheck vllm" in text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["replicated", "reference"])
    assert lines[at].endswith("True]")  # the reference replicates the 3-token prefill
    assert lines[at + 1].split()[0] == "release" and lines[at + 1].endswith("False]")  # split


def test_rank_dependent_layout_blames_the_odd_ranks_manager(tmp_path):
    outcome = run(checkout(tmp_path, manager="bug14_rank_dependent_order.py"), (DCP,))
    layout = outcome.counterexamples[0][1].violations[0]
    assert layout.invariant == LAYOUT and layout.ranks == [1]


def test_unreachable_regimes_are_not_applicable_with_the_reason(tmp_path):
    outcome = run(checkout(tmp_path, manager="no_drafts.py"), (REPLICATED, DRAFT, DRAFT_MIXED))
    verdicts = outcome.verdicts()
    assert verdicts[REPLICATED] == "holds"
    for regime in (DRAFT, DRAFT_MIXED):
        assert verdicts[regime] == ("n/a: its validate_config rejects drafts: this release's PCP "
                                    "does not support speculative decoding")
    assert not outcome.counterexamples


def test_interface_drift_is_one_line_exit_2(tmp_path, capsys):
    root = checkout(tmp_path)
    path = root / MANAGER
    path.write_text(path.read_text().replace("def _convert_to_gathered_slot_mappings",
                                             "def _expand_slot_mappings"))
    assert main(["vllm", str(root), "--max-examples", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("pcpcheck: InterfaceDrift: PCPManager has no _convert_to_gathered_slot_mappings "
                   "(renamed or removed in this release)")


def test_bad_source_is_one_line_exit_2(tmp_path, capsys):
    assert main(["vllm", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"pcpcheck: SourceError: {tmp_path}: no {MANAGER} "
                                               "(not a vLLM checkout with the PCP manager)")


def test_cli_json_names_release_files_and_verdicts(tmp_path):
    report = tmp_path / "verdict.json"
    code = main(["vllm", str(checkout(tmp_path, manager="bug13_decodes_not_prefix.py")),
                 "--regime", "replicated", "--max-examples", "100", "--max-ranks", "3",
                 "--json", str(report)])
    document = json.loads(report.read_text())
    assert code == 1 and document["verdict"] == "violated"
    assert document["layout_model"] == "0.30" and MANAGER in document["files"]
    assert document["counterexamples"][0]["invariant"] == LAYOUT
    replay = document["counterexamples"][0]["case"]
    again = checkout(tmp_path / "again", manager="bug13_decodes_not_prefix.py")
    assert main(["vllm", str(again), "--replay", json.dumps(replay)]) == 1


def test_release_0_33_0_wheel_holds_end_to_end(tmp_path):
    """The real release, fetched at test time into pip's cache (a repeat is fast)."""
    try:
        wheel = fetch_release("0.33.0", tmp_path)
    except SourceError as exc:
        pytest.fail(f"cannot fetch vllm==0.33.0 from the package registry: {exc}", pytrace=False)
    release = load_release(str(wheel))
    assert release.caps.manager_shards and release.caps.wrapper_shard_keyword
    outcome = run(release, (SHARDED, REPLICATED, DCP, DRAFT), examples=40)
    assert outcome.verdicts() == {r: "holds" for r in (SHARDED, REPLICATED, DCP, DRAFT)}
    assert "vllm/v1/worker/gpu/pcp_manager.py" in release.files


def test_interface_errors_are_typed(tmp_path):
    with pytest.raises(SourceError):
        load_release(str(tmp_path / "missing.whl"))
    root = checkout(tmp_path)
    path = root / MANAGER
    path.write_text(path.read_text().replace("dcp_world_size: int = 1,", ""))
    with pytest.raises(InterfaceDrift, match="dcp_world_size"):
        load_release(str(root))


@pytest.mark.parametrize("relpath, old, new, named", [
    (MANAGER, "global_batch_slice", "batch_slice", "global_batch_slice"),  # a segment field
    (GATHERS[0], "maybe_gather_indexer_k(k,", "maybe_gather_indexer_k(keys,", "'k'"),  # a keyword
])
def test_a_renamed_field_or_keyword_is_drift_naming_it(tmp_path, relpath, old, new, named):
    path = checkout(tmp_path) / relpath
    path.write_text(path.read_text().replace(old, new))
    with pytest.raises(InterfaceDrift, match=named):
        load_release(str(path.parents[len(Path(relpath).parts) - 1]))
