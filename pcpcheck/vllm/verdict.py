"""`pcpcheck vllm`'s search per regime and its report text.

`pcpcheck.api.check_release` drives it and returns a CheckResult naming the release, the files
read with their sha256, the stand-ins and adaptations, and the layout model (era) that judged it;
per regime: holds, VIOLATED (shrunk counterexamples) or not applicable (the reason read from the
release's code). Everything here runs in the driver on plain data (a ReleaseInfo): the release's
code runs only in the backend's worker.
"""

from __future__ import annotations

import functools
import shlex

from pcpcheck import report
from pcpcheck.backends.base import ReleaseInfo
from pcpcheck.cases import Case
from pcpcheck.engine import RegimeResult, search
from pcpcheck.vllm.run import (ReleaseObservation, capabilities, era_case,  # noqa: F401
                               observe_release_case)
from pcpcheck_spec.names import LAYOUT


def run_release_cases(cases, release: ReleaseInfo, backend):
    """The engine's run_many for a release: one step at a time through rank_step."""
    for case in cases:
        yield observe_release_case(case, release, backend)


def search_regime(release: ReleaseInfo, regime: str, backend, *, max_examples: int,
                  max_ranks: int, seed: int | None, empty_steps: bool, deadline=None,
                  on_case=None) -> RegimeResult:
    """One regime of a release: not applicable (the reason from its code), or searched."""
    reason = capabilities(release).not_applicable.get(regime)
    if reason:
        return RegimeResult(regime, not_applicable=reason)
    return search(release, regime, backend, max_examples=max_examples, max_ranks=max_ranks,
                  derandomize=seed is None, seed=seed, deadline=deadline, on_case=on_case,
                  transform=functools.partial(era_case, caps=capabilities(release),
                                              empty_steps=empty_steps),
                  run_many=run_release_cases, reduce=False)


def header(release: ReleaseInfo) -> list[str]:
    caps, info = capabilities(release), release.release
    source = info["source"]
    lines = [f"pcpcheck: checking {release.name} ({source['kind']} {source['location']})",
             "  files read (sha256):"]
    lines += [f"    {path}  {digest}" for path, digest in info["files"].items()]
    lines.append(f"  layout model: reference era {caps.era} "
                 f"({'0.26-0.29 manager' if caps.era == '0.26' else 'section 2, 0.30 on'})")
    lines.append(f"  capabilities: decode sharding {'yes' if caps.manager_shards else 'no'}, "
                 f"gather shard flag {'yes' if caps.gather_shard else 'no'}, wrapper keyword "
                 f"{caps.wrapper_shard_keyword or '-'}, graph padding "
                 f"{'yes' if caps.graph_padding else 'no'}")
    if release.stand_ins:
        lines.append("  stood in for (inert): " + ", ".join(release.stand_ins))
    lines += [f"  adapted: {note}" for note in info["adapted"]]
    return lines


def replay_command(release: ReleaseInfo, observation) -> str:
    return shlex.join(["pcpcheck", "vllm", release.release["source"]["location"], "--replay",
                       observation.prepared.case.to_json()])


def counterexample(release: ReleaseInfo, regime: str, observation: ReleaseObservation,
                   replays=None) -> str:
    """The gather's counterexample report, with both layouts side by side for LAYOUT."""
    location = release.release["source"]["location"]
    text = report.counterexample(observation, regime, location, None, release, replays)
    lines = [line for line in text.splitlines() if not line.startswith("  replay: ")]
    lines.insert(1, f"  entry: {observation.entry or '- (no rank reported)'}; layout model: era "
                    f"{capabilities(release).era}")
    for rank, diff in sorted(observation.layout_diffs.items()):
        lines.append(f"  {LAYOUT}: rank {rank}'s PCPManager differs from the reference:")
        lines += ["    " + line.replace("\n", "\n    ") for line in diff]
    lines.append("  replay: " + replay_command(release, observation))
    return "\n".join(lines)


def replay(release: ReleaseInfo, backend, case_json: str) -> ReleaseObservation:
    return observe_release_case(Case.from_json(case_json), release, backend)
