"""Check a vLLM release's own PCP path (`pcpcheck vllm SOURCE`): its layout manager, its gather
and its MLA/indexer wrappers, read from a wheel or checkout and run on every rank.

`check_release(source, runner, ...) -> ReleaseResult`; `load_release(source) -> Release`
(capabilities, files read with sha256, stand-ins, adaptations). Errors: `SourceError`,
`InterfaceDrift`, `pcpcheck.loader.LoadError` (one line each).
"""

from pcpcheck.vllm.release import InterfaceDrift, Release, load_release
from pcpcheck.vllm.source import SourceError
from pcpcheck.vllm.verdict import DEFAULT_REGIMES, ReleaseResult, check_release

__all__ = ["DEFAULT_REGIMES", "InterfaceDrift", "Release", "ReleaseResult", "SourceError",
           "check_release", "load_release"]
