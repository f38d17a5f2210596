"""The README's pytest-plugin command at the root of a vLLM checkout: pcpcheck's items run alone,
whatever the checkout's own pytest set-up (a conftest.py and a test file that fail to import, as a
checkout's do without its GPU packages, and ini addopts meant for its own suite). The checkout is
the 0.33.0 wheel's Python files, written at test time."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pcpcheck.shared.source import GATHERS
from pcpcheck_spec.names import DEFAULT_REGIMES, SHARDED
from pcpcheck_spec.registry import GATHER_IDS
from tests.test_vllm_kernels import checkout

pytestmark = pytest.mark.xdist_group("vllm_drift")

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_PYPROJECT = """[tool.pytest.ini_options]
addopts = "--an-option-of-a-plugin-not-installed-here -x"
testpaths = ["tests"]
"""
# bug class 4: the slot map cut to the local rows (rows outnumber slots: peers' KV never written)
TRUNCATED = ("slot_mapping[: pcp_size * local_num_tokens]", "slot_mapping[:local_num_tokens]")


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


def _run(root: Path, *more: str) -> subprocess.CompletedProcess:
    command = readme_plugin_command()
    assert command[:3] == ["python", "-m", "pytest"], command
    return subprocess.run([sys.executable, *command[1:], *more], cwd=root, capture_output=True,
                          text=True, timeout=600)


def test_the_readmes_plugin_command_runs_pcpchecks_items_alone_in_a_checkout(vllm_checkout):
    done = _run(vllm_checkout, "-rA")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", done.stdout.splitlines()[-1])}
    # every item is pcpcheck's: one per default regime and invariant, none of the checkout's
    assert counts.get("passed", 0) + counts.get("skipped", 0) == len(GATHER_IDS) * len(
        DEFAULT_REGIMES), counts
    assert set(counts) <= {"passed", "skipped"}, counts
    assert f"PASSED pcpcheck:pcp.py::REPLICA[{SHARDED}]" in done.stdout, done.stdout[-3000:]


def test_the_same_command_fails_on_a_broken_gather(vllm_checkout):
    gather = vllm_checkout / GATHERS[0]
    text = gather.read_text()
    assert text.count(TRUNCATED[0]) == 1
    gather.write_text(text.replace(*TRUNCATED))
    try:
        done = _run(vllm_checkout, "--pcp-regime", SHARDED, "--pcp-max-examples", "20")
    finally:
        gather.write_text(text)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(rf"FAILED .*REPLICA\[{SHARDED}\]", done.stdout), done.stdout[-3000:]
