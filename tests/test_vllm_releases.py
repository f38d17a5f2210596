"""Every vLLM release with a PCP path, 0.26.0 to 0.34.0, checked end to end as a user runs it
(`pcpcheck vllm X`, the kernels extra installed): each default regime gets its documented
verdict (docs/releases.md), with no traceback and nothing assumed. Wheels are fetched at test
time into pcpcheck's wheel cache (about 340 MB each, never committed).

Their own stage of .ci/run (`python -m pytest -m releases`): the README's test command leaves
them out (pyproject's addopts), as they fetch 3 GB the first time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pcpcheck.shared.errors import SourceError
from pcpcheck.shared.source import fetch_release
from pcpcheck_spec.names import DCP, DRAFT, REPLICATED, SHARDED

pytestmark = pytest.mark.releases

NA, HOLDS = "n/a: ", "holds"
OLD = {SHARDED: NA, REPLICATED: "VIOLATED: COLLECTIVE", DCP: "VIOLATED: COLLECTIVE", DRAFT: NA}
CURRENT = {SHARDED: HOLDS, REPLICATED: HOLDS, DCP: HOLDS, DRAFT: HOLDS}
# docs/releases.md's verdicts table, default regimes (each a prefix of the verdict)
DOCUMENTED = {
    "0.26.0": OLD, "0.27.0": OLD, "0.28.0": OLD, "0.29.0": OLD,
    "0.30.0": {**CURRENT, SHARDED: NA, DRAFT: "VIOLATED: RETURNS"},
    "0.31.0": {**CURRENT, SHARDED: NA},
    "0.32.0": CURRENT, "0.33.0": CURRENT, "0.34.0": CURRENT,
}


@pytest.mark.parametrize("version", DOCUMENTED)
def test_a_release_gets_its_documented_verdict(version, tmp_path):
    try:
        wheel = fetch_release(version)
    except SourceError as exc:
        pytest.fail(f"cannot fetch vllm=={version} from the package registry: {exc}",
                    pytrace=False)
    out = tmp_path / "result.json"
    want = DOCUMENTED[version]
    # 0.26-0.29's COLLECTIVE first shows at step 236 (replicated) and 147 (dcp) of the search
    examples = "250" if want is OLD else "25"
    done = subprocess.run([sys.executable, "-m", "pcpcheck", "vllm", str(wheel), "--max-examples",
                           examples, "--json", str(out)], capture_output=True, text=True,
                          timeout=1200, cwd=tmp_path)
    text = done.stdout + done.stderr
    assert "Traceback" not in text and "assumed" not in text, text
    assert done.returncode == (1 if any("VIOLATED" in v for v in want.values()) else 0), text
    verdicts = json.loads(out.read_text())["verdicts"]
    assert set(verdicts) == set(want), verdicts
    for regime, verdict in verdicts.items():
        assert verdict.startswith(want[regime]), (regime, verdict)
    assert "block tables / slot mapping real" in " ".join(done.stdout.split()), done.stdout
    # the release's own configuration classes, built for every regime (the kernels extra's
    # pydantic runs vllm/config/*.py), and its layers' calls of the wrappers read from the tree
    adapted = json.loads(out.read_text())["release"]["adapted"]
    assert "ParallelConfig, CacheConfig, SchedulerConfig: the release's own, built per regime" \
        in adapted, adapted
    assert sum(" called as its layers call it (" in line for line in adapted) == 2, adapted
