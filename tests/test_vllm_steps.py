"""`pcpcheck vllm SOURCE --steps`: recorded steps (docs/record.md) replayed through a release's
path, judged, and compared integer for integer with what the live ranks recorded.

The recordings are hand-written here in the schema. The 0.29.0 and 0.33.0 wheels come from
pcpcheck's wheel cache (fetched with pip when absent, ~340 MB once)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from pcpcheck.api import check_steps
from pcpcheck.faces.cli import main
from pcpcheck.search.step_replay import DISAGREE, MISMATCH, OUTSIDE, read_recording
from pcpcheck.shared.case import Case
from pcpcheck.shared.errors import SourceError
from pcpcheck.shared.recording import OUTPUTS, SCHEMA
from pcpcheck.shared.source import fetch_release
from pcpcheck_spec.names import COLLECTIVE

RELEASE_TREE = Path(__file__).parent / "vllmlike" / "release"


def wheel(version: str):
    try:
        return fetch_release(version)
    except SourceError as exc:
        pytest.fail(f"cannot fetch vllm=={version}: {exc}", pytrace=False)


def line(rank: int, slot_mapping, nd: int, *, step: int = 7, requests=None, **changes) -> dict:
    record = {
        "schema": SCHEMA, "step": step, "rank": rank, "pcp_size": 2, "dcp_size": 1,
        "dcp_rank": 0, "block_size": 16, "interleave": 1, "graph_size": 0, "dp_pad": 0,
        "shard_decode_requests": False, "kind": "target",
        # The 0.26-0.29 batch-order step (docs/releases.md): the model runner's sort ties the last
        # 1-token chunk of a long prompt (position 4, block 0) with a decode (position 2, block 1)
        # and keeps it first.
        "requests": requests or [
            {"scheduled": 1, "computed": 4, "prefilling": True, "draft_tokens": 0,
             "first_block": 0, "block_ids": [[0], [100]]},
            {"scheduled": 1, "computed": 2, "prefilling": False, "draft_tokens": 0,
             "first_block": 0, "block_ids": [[1], [101]]}],
        "release": {"slot_mapping": slot_mapping, "num_decode_tokens": nd},
    }
    record.update(changes)
    return record


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


# What each era's manager builds for that step (rank-major, width 2): 0.26-0.29 keep the
# prefill first on rank 0 (nd 0) while rank 1 holds the decode (nd 1); 0.30 on sort decodes first.
OLD_ERA = [line(0, [4, 18, -1, -1], 0), line(1, [4, 18, -1, -1], 1)]
NEW_ERA = [line(0, [18, 4, -1, -1], 1), line(1, [18, 4, -1, -1], 1)]


def test_batch_order_step_is_collective_on_0_29_0(tmp_path):
    result = check_steps(wheel("0.29.0"), write(tmp_path / "rank.jsonl", OLD_ERA))
    assert [f.kind for f in result.findings] == [COLLECTIVE], result.text()
    assert result.judged == 1 and result.exit_code == 1


def test_a_violation_among_holding_steps_is_found_on_its_step_only(tmp_path):
    decode = [{"scheduled": 1, "computed": 2, "prefilling": False, "draft_tokens": 0,
               "first_block": 0, "block_ids": [[1]]}]
    records = [line(r, [18, -1], 1, step=s, requests=decode) for s in (6, 8) for r in range(2)]
    result = check_steps(wheel("0.29.0"), write(tmp_path / "rank.jsonl", records + OLD_ERA))
    assert [(f.kind, f.step) for f in result.findings] == [(COLLECTIVE, 7)], result.text()
    assert (result.steps, result.judged) == (3, 3)


def test_a_recorded_violation_is_shrunk_and_written_as_a_reproducer(tmp_path, capsys,
                                                                     monkeypatch):
    old, new = str(wheel("0.29.0")), str(wheel("0.33.0"))
    recording = write(tmp_path / "rank.jsonl", OLD_ERA)
    assert main(["vllm", old, "--steps", recording, "--repro-dir", str(tmp_path / "r")]) == 1
    shrunk = Case.from_json(check_steps(old, recording).findings[0].case).batch
    assert shrunk.block_size < 16 and len(shrunk.requests) == 2  # smaller, still the two requests
    [path] = (tmp_path / "r").glob("test_repro_vllm_*.py")
    assert f"reproducer: {path}" in capsys.readouterr().out
    module = runpy.run_path(str(path))
    [test] = [f for name, f in module.items() if name.startswith("test_")]
    with pytest.raises(AssertionError, match="COLLECTIVE"):
        test()
    monkeypatch.setenv("PCPCHECK_TARGET", new)
    runpy.run_path(str(path))[test.__name__]()  # the same step holds on 0.33.0


def test_options_steps_does_not_honour_are_refused_not_ignored(tmp_path, capsys):
    recording = write(tmp_path / "rank.jsonl", NEW_ERA)
    assert main(["vllm", str(RELEASE_TREE), "--steps", recording, "--json", "x.json"]) == 2
    assert "--steps takes none of --json" in capsys.readouterr().err


def test_repro_dir_without_steps_is_refused(capsys):
    assert main(["vllm", str(RELEASE_TREE), "--repro-dir", "x"]) == 2
    assert "--repro-dir applies to --steps" in capsys.readouterr().err


def test_batch_order_step_holds_on_0_33_0(tmp_path):
    result = check_steps(wheel("0.33.0"), write(tmp_path / "rank.jsonl", NEW_ERA))
    assert result.findings == [] and result.exit_code == 0, result.text()


def test_a_slot_map_the_release_does_not_compute_is_a_mismatch_naming_step_and_rank(tmp_path):
    records = [NEW_ERA[0], line(1, [18, 5, -1, -1], 1)]
    result = check_steps(RELEASE_TREE, write(tmp_path / "rank.jsonl", records))
    assert [(f.kind, f.step) for f in result.findings] == [(MISMATCH, 7)], result.text()
    assert "step 7 rank 1: slot_mapping recorded [18, 5, -1, -1]" in result.findings[0].text


def test_a_num_decode_tokens_mismatch_is_reported_too(tmp_path):
    records = [NEW_ERA[0], line(1, [18, 4, -1, -1], 0)]
    result = check_steps(RELEASE_TREE, write(tmp_path / "rank.jsonl", records))
    assert [f.kind for f in result.findings] == [MISMATCH]
    assert "rank 1: num_decode_tokens recorded 0, the release computes 1" in result.text()


def test_the_vllmlike_release_holds_on_its_own_integers_from_a_directory(tmp_path):
    write(tmp_path / "rank0.jsonl", NEW_ERA[:1])
    write(tmp_path / "rank1.jsonl", NEW_ERA[1:])
    assert main(["vllm", str(RELEASE_TREE), "--steps", str(tmp_path)]) == 0


def test_a_step_outside_the_layout_model_is_reported_not_dropped(tmp_path):
    records = [line(r, [-1] * 4, 0, dcp_size=4, dcp_rank=r) for r in range(2)]
    result = check_steps(RELEASE_TREE, write(tmp_path / "rank.jsonl", records))
    assert [f.kind for f in result.findings] == [OUTSIDE] and result.judged == 0
    assert "D = 1 or D = P" in result.findings[0].text


DRAFT_DECODE = [{"scheduled": 1, "computed": 2, "prefilling": False, "draft_tokens": 0,
                 "first_block": 0, "block_ids": [[1]]}]


def test_a_later_draft_step_with_dp_padding_replays_its_unexpanded_map(tmp_path):
    records = [line(r, [18, -1], 1, kind="draft", dp_pad=1, requests=DRAFT_DECODE)
               for r in range(2)]
    assert check_steps(RELEASE_TREE, write(tmp_path / "a.jsonl", records)).findings == []
    records[1] = line(1, [18, -1], 0, kind="draft", dp_pad=1, requests=DRAFT_DECODE)
    result = check_steps(RELEASE_TREE, write(tmp_path / "b.jsonl", records))
    assert [f.kind for f in result.findings] == [MISMATCH], result.text()


def test_ranks_recording_different_steps_under_one_number_disagree(tmp_path):
    other = json.loads(json.dumps(NEW_ERA[1]))
    other["requests"][0]["computed"] = 5  # the same shape, another step
    records = [NEW_ERA[0], other]
    result = check_steps(RELEASE_TREE, write(tmp_path / "rank.jsonl", records))
    assert DISAGREE in [f.kind for f in result.findings], result.text()
    assert f"{tmp_path / 'rank.jsonl'}:2 (rank 1) differ from {tmp_path / 'rank.jsonl'}:1" \
        in result.text()


def test_a_regime_the_release_cannot_reach_is_outside_with_its_reason(tmp_path):
    records = [line(r, [4, 18, -1, -1], r, shard_decode_requests=True) for r in range(2)]
    result = check_steps(wheel("0.29.0"), write(tmp_path / "rank.jsonl", records))
    assert [f.kind for f in result.findings] == [OUTSIDE] and result.judged == 0, result.text()
    assert "regime sharded: " in result.findings[0].text


MALFORMED = {
    "truncated": lambda text: text[:len(text) // 2],
    "schema": lambda text: text.replace(SCHEMA, "pcpcheck.step/0"),
    "negative": lambda text: text.replace('"scheduled": 1', '"scheduled": -1', 1),
}


@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_line_exits_2_naming_file_and_line(tmp_path, capsys, kind):
    good = json.dumps(NEW_ERA[0])
    path = tmp_path / "rank.jsonl"
    path.write_text(good + "\n" + MALFORMED[kind](good) + "\n")
    assert main(["vllm", str(RELEASE_TREE), "--steps", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}:2: " in err, err
    assert {"truncated": "truncated", "schema": "pcpcheck.step/0",
            "negative": "scheduled must be a whole number >= 0"}[kind] in err


def outputs(rank: int, *, step: int = 7, sha256: str = "ab" * 32) -> dict:
    return {"schema": SCHEMA, "kind": OUTPUTS, "step": step, "rank": rank, "dcp_rank": 0,
            "sha256": sha256}


def test_an_outputs_line_is_attached_to_its_step_and_rank_and_a_missing_one_is_valid(tmp_path):
    """Rank 0's gather returned (its outputs line), rank 1's hung or crashed (none)."""
    path = write(tmp_path / "rank.jsonl", [NEW_ERA[0], NEW_ERA[1], outputs(0)])
    [step] = read_recording(path)
    assert step.ranks[0]["sha256"] == {"outputs": "ab" * 32} and "sha256" not in step.ranks[1]
    result = check_steps(RELEASE_TREE, path)
    assert result.findings == [] and result.outputs_hashed == 1, result.text()
    assert "gather outputs hashed on 1 ranks' steps (recorded, not compared" in result.text()


MALFORMED_OUTPUTS = {
    "sha256 must be 64 lowercase hex digits": outputs(0, sha256="xyz"),
    "outputs line: missing dcp_rank": {k: v for k, v in outputs(0).items() if k != "dcp_rank"},
    "outputs of step 8 rank 0, which has no step line": outputs(0, step=8),
}


@pytest.mark.parametrize("problem", MALFORMED_OUTPUTS)
def test_a_malformed_outputs_line_exits_2_naming_file_and_line(tmp_path, capsys, problem):
    path = write(tmp_path / "rank.jsonl", [NEW_ERA[0], MALFORMED_OUTPUTS[problem], NEW_ERA[1]])
    assert main(["vllm", str(RELEASE_TREE), "--steps", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}:2: {problem}" in err, err
