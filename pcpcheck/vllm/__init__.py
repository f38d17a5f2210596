"""Check a vLLM release's own PCP path (`pcpcheck vllm SOURCE`): its layout manager, its gather
and its MLA/indexer wrappers, read from a wheel or checkout and run on every rank.

The API is `pcpcheck.api.check_release(source, ...) -> CheckResult`. Which side each module is on:
- source.py (both): where the release's files come from; the driver resolves and fetches them,
  a worker reads them;
- inputs.py (both): what a step hands the release's manager;
- release.py, step.py (worker): the release's code loaded and run, one rank's step;
- judge.py (driver): each rank's layout and caches judged from its worker's plain-data report;
- verdict.py (driver): the search per regime in the release's own batch order, and report text.
Errors: `SourceError`, `InterfaceDrift` (pcpcheck.shared.errors; one line each).
"""
