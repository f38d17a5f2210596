"""--shard K/N and `pcpcheck merge`: a run split N ways for a CI's parallel jobs, its parts
disjoint and together the whole, joined into the unsplit run's count, verdict and coverage; a
merge lacking a part is incomplete, never a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcpcheck.api import check, merge
from pcpcheck.faces.cli import main
from pcpcheck.search import shard as shards
from pcpcheck.shared.errors import UsageError
from pcpcheck_spec.names import DCP, REPLICATED
from tests.test_api import _schema, conforms

ZOO = Path(__file__).resolve().parent / "zoo"
SCOPE = "ranks=2,requests=2,tokens=2"
REGIMES = (REPLICATED, DCP)


def _run(target, threads_backend, shard=None, **options):
    return check(target, regimes=REGIMES, exhaustive=True, scope=SCOPE, runner=threads_backend,
                 shard=shard, **options)


def _tally(result) -> dict:
    """What must not depend on the split: per regime, the steps, the invariants' counts and the
    coverage."""
    return {s.regime: (s.cases, s.scope_steps, s.invariants, s.branches, s.features)
            for s in result.regimes}


def test_three_shards_merge_into_the_unsplit_runs_count_verdict_and_coverage(threads_backend):
    whole = _run("impl", threads_backend)
    parts = [_run("impl", threads_backend, f"{k}/3") for k in (1, 2, 3)]
    assert [p.options.shard for p in parts] == [(1, 3), (2, 3), (3, 3)]
    assert sum(p.summary(DCP).cases for p in parts) == whole.summary(DCP).cases > 0
    merged = merge(reversed(parts))  # in any order
    assert _tally(merged) == _tally(whole)
    assert (merged.verdict, merged.exit_code) == (whole.verdict, 0) == ("holds", 0)
    assert all(s.complete for s in merged.regimes)
    # through the parts' JSON, as a CI's jobs hand them over
    assert _tally(merge([type(p).from_json(p.to_json()) for p in parts])) == _tally(whole)


def test_a_merge_lacking_a_part_is_incomplete_not_a_pass(threads_backend):
    parts = [_run("impl", threads_backend, f"{k}/3") for k in (1, 3)]
    merged = merge(parts)
    assert merged.holds and merged.incomplete and merged.missing_shards == (2,)
    assert (merged.verdict, merged.exit_code) == ("incomplete", 2)
    document = json.loads(merged.to_json())
    assert document["verdict"] == "incomplete" and document["merge"] == {"shards": 3, "missing": [2]}
    from pcpcheck.render.report import result_text
    assert "incomplete: shard 2/3 missing" in result_text(merged)


def test_a_violation_merges_to_the_unsplit_runs_smallest_step(threads_backend):
    target = ZOO / "bug04_truncated_slots.py"
    whole = _run(target, threads_backend)
    parts = [_run(target, threads_backend, f"{k}/3") for k in (1, 2, 3)]
    merged = merge(parts)
    assert merged.verdict == whole.verdict == "violated"
    assert merged.failures == whole.failures
    first, found = whole.counterexamples[0], merged.counterexamples[0]
    assert (found.regime, found.invariant) == (first.regime, first.invariant)
    size = [(b["pcp_size"], len(b["requests"]), sum(r["num_tokens"] for r in b["requests"]))
            for b in (json.loads(c.case)["batch"] for c in (first, found))]
    assert size[0] == size[1]
    assert merge(parts[:2]).exit_code == 1  # a violation fails even an incomplete merge


def test_random_shards_split_the_cases_with_seeds_of_their_own(threads_backend):
    parts = [check("impl", regimes=(REPLICATED,), max_examples=50, runner=threads_backend,
                   shard=(k, 3)) for k in (1, 2, 3)]
    assert [p.summary(REPLICATED).cases for p in parts] == [17, 17, 16]
    assert shards.part_seed(0, (1, 3)) != shards.part_seed(0, (2, 3)) != shards.part_seed(0, None)
    assert merge(parts).summary(REPLICATED).cases == 50


@pytest.mark.parametrize("text", ["0/3", "4/3", "2", "a/b", "1/0"])
def test_a_malformed_shard_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--shard"):
        check("impl", shard=text)


def test_merge_on_the_command_line(threads_backend, tmp_path, capsys):
    paths = []
    for k in (1, 2):
        paths.append(tmp_path / f"part{k}.json")
        paths[-1].write_text(_run("impl", threads_backend, f"{k}/2").to_json())
    assert main(["merge", *map(str, paths), "--json", str(tmp_path / "merged.json")]) == 0
    document = json.loads((tmp_path / "merged.json").read_text())
    assert document["merge"] == {"shards": 2, "missing": []}
    assert conforms(document, _schema("pcpcheck check result")) == []
    assert conforms(json.loads(paths[0].read_text()), _schema("pcpcheck check result")) == []
    capsys.readouterr()
    assert main(["merge", str(paths[0])]) == 2
    assert "incomplete: shard 2/2 missing" in capsys.readouterr().out
    for argv, fragment in (([str(paths[0]), str(paths[0])], "shard 1/2 given twice"),
                           ([str(tmp_path / "none.json")], "no such file"),
                           ([str(tmp_path / "merged.json")], "not of a part")):
        assert main(["merge", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
