"""`pcpcheck vllm`: a release's own manager, gather and wrappers, judged on every rank.

Fixtures are the project's own vLLM-style files (tests/vllmlike/): a correct release tree and
bug files that each change one method; a test assembles a checkout with one file swapped.
The real 0.33.0 wheel is fetched at test time (pip download into a temporary directory).
The release's code runs only in the backend's worker process, never in the driver.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from pcpcheck.api import CheckResult, check_release
from pcpcheck.faces.cli import main
from pcpcheck.shared.case import Case, TensorSpec
from pcpcheck.shared.errors import InterfaceDrift, SourceError
from pcpcheck.shared.source import GATHERS, MANAGER, fetch_release
from pcpcheck.worker.release_calls import CALLER_FILES
from pcpcheck_spec.names import (
    DCP,
    DRAFT,
    DRAFT_MIXED,
    LAYOUT,
    REPLICATED,
    RETURNS,
    SHARDED,
    Batch,
    Request,
)
from pcpcheck_spec.registry import GATHER_IDS, RELEASE, pairs
from tests.test_vllm_draft import LAYOUT_TRIGGERED

VLLMLIKE = Path(__file__).parent / "vllmlike"
RELEASE_TREE = VLLMLIKE / "release"
EXAMPLES = 150


def checkout(tmp_path: Path, manager: str | None = None, gather: str | None = None) -> Path:
    """The fixture release tree, with its manager or gather file replaced by a fixture file."""
    root = tmp_path / "checkout"
    shutil.copytree(RELEASE_TREE, root)
    if manager:
        shutil.copy(VLLMLIKE / manager, root / MANAGER)
    if gather:
        shutil.copy(VLLMLIKE / gather, root / GATHERS[0])
    return root


def run(source, regimes, examples=EXAMPLES, **kwargs):
    return check_release(source, regimes=regimes, max_examples=examples, max_ranks=4, **kwargs)


def test_correct_fixture_release_holds_and_names_its_files():
    result = run(RELEASE_TREE, (SHARDED, REPLICATED, DCP, DRAFT))
    assert result.verdicts() == {r: "holds" for r in (SHARDED, REPLICATED, DCP, DRAFT)}
    release = result.release
    files = dict(release.files)
    assert set(files) == {MANAGER, GATHERS[0], *CALLER_FILES}  # the callers: how they call
    assert all(len(digest) == 64 for digest in files.values())
    assert any(line.startswith("vllm.config.CUDAGraphMode (working stand-in; vllm.config: ")
               for line in release.adapted), release.adapted
    # the fixture tree has no process-group module: the harness's get_pcp_group serves
    assert any(line.startswith("no Python file for it in this tree")
               and "vllm.distributed.parallel_state" in line for line in result.stand_ins)
    assert all(r.cases == EXAMPLES for r in result.regimes)
    assert (release.layout_model, release.capabilities["wrapper_shard_keyword"]) == (
        "0.30", "pcp_shard_decode_requests")
    assert all(r.count(LAYOUT).checked == EXAMPLES for r in result.regimes if r.regime != DRAFT)


def test_release_code_runs_only_in_a_worker_process(tmp_path):
    """The manager file records the pid of every process that executes it: never the driver's."""
    root = checkout(tmp_path)
    marker = tmp_path / "executed_by"
    with open(root / MANAGER, "a") as handle:
        handle.write(f"\nimport os as _os\nopen({str(marker)!r}, 'a').write(f'{{_os.getpid()}}\\n')\n")
    assert run(root, (REPLICATED,), examples=5).verdicts() == {REPLICATED: "holds"}
    pids = {int(line) for line in marker.read_text().split()}
    assert pids and os.getpid() not in pids


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
    result = run(root, (regime,), **options)
    assert result.counterexamples and result.counterexamples[0].invariant == invariant, \
        result.verdicts()


# The registry's IDs that only `pcpcheck vllm` evaluates, and the fixture that makes each fire in
# each regime it applies to (the gather IDs' triggers are tests/zoo/triggers.py: test_zoo.py).
RELEASE_TRIGGERS = {
    (LAYOUT, SHARDED): "bug13_decodes_not_prefix.py",
    (LAYOUT, REPLICATED): "bug13_decodes_not_prefix.py",
    (LAYOUT, DCP): "bug15_dcp_short_prefill.py",
}
# LAYOUT under the draft regimes needs the release's slot kernel and speculators, which no
# vllmlike fixture has: a wheel's changed kernel triggers it (tests/test_vllm_draft.py)
WHEEL_TRIGGERED = {(LAYOUT, regime) for regime in LAYOUT_TRIGGERED}
RELEASE_PAIRS = [(i, r) for i, r in pairs(RELEASE)
                 if i not in GATHER_IDS and (i, r) not in WHEEL_TRIGGERED]


def test_every_release_invariant_has_a_trigger_in_every_regime_it_applies_to():
    """Each pair of a release ID and a regime it applies to fires in a test: a vllmlike fixture
    below, or the wheel's changed kernel of tests/test_vllm_draft.py."""
    wanted = {(i, r) for i, r in pairs(RELEASE) if i not in GATHER_IDS}
    assert wanted == set(RELEASE_TRIGGERS) | WHEEL_TRIGGERED


@pytest.mark.parametrize("invariant, regime", RELEASE_PAIRS,
                         ids=[f"{i}-{r}" for i, r in RELEASE_PAIRS])
def test_every_release_invariant_fires_in_every_regime_it_applies_to(tmp_path, invariant, regime):
    fixture = RELEASE_TRIGGERS.get((invariant, regime))
    assert fixture, f"no vllmlike fixture triggers {invariant} in {regime}"
    result = run(checkout(tmp_path, manager=fixture), (regime,))
    assert [c.invariant for c in result.counterexamples][:1] == [invariant], result.verdicts()


def test_zero_rows_are_a_hazard_only_when_asked(tmp_path):
    """Class 9 needs a step with no token, which the model runner never runs: opt-in."""
    root = checkout(tmp_path, gather="bug09_mla_zero_rows.py")
    assert run(root, (SHARDED,)).verdicts() == {SHARDED: "holds"}


def test_layout_counterexample_is_shrunk_and_shows_both_layouts(tmp_path):
    result = run(checkout(tmp_path, manager="bug15_dcp_short_prefill.py"), (DCP,))
    counterexample = result.counterexamples[0]
    batch = counterexample.observation.prepared.case.batch
    # a minimal witness at P = 2: a prefill of q = 3, (2P-1)*ceil(3/4) == 3, or of q = 0 beside a
    # decode (the off-by-one splits it too; a step with no token at all is never run)
    prefills = [r.num_tokens for r in batch.requests if r.prefilling]
    assert batch.pcp_size == 2 and prefills in ([3], [0]), counterexample.report
    assert sum(r.num_tokens for r in batch.requests) <= 3, counterexample.report
    text = counterexample.report
    assert "LAYOUT violated" in text and "replay: pcpcheck vllm" in text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["replicated", "reference"])
    assert lines[at].endswith("True]")  # the reference replicates the 3-token prefill
    assert lines[at + 1].split()[0] == "release" and lines[at + 1].endswith("False]")  # split


def test_rank_dependent_layout_blames_the_odd_ranks_manager(tmp_path):
    result = run(checkout(tmp_path, manager="bug14_rank_dependent_order.py"), (DCP,))
    layout = result.counterexamples[0]
    assert layout.invariant == LAYOUT and layout.ranks == (1,)


def test_unreachable_regimes_are_not_applicable_with_the_reason(tmp_path):
    result = run(checkout(tmp_path, manager="no_drafts.py"), (REPLICATED, DRAFT, DRAFT_MIXED))
    verdicts = result.verdicts()
    assert verdicts[REPLICATED] == "holds"
    for regime in (DRAFT, DRAFT_MIXED):
        assert verdicts[regime] == ("n/a: its validate_config rejects drafts: this release's PCP "
                                    "does not support speculative decoding")
    assert not result.counterexamples


def test_a_probe_that_cannot_be_evaluated_leaves_its_regimes_not_evaluated(tmp_path, capsys):
    """validate_config reads a field pcpcheck's synthetic config lacks, for drafts only: the draft
    regimes are "not evaluated" with the reason (verdict line and JSON), nothing drawn, never
    assumed either way; the other regimes are checked."""
    root = checkout(tmp_path)
    path = root / MANAGER
    path.write_text(path.read_text().replace(
        '        """Every configuration pcpcheck draws is supported."""\n',
        '        """Drafts: asks a config field pcpcheck does not model."""\n'
        '        if vllm_config.speculative_config is not None:\n'
        '            vllm_config.speculative_config.draft_tensor_parallel_size\n', 1))
    out = tmp_path / "result.json"
    assert main(["vllm", str(root), "--regime", "replicated", "--regime", "draft",
                 "--max-examples", "5", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    reason = ("not evaluated: its validate_config(PCP=2, DCP=1, drafts=True) raised "
              "AttributeError: 'types.SimpleNamespace' object has no attribute "
              "'draft_tensor_parallel_size'")
    assert json.loads(out.read_text())["verdicts"] == {REPLICATED: "holds", DRAFT: reason}
    assert f"draft {reason}" in " ".join(text.split()), text
    assert not [line for line in text.splitlines() if "validate_config" in line and "assum" in line]


def test_interface_drift_is_one_line_exit_2(tmp_path, capsys):
    root = checkout(tmp_path)
    path = root / MANAGER
    path.write_text(path.read_text().replace("def _convert_to_gathered_slot_mappings",
                                             "def _expand_slot_mappings"))
    assert main(["vllm", str(root), "--max-examples", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("pcpcheck: cannot drive this vLLM release: PCPManager has no _convert_to_gathered_slot_mappings "
                   "(renamed or removed in this release)")


def test_bad_source_is_one_line_exit_2(tmp_path, capsys):
    assert main(["vllm", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"pcpcheck: cannot read the vLLM source: {tmp_path}: no {MANAGER} "
                                               "(not a vLLM checkout with the PCP manager)")


def test_cli_json_names_release_files_and_verdicts(tmp_path, capsys):
    report = tmp_path / "verdict.json"
    code = main(["vllm", str(checkout(tmp_path, manager="bug13_decodes_not_prefix.py")),
                 "--regime", "replicated", "--max-examples", "100", "--max-ranks", "3",
                 "--json", str(report)])
    document = json.loads(report.read_text())
    assert code == 1 and document["verdict"] == "violated"
    assert document["release"]["layout_model"] == "0.30" and MANAGER in document["release"]["files"]
    assert document["counterexamples"][0]["invariant"] == LAYOUT
    assert CheckResult.from_json(report.read_text()).release.files == tuple(
        document["release"]["files"].items())  # the API reads it back
    assert "wrapper keyword pcp_shard_decode_requests" in capsys.readouterr().out
    replay = document["counterexamples"][0]["case"]
    again = checkout(tmp_path / "again", manager="bug13_decodes_not_prefix.py")
    assert main(["vllm", str(again), "--replay", json.dumps(replay)]) == 1
    assert main(["vllm", str(checkout(tmp_path / "fixed")), "--replay", json.dumps(replay)]) == 0


def test_draft_mixed_is_opt_in_for_releases(tmp_path):
    """The default regimes leave out the hazard regime, as `pcpcheck check` does."""
    result = check_release(RELEASE_TREE, max_examples=3, max_ranks=2)
    assert DRAFT_MIXED not in [r.regime for r in result.regimes]
    assert DRAFT_MIXED in [r.regime for r in check_release(
        RELEASE_TREE, regimes=(DRAFT_MIXED,), max_examples=3, max_ranks=2).regimes]


def test_release_0_33_0_wheel_holds_end_to_end(wheel):
    """The real release, fetched at test time into pcpcheck's wheel cache."""
    result = run(wheel, (SHARDED, REPLICATED, DCP, DRAFT), examples=40)
    assert result.release.capabilities["manager_shards"]
    assert result.release.capabilities["wrapper_shard_keyword"]
    assert result.verdicts() == {r: "holds" for r in (SHARDED, REPLICATED, DCP, DRAFT)}
    assert "vllm/v1/worker/gpu/pcp_manager.py" in dict(result.release.files)


def test_a_wheel_is_never_seen_half_written(tmp_path, monkeypatch):
    """Two runs (xdist workers, CI jobs) fetch into one cache: pip writes elsewhere and the
    wheel appears whole, so the other run never opens a truncated zip."""
    import subprocess

    from pcpcheck.shared import source

    def pip_download(command, **_):
        into = Path(command[command.index("-d") + 1])
        (into / "vllm-9.9.9-py3-none-any.whl").write_bytes(b"half")
        assert not [p for p in tmp_path.glob("vllm-9.9.9-*.whl") if p.is_file()], \
            "a reader would see the partial wheel"
        (into / "vllm-9.9.9-py3-none-any.whl").write_bytes(b"whole")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(source.subprocess, "run", pip_download)
    wheel = fetch_release("9.9.9", tmp_path)
    assert wheel.parent == tmp_path and wheel.read_bytes() == b"whole"
    assert [p.name for p in tmp_path.iterdir()] == [wheel.name]  # no private folder left
    # a cached wheel that is a dangling link (what it pointed at was deleted) is fetched again
    wheel.unlink()
    wheel.symlink_to(tmp_path / "deleted.whl")
    again = fetch_release("9.9.9", tmp_path)
    assert again == wheel and not again.is_symlink() and again.read_bytes() == b"whole"


def test_interface_errors_are_typed(tmp_path):
    with pytest.raises(SourceError):
        check_release(tmp_path / "missing.whl", max_examples=1)
    root = checkout(tmp_path)
    path = root / MANAGER
    path.write_text(path.read_text().replace("dcp_world_size: int = 1,", ""))
    with pytest.raises(InterfaceDrift, match="dcp_world_size"):
        check_release(root, max_examples=1)


@pytest.mark.parametrize("relpath, old, new, named", [
    (MANAGER, "global_batch_slice", "batch_slice", "global_batch_slice"),  # a segment field
    # a caller's keyword the wrapper lacks: pcpcheck cannot call it as its callers do
    (CALLER_FILES[1], "self.use_pcp,\n", "self.use_pcp, layer=self,\n", "layer="),
])
def test_a_renamed_field_or_keyword_is_drift_naming_it(tmp_path, relpath, old, new, named):
    path = checkout(tmp_path) / relpath
    path.write_text(path.read_text().replace(old, new))
    with pytest.raises(InterfaceDrift, match=named):
        check_release(path.parents[len(Path(relpath).parts) - 1], max_examples=1)


def test_a_hanging_manager_gets_a_verdict(tmp_path, capsys):
    """Release code is untrusted: a manager that never returns on some steps (P = 3 here; the
    load-time probe uses P = 2) costs its worker, never the driver; the step gets a verdict."""
    root = checkout(tmp_path)
    path = root / MANAGER
    path.write_text(path.read_text().replace(
        "        size = self.pcp_world_size\n",
        "        size = self.pcp_world_size\n        while size == 3:\n            pass\n", 1))
    step = Case(Batch(REPLICATED, 3, (Request(1, False, 0, (0,)),), 16),
                (TensorSpec((4,), "float32"),)).to_json()
    assert main(["vllm", str(root), "--replay", step, "--timeout", "1"]) == 1
    out = capsys.readouterr().out
    assert "did not return within 1 s" in out and "violated on rank(s)" in out


def test_cli_writes_ci_outputs_and_honours_a_baseline(tmp_path, capsys):
    """`pcpcheck vllm` writes what `pcpcheck check` writes for CI (the Action's outputs), and a
    listed violation is known: exit 0, a skipped JUnit case, `(known)` in the summary."""
    root = checkout(tmp_path, manager="bug13_decodes_not_prefix.py")
    out = tmp_path / "out"
    args = ["vllm", str(root), "--regime", "replicated", "--max-examples", "100", "--max-ranks", "3",
            "--junit", str(out / "x.xml"), "--summary", str(out / "s.md"), "--html", str(out / "html")]
    out.mkdir()
    assert main(args) == 1
    summary = (out / "s.md").read_text()
    assert "| LAYOUT | " in summary and "FAIL **new**" in summary
    assert "violation(s) (regime x invariant)" in summary.splitlines()[0]
    assert '<failure type="LAYOUT"' in (out / "x.xml").read_text()
    assert (out / "html" / "index.html").is_file() and len(list((out / "html").glob("*.html"))) > 1
    baseline = tmp_path / "baseline"
    # the manager's wrong layout also breaks the gather beside it: each violated ID is listed
    baseline.write_text("replicated LAYOUT\nreplicated COLLECTIVE\nreplicated REPLICA\n")
    assert main([*args, "--baseline", str(baseline)]) == 0
    summary = (out / "s.md").read_text()
    assert "FAIL (known)" in summary and "no violation outside the baseline" in summary
    assert re.search(r'name="LAYOUT" [^>]*><skipped message="known violation', (out / "x.xml").read_text())
