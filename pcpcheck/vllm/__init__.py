"""Check a vLLM release's own PCP path (`pcpcheck vllm SOURCE`): its layout manager, its gather
and its MLA/indexer wrappers, read from a wheel or checkout and run on every rank.

The API is `pcpcheck.api.check_release(source, ...) -> CheckResult`. The release's code is
executed only in a backend worker (`release.load_release` and `run.rank_step` run there); the
driver sees it as plain data (`pcpcheck.backends.base.ReleaseInfo`). Errors: `SourceError`,
`InterfaceDrift` (both `pcpcheck.loader.LoadError`s; one line each).
"""

from pcpcheck.vllm.release import InterfaceDrift
from pcpcheck.vllm.source import SourceError

__all__ = ["InterfaceDrift", "SourceError"]
