"""The README's pytest-plugin command at the root of a vLLM checkout: pcpcheck's items run alone,
whatever the checkout's own pytest set-up (a conftest.py and a test file that fail to import, as a
checkout's do without its GPU packages, and ini addopts meant for its own suite), and judge the
checkout's whole PCP path as `pcpcheck vllm .` does (LAYOUT included); `--pcp-target` in place of
`--pcp-vllm .` still checks the gather alone. The checkout is the 0.33.0 wheel's Python files,
written at test time."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pcpcheck.shared.source import GATHERS, MANAGER
from pcpcheck_spec.names import DEFAULT_REGIMES, REPLICATED, SHARDED
from pcpcheck_spec.registry import GATHER_IDS, RELEASE_IDS
from tests.test_vllm_kernels import checkout

pytestmark = pytest.mark.xdist_group("vllm_drift")

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_PYPROJECT = """[tool.pytest.ini_options]
addopts = "--an-option-of-a-plugin-not-installed-here -x"
testpaths = ["tests"]
"""
# bug class 4: the slot map cut to the local rows (rows outnumber slots: peers' KV never written)
TRUNCATED = ("slot_mapping[: pcp_size * local_num_tokens]", "slot_mapping[:local_num_tokens]")
# The manager's write mask takes a replicated request's rows from rank 1, not rank 0: LAYOUT (the
# manager against the reference) sees it on every step with one; the gather, fed the reference's
# layout when checked alone, is not where it lies.
WRITER_RANK_1 = ("                    and rank != 0\n", "                    and rank != 1\n")


def readme_plugin_command() -> list[str]:
    """The README's command that runs the plugin in a vLLM checkout."""
    lines = [line.split("  #")[0].strip() for line in (ROOT / "README.md").read_text().splitlines()
             if line.startswith("python -m pytest") and "--pcp-only" in line]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


@pytest.fixture(scope="module")
def vllm_checkout(wheel, tmp_path_factory):
    root = checkout(wheel, tmp_path_factory.mktemp("checkout"))
    (root / "pyproject.toml").write_text(CHECKOUT_PYPROJECT)
    (root / "conftest.py").write_text("import cutlass  # a GPU package\n")
    (root / "tests").mkdir()
    (root / "tests" / "conftest.py").write_text("raise RuntimeError('needs a GPU')\n")
    (root / "tests" / "test_kernels.py").write_text("import marlin_utils_test\n")
    return root


def _run(root: Path, *more: str, gather_only: bool = False) -> subprocess.CompletedProcess:
    """The README's command in `root` with `more`; `gather_only`: with `--pcp-target` (the gather
    file) in place of `--pcp-vllm .`."""
    command = readme_plugin_command()
    assert command[:3] == ["python", "-m", "pytest"] and "--pcp-vllm" in command, command
    if gather_only:
        command[command.index("--pcp-vllm"):command.index("--pcp-vllm") + 2] = [
            "--pcp-target", GATHERS[0]]
    return subprocess.run([sys.executable, *command[1:], *more], cwd=root, capture_output=True,
                          text=True, timeout=600)


def _counts(done: subprocess.CompletedProcess) -> dict[str, int]:
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", done.stdout.splitlines()[-1])}


def _broken(root: Path, relpath: str, change: tuple[str, str], *more: str,
            gather_only: bool = False) -> subprocess.CompletedProcess:
    """The README's command in `root` with `change` made once in `relpath` (undone after)."""
    path = root / relpath
    text = path.read_text()
    assert text.count(change[0]) == 1, change
    path.write_text(text.replace(*change))
    try:
        return _run(root, *more, gather_only=gather_only)
    finally:
        path.write_text(text)


def test_the_readmes_plugin_command_runs_the_whole_path_alone_in_a_checkout(vllm_checkout):
    done = _run(vllm_checkout, "-rA")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    counts = _counts(done)
    # every item is pcpcheck's: one per default regime and invariant of the whole path, LAYOUT's
    # included, none of the checkout's
    assert counts.get("passed", 0) + counts.get("skipped", 0) == len(RELEASE_IDS) * len(
        DEFAULT_REGIMES), counts
    assert set(counts) <= {"passed", "skipped"}, counts
    label = vllm_checkout.name
    assert f"PASSED pcpcheck-vllm:{label}::LAYOUT[{SHARDED}]" in done.stdout, done.stdout[-3000:]
    assert f"PASSED pcpcheck-vllm:{label}::REPLICA[{SHARDED}]" in done.stdout, done.stdout[-3000:]


def test_the_same_command_fails_on_a_broken_gather(vllm_checkout):
    done = _broken(vllm_checkout, GATHERS[0], TRUNCATED, "--pcp-regime", SHARDED,
                   "--pcp-max-examples", "20")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(rf"FAILED .*REPLICA\[{SHARDED}\]", done.stdout), done.stdout[-3000:]


def test_the_same_command_finds_a_manager_bug_the_gather_alone_cannot(vllm_checkout):
    more = ("--pcp-regime", REPLICATED, "--pcp-max-examples", "40", "-rA")
    done = _broken(vllm_checkout, MANAGER, WRITER_RANK_1, *more)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(rf"FAILED .*::LAYOUT\[{REPLICATED}\] - LAYOUT violated", done.stdout), \
        done.stdout[-3000:]
    alone = _broken(vllm_checkout, MANAGER, WRITER_RANK_1, *more, gather_only=True)
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-2000:]
    assert sum(_counts(alone).values()) == len(GATHER_IDS), alone.stdout[-3000:]
    assert "LAYOUT" not in alone.stdout, alone.stdout[-3000:]
