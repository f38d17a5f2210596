"""pcpcheck's Python API, the one face every other face calls: `check` a gather implementation in
every regime, `check_release` a vLLM release's own PCP path, `diff` two versions, `replay` one
case, `merge` the parts of a run split across a CI's jobs.

    result = pcpcheck.check("path/to/pcp.py", regimes=("sharded",), budget_s=60)
    result.holds, result.exit_code, result.counterexamples, result.to_json()

The command line, the pytest plugin and torchrun's rank entry (pcpcheck.faces) parse their
arguments, call these functions and render what they return (pcpcheck.render: the report, JSON,
JUnit, HTML and reproducers are renderings of a result, pcpcheck.shared.results).

- target.py: a gather implementation (check, diff, replay_case, replay);
- release.py: a vLLM release (check_release, check_steps, replay_release);
- trees.py: two vLLM trees on the same steps, stage by stage (diff_trees, replay_tree_diff);
- merge.py: the results of a run split N ways (--shard K/N) joined into one (merge);
- common.py: what every call shares (options checked, a backend started, the regimes one after
  another under one budget, one case's result); assemble.py: search results -> CheckResult;
- process.py: what a command sets up for its own process.
"""

from pcpcheck.api.common import Progress, read_case
from pcpcheck.api.merge import merge
from pcpcheck.api.process import prefork, torchrun_session, use_cache_dir
from pcpcheck.api.release import (
    check_release,
    check_steps,
    release_info,
    release_record,
    replay_release,
)
from pcpcheck.api.target import check, default_jobs, diff, replay, replay_case
from pcpcheck.api.trees import diff_trees, diffs_trees, replay_tree_diff
from pcpcheck.shared.errors import (
    CheckerError,
    InterfaceDrift,
    LoadError,
    SourceError,
    UsageError,
    WorkerError,
)
from pcpcheck.shared.results import (
    CheckResult,
    Counterexample,
    DiffResult,
    Options,
    RegimeDiff,
    RegimeSummary,
    RegimeTreeDiff,
    ReleaseRecord,
    TreeDiffResult,
    Verdict,
    version,
)

__all__ = ["check", "check_release", "check_steps", "diff", "diff_trees", "diffs_trees",
           "replay_tree_diff", "TreeDiffResult", "RegimeTreeDiff", "merge", "replay", "replay_case",
           "replay_release", "read_case", "release_record", "release_info", "default_jobs",
           "prefork", "use_cache_dir", "torchrun_session", "Progress", "CheckResult",
           "Counterexample", "DiffResult", "RegimeDiff", "RegimeSummary", "ReleaseRecord",
           "Options", "Verdict", "version", "UsageError", "LoadError", "SourceError",
           "InterfaceDrift", "CheckerError", "WorkerError"]
