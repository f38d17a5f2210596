"""`pcpcheck vllm` runs the release's own block tables and slot-mapping kernel (block_table.py,
under triton's CPU interpreter), and its path table says which stage ran the release's code.

Checkouts are built at test time from the 0.33.0 wheel (fetched as test_vllm.py fetches it;
nothing of vLLM is committed), with one line of block_table.py's `_compute_slot_mappings_kernel`
changed (bug class 15: an off-by-one in the DCP ownership test or in the local offset).
Those marked `kernels` skip without triton (tests/conftest.py); .ci/run runs them in its stage
with pcpcheck[kernels] installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pcpcheck.api import check_release
from pcpcheck.faces.cli import main
from pcpcheck.search.release_search import era_case
from pcpcheck.shared.case import Case, TensorSpec
from pcpcheck.shared.errors import InterfaceDrift
from pcpcheck.shared.protocol import BATCH_ORDER, SLOT_MAPPING, SPLIT, Capabilities
from pcpcheck.shared.source import GATHERS, MANAGER
from pcpcheck.worker.release_excerpts import (
    BACKEND_UTILS,
    MODEL_RUNNER,
    PARALLEL_CONFIG,
    VLLM_CONFIG,
    check_sort,
    step_order,
)
from pcpcheck.worker.release_kernels import BLOCK_TABLE, BUFFER_UTILS, NO_TRITON
from pcpcheck_spec.names import (
    DCP,
    LAYOUT,
    PAD_HYGIENE,
    REPLICA,
    REPLICATED,
    SHARD,
    Batch,
    Request,
)

pytestmark = pytest.mark.xdist_group("vllm_0_33_0_wheel")

FILES = (MANAGER, GATHERS[0], BLOCK_TABLE, BUFFER_UTILS, MODEL_RUNNER, BACKEND_UTILS,
         "vllm/_version.py")
CONFIGS = (PARALLEL_CONFIG, VLLM_CONFIG)
# validate_block_size accepting the default interleave size alone
DEFAULT_INTERLEAVE_ONLY = (
    VLLM_CONFIG, "block_size % self.parallel_config.cp_kv_cache_interleave_size == 0",
    "block_size == self.parallel_config.cp_kv_cache_interleave_size * 0 + 1")
# (file, a line of it, the same line with the off-by-one)
OWNERSHIP = (BLOCK_TABLE,
             "is_local = virtual_block_offsets // CP_INTERLEAVE % CP_SIZE == cp_rank",
             "is_local = (virtual_block_offsets + 1) // CP_INTERLEAVE % CP_SIZE == cp_rank")
LOCAL_OFFSET = (BLOCK_TABLE, "local_offsets = rounds * CP_INTERLEAVE + remainder",
                "local_offsets = rounds * CP_INTERLEAVE + remainder + 1")
# the replicated group (dcp_sharded False, 0.31 on) treated as sharded
REPLICATED_GROUP_SHARDED = (BLOCK_TABLE, "is_local = ~sharded | is_local", "is_local = is_local")
# a dummy request (idx_mapping == -1, 0.31 on) no longer masked in the slots the kernel writes
DUMMY_UNMASKED = (BLOCK_TABLE,
                  "slot_ids = tl.where(mapping_enabled & is_real_req, slot_ids, PAD_ID)",
                  "slot_ids = tl.where(mapping_enabled, slot_ids, PAD_ID)")
SORT_LOSES_ONE = (MODEL_RUNNER, "return sorted(num_tokens_per_req, key=key)",
                  "return sorted(num_tokens_per_req, key=key)[1:]")
SPLIT_ONE_MORE = (BACKEND_UTILS, "num_decode_tokens = query_start_loc[first_prefill].item()",
                  "num_decode_tokens = query_start_loc[first_prefill].item() + 1")
# A `triton` package first on a pcpcheck subprocess's PYTHONPATH hides the real one from it.
HIDDEN_TRITON = 'raise ImportError("triton hidden by the test")\n'


def checkout(wheel: Path, root: Path, change: tuple[str, str, str] | None = None,
             more: tuple[str, ...] = ()) -> Path:
    """The release's Python files as a checkout (its PCP files, `more`, and every module they
    may import), with `change` (file, old, new) made exactly once."""
    with zipfile.ZipFile(wheel) as archive:
        names = {n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")}
        for relpath in sorted(names | set(FILES + more)):
            target = root / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(relpath))
    if change:
        relpath, old, new = change
        text = (root / relpath).read_text()
        assert text.count(old) == 1, f"{old!r} is not once in {relpath}"
        (root / relpath).write_text(text.replace(old, new))
    return root


@pytest.mark.kernels
@pytest.mark.parametrize("change", [OWNERSHIP, LOCAL_OFFSET, REPLICATED_GROUP_SHARDED],
                         ids=["ownership", "local-offset", "replicated-group"])
def test_an_off_by_one_in_the_slot_kernel_is_found(wheel, tmp_path, change):
    """The manager's own prepare_slot_mappings runs the (changed) kernel: the expanded slot map
    it builds differs from the reference's (LAYOUT, the manager's `expanded` field). The caches
    need not show it too: the shrunk step's first KV group may land right by accident (a local
    offset one past a request's last block reads a zero table entry), its second does not."""
    root = checkout(wheel, tmp_path / "checkout", change)
    result = check_release(root, regimes=(DCP,), max_examples=40, max_ranks=2)
    assert result.counterexamples and result.counterexamples[0].invariant == LAYOUT, \
        result.verdicts()
    report = result.counterexamples[0].report
    assert "expanded           reference" in report, report
    stage = next(p for p in result.release.paths if p.stage == SLOT_MAPPING)
    digest = hashlib.sha256((root / BLOCK_TABLE).read_bytes()).hexdigest()
    assert (stage.status, stage.file, stage.sha256) == ("real", BLOCK_TABLE, digest)
    assert dict(result.regimes[0].real_stages)[SLOT_MAPPING] > 0
    assert result.release.capabilities["replicated_kv_group"]  # 0.33 shards per KV group


def _changed_exits_1_release_exits_0(wheel, tmp_path, capsys, mutation) -> tuple[str, str]:
    """`pcpcheck vllm` on a checkout with `mutation` (exit 1) and on the release (exit 0), in dcp
    and replicated at P = 2: what each printed."""
    options = ["--regime", "dcp", "--regime", "replicated", "--max-examples", "40",
               "--max-ranks", "2"]
    assert main(["vllm", str(checkout(wheel, tmp_path / "changed", mutation)), *options]) == 1
    changed = capsys.readouterr().out
    assert main(["vllm", str(checkout(wheel, tmp_path / "release")), *options]) == 0
    return changed, capsys.readouterr().out


@pytest.mark.kernels
def test_the_cli_exits_1_on_the_changed_kernel_and_0_on_the_release(wheel, tmp_path, capsys):
    changed, release = _changed_exits_1_release_exits_0(wheel, tmp_path, capsys, OWNERSHIP)
    assert "LAYOUT violated" in changed
    assert f"    {SLOT_MAPPING:<27} real     {BLOCK_TABLE}" in release, release
    # the kernel ran on every step of both regimes, whatever its size: no "on N of M steps"
    rows = release.splitlines()
    row = rows.index(next(r for r in rows if r.startswith(f"    {SLOT_MAPPING:<27} real")))
    assert rows[row + 1].strip().startswith("(every step of the expanded regimes, through the "
                                            "manager's prepare_slot_mappings"), rows[row + 1]


# A gather that skips the gather when its map has more written slots than the rank has rows (a
# DCP-sharded group's map has about 1/D of the tokens: rarely; the replicated group's has them
# all: whenever a prefill is split): it writes only the rank's own rows there.
NO_GATHER_WHEN_MOSTLY_LOCAL = (
    GATHERS[0], "    gathered_slot_mapping = slot_mapping[: pcp_size * local_num_tokens]\n",
    "    if int((slot_mapping >= 0).sum()) > local_num_tokens:\n"
    "        own = slot_mapping[: pcp_size * local_num_tokens].view(pcp_size, local_num_tokens)\n"
    "        return tensors, own[pcp_group.rank_in_group]\n"
    "    gathered_slot_mapping = slot_mapping[: pcp_size * local_num_tokens]\n")


@pytest.mark.kernels
def test_the_replicated_kv_group_is_judged_by_replica(wheel, tmp_path):
    """0.33 shards KV groups per `dcp_sharded`: under DCP the second group is replicated, and the
    gather's call with that group's map must leave every rank the whole group (REPLICA), while
    the first group's call is judged by SHARD. A gather wrong only on the replicated group's map
    is found there, shown as that group's call; the release holds."""
    changed = check_release(checkout(wheel, tmp_path / "changed", NO_GATHER_WHEN_MOSTLY_LOCAL),
                            regimes=(DCP,), max_examples=40, max_ranks=2)
    found = {c.invariant: c for c in changed.counterexamples}
    assert REPLICA in found, changed.verdicts()
    assert "KV group 1, replicated under DCP" in found[REPLICA].report, found[REPLICA].report
    release = check_release(checkout(wheel, tmp_path / "release"), regimes=(DCP,),
                            max_examples=40, max_ranks=2)
    assert not release.counterexamples, release.verdicts()
    (regime,) = release.regimes
    assert regime.checked[REPLICA] == regime.checked[SHARD] == regime.cases > 0
    assert dict(regime.real_stages)[SLOT_MAPPING] == regime.cases  # every step, any size
    assert dict(regime.features)["several KV groups"] == regime.cases


@pytest.mark.kernels
def test_a_kernel_that_stops_masking_dummy_requests_exits_1(wheel, tmp_path, capsys):
    """0.33's slot kernel is given a step's graph padding as a dummy request (idx_mapping -1):
    unmasked, the dummy writes slots (LAYOUT's dummy_slots); as shipped, it writes none."""
    changed, _ = _changed_exits_1_release_exits_0(wheel, tmp_path, capsys, DUMMY_UNMASKED)
    assert "LAYOUT violated" in changed and "dummy_slots" in changed, changed
    result = check_release(checkout(wheel, tmp_path / "again"), regimes=(DCP,), max_examples=3,
                           max_ranks=2)
    assert result.release.capabilities["dummy_requests"]


@pytest.mark.parametrize("hidden", [("triton",), ("triton", "regex", "psutil", "cachetools")],
                         ids=["triton", "the-kernels-extra"])
def test_without_triton_the_kernel_stage_is_modeled_and_says_so(wheel, tmp_path, hidden):
    """triton (or every package of the kernels extra but packaging, which pip itself needs: a
    fresh `pip install pcpcheck`) hidden from the worker: the header names the slot stage modeled
    and why, with the extra to install, the changed kernel is not run (so not found), and the run
    is otherwise the same check: `regex` (vllm.platforms needs vllm.utils.import_utils, which
    imports it) is served by the standard library's `re`, said so."""
    for package in hidden:
        (tmp_path / "hide" / package).mkdir(parents=True)
        (tmp_path / "hide" / package / "__init__.py").write_text(
            HIDDEN_TRITON if package == "triton" else
            f"raise ModuleNotFoundError('hidden by the test', name={package!r})\n")
    changed = checkout(wheel, tmp_path / "changed", OWNERSHIP)
    done = subprocess.run([sys.executable, "-m", "pcpcheck.faces.cli", "vllm", str(changed), "--regime",
                           "dcp", "--max-examples", "20", "--max-ranks", "2", "--json",
                           str(tmp_path / "out.json")], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "PYTHONPATH": str(tmp_path / "hide")})
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if SLOT_MAPPING in line)
    assert line.split(SLOT_MAPPING)[1].split()[:1] == ["modeled"] and NO_TRITON in line, line
    assert "pip install 'pcpcheck[kernels]'" in NO_TRITON
    paths = json.loads((tmp_path / "out.json").read_text())["release"]["paths"]
    stage = next(p for p in paths if p["stage"] == SLOT_MAPPING)
    assert stage["status"] == "modeled" and stage["reason"].startswith(NO_TRITON)
    assert stage["file"] is None  # read (the manager imports it), never run as the slot stage
    if "regex" in hidden:
        assert "adapted: regex: not installed (pip install 'pcpcheck[kernels]'): the standard " \
               "library's re serves" in done.stdout, done.stdout


# a sort that loses a request fails the step's layout on every rank; a split one token long
# gives nd 1 for one prefill token on both ranks, also on rank 1, which holds none of it (its
# local batch is partition_batch's one empty request): its padding row is written (PAD_HYGIENE)
@pytest.mark.parametrize("change, stage, invariant", [(SORT_LOSES_ONE, BATCH_ORDER, LAYOUT),
                                                      (SPLIT_ONE_MORE, SPLIT, PAD_HYGIENE)],
                         ids=["sort", "split"])
def test_a_stage_reported_real_runs_the_release_code(wheel, tmp_path, change, stage, invariant):
    """The path table's real batch order and split: the release's own function runs (changed,
    the verdict changes; as shipped, it holds), named with the changed file's sha256."""
    options = dict(regimes=(REPLICATED,), max_examples=40, max_ranks=2)
    shipped = check_release(checkout(wheel, tmp_path / "release"), **options)
    assert shipped.verdicts() == {REPLICATED: "holds"}
    root = checkout(wheel, tmp_path / "changed", change)
    result = check_release(root, **options)
    assert result.counterexamples and result.counterexamples[0].invariant == invariant, \
        result.verdicts()
    row = next(p for p in result.release.paths if p.stage == stage)
    digest = hashlib.sha256((root / change[0]).read_bytes()).hexdigest()
    assert (row.status, row.file, row.sha256) == ("real", change[0], digest)
    assert dict(shipped.regimes[0].real_stages)[stage] == shipped.regimes[0].cases


def test_a_source_without_block_tables_names_the_stage_modeled():
    result = check_release(Path(__file__).parent / "vllmlike" / "release", regimes=(REPLICATED,),
                           max_examples=3, max_ranks=2)
    stage = next(p for p in result.release.paths if p.stage == SLOT_MAPPING)
    assert stage.status == "modeled" and stage.reason.startswith(f"{BLOCK_TABLE} is not in this")
    assert [p.stage for p in result.release.paths if p.status == "real"] == [
        "manager", "wrapper", "gather"]


def test_the_release_sort_is_fed_by_its_parameter_names():
    """0.26-0.28's sort takes no draft tokens, 0.29 on do (their keys as the wheels ship them);
    a parameter pcpcheck cannot give is drift, one line."""
    def sort_026(num_tokens_per_req, decode_query_len):
        key = lambda r: ((num := num_tokens_per_req[r]) != decode_query_len, num)  # noqa: E731 - as vLLM writes it
        return sorted(num_tokens_per_req, key=key)

    def sort_029(num_tokens_per_req, draft_tokens, decode_query_len):
        key = lambda r: (not draft_tokens.get(r),  # noqa: E731 - as vLLM writes it
                         (num := num_tokens_per_req[r]) != decode_query_len, num)
        return sorted(num_tokens_per_req, key=key)

    step = Batch(REPLICATED, 2, (Request(3, True, 0, (0,)), Request(1, False, 0, (1,)),
                                 Request(2, False, 0, (2,))), 16)
    assert step_order(sort_026, step) == [1, 2, 0]
    assert step_order(sort_029, step) == [2, 1, 0]  # the decode with a draft token first
    with pytest.raises(InterfaceDrift, match="takes 'spec_config'"):
        check_sort(lambda num_tokens_per_req, spec_config: [])


def test_interleave_sizes_are_read_from_the_release_config(wheel, tmp_path):
    """The interleave sizes drawn are those the release's config accepts: 0.33's default 1 and
    every size dividing the block size (validate_block_size), read from its config files; a
    config accepting its default alone has no interleave-2 step drawn (era_case maps it to 1)."""
    shipped = check_release(checkout(wheel, tmp_path / "release", more=CONFIGS), regimes=(DCP,),
                            max_examples=3, max_ranks=2)
    caps = shipped.release.capabilities
    assert (caps["interleave_default"], caps["interleave_divisors"]) == (1, True)
    assert any(f"default 1 ({PARALLEL_CONFIG})" in note and "divide the block size accepted"
               in note for note in shipped.release.adapted), shipped.release.adapted
    narrow = check_release(checkout(wheel, tmp_path / "narrow", DEFAULT_INTERLEAVE_ONLY, CONFIGS),
                           regimes=(DCP,), max_examples=3, max_ranks=2)
    assert narrow.release.capabilities["interleave_divisors"] is False
    step = Case(Batch(DCP, 2, (Request(3, True, 0, (0, 1)),), 2, 2), (TensorSpec((4,), "float32"),))
    for divisors, drawn in ((True, 2), (False, 1)):
        caps = Capabilities(era="0.30", manager_shards=True, gather_shard=True, wrapper_shard_keyword=None,
                            graph_padding=True, replicated_method=True, interleave_divisors=divisors)
        assert era_case(step, caps).batch.interleave == drawn
    block_1 = Case(Batch(DCP, 2, (Request(3, True, 0, (0, 1, 2)),), 1, 2), step.tensors)
    caps = Capabilities(era="0.30", manager_shards=True, gather_shard=True, wrapper_shard_keyword=None,
                        graph_padding=True, replicated_method=True)
    assert era_case(block_1, caps).batch.interleave == 1
