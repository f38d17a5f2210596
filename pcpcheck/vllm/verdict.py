"""`check_release`: search every regime a release can reach, and its report.

The result names the release, the files read with their sha256, the stand-ins and adaptations,
the layout model (era) that judged it, and per regime a verdict: holds, VIOLATED (with shrunk
counterexamples) or not applicable (with the reason read from the release's code).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from pcpcheck import report
from pcpcheck.cases import Case, cases
from pcpcheck.engine import RegimeResult, search
from pcpcheck.vllm.release import Release, load_release
from pcpcheck.vllm.run import ReleaseObservation, ReleaseRunner, era_case
from spec.names import DRAFT_MIXED, LAYOUT, REGIMES

# draft-mixed is a hazard regime (bug class 10 is latent in vLLM 0.33): opt-in.
DEFAULT_REGIMES = tuple(r for r in REGIMES if r != DRAFT_MIXED)


@dataclass
class ReleaseResult:
    release: Release
    results: list[RegimeResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def counterexamples(self) -> list[tuple[str, ReleaseObservation]]:
        return [(r.regime, o) for r in self.results for o in r.counterexamples]

    def verdicts(self) -> dict[str, str]:
        """regime -> 'holds' | 'n/a: reason' | 'VIOLATED: ID, ID'."""
        out = {}
        for result in self.results:
            if result.not_applicable:
                out[result.regime] = f"n/a: {result.not_applicable}"
            elif result.counterexamples:
                out[result.regime] = "VIOLATED: " + ", ".join(
                    o.violations[0].invariant for o in result.counterexamples)
            else:
                out[result.regime] = "holds"
        return out


def release_cases(release: Release, regime: str, max_ranks: int, empty_steps: bool):
    """Drawn steps, each as the release would run it (run.era_case); steps it never runs dropped."""
    return cases(regimes=(regime,), max_ranks=max_ranks).map(
        lambda case: era_case(case, release, empty_steps)).filter(lambda case: case is not None)


def check_release(source, runner, *, regimes=DEFAULT_REGIMES, max_examples: int = 300,
                  max_ranks: int = 8, seed: int | None = None, empty_steps: bool = False,
                  progress=None) -> ReleaseResult:
    """Check SOURCE's PCP path (a Source, a release string, a wheel or checkout path)."""
    started = time.perf_counter()
    release = source if isinstance(source, Release) else load_release(source)
    outcome = ReleaseResult(release)
    adapter = ReleaseRunner(runner, release)
    for regime in regimes:
        reason = release.caps.not_applicable.get(regime)
        if reason:
            result = RegimeResult(regime, not_applicable=reason)
        else:
            result = search(release.gather, regime, adapter, max_examples=max_examples,
                            max_ranks=max_ranks, derandomize=seed is None, seed=seed,
                            strategy=release_cases(release, regime, max_ranks, empty_steps))
        outcome.results.append(result)
        if progress:
            progress(result)
    outcome.seconds = time.perf_counter() - started
    return outcome


def header(release: Release) -> list[str]:
    caps = release.caps
    lines = [f"pcpcheck: checking {release.name} ({release.source.kind} {release.source.location})",
             "  files read (sha256):"]
    lines += [f"    {path}  {digest}" for path, digest in release.files.items()]
    lines.append(f"  layout model: reference era {caps.era} "
                 f"({'0.26-0.29 manager' if caps.era == '0.26' else 'section 2, 0.30 on'})")
    lines.append(f"  capabilities: decode sharding {'yes' if caps.manager_shards else 'no'}, "
                 f"gather shard flag {'yes' if caps.gather_shard else 'no'}, wrapper keyword "
                 f"{caps.wrapper_shard_keyword or '-'}, graph padding "
                 f"{'yes' if caps.graph_padding else 'no'}")
    if release.stand_ins:
        lines.append("  stood in for (inert): " + ", ".join(release.stand_ins))
    lines += [f"  adapted: {note}" for note in release.adapted]
    return lines


def regime_line(result: RegimeResult) -> str:
    if result.not_applicable:
        return f"  {result.regime:<12} not applicable: {result.not_applicable}"
    return (f"  {result.regime:<12} {report.rates(result)}  "
            f"{'VIOLATED' if result.counterexamples else 'holds'}")


def replay_command(release: Release, observation) -> str:
    import shlex
    return shlex.join(["pcpcheck", "vllm", release.source.location, "--replay",
                       observation.prepared.case.to_json()])


def counterexample(release: Release, regime: str, observation: ReleaseObservation) -> str:
    """The gather's counterexample report, with both layouts side by side for LAYOUT."""
    text = report.counterexample(observation, regime, release.source.location)
    lines = [line for line in text.splitlines() if not line.startswith("  replay: ")]
    lines.insert(1, f"  entry: {observation.entry}; layout model: era {release.caps.era}")
    for rank, diff in sorted(observation.layout_diffs.items()):
        lines.append(f"  {LAYOUT}: rank {rank}'s PCPManager differs from the reference:")
        lines += ["    " + line.replace("\n", "\n    ") for line in diff]
    lines.append("  replay: " + replay_command(release, observation))
    return "\n".join(lines)


def replay(release: Release, runner, case_json: str) -> ReleaseObservation:
    return ReleaseRunner(runner, release).observe_case(Case.from_json(case_json))


def to_json(outcome: ReleaseResult) -> dict:
    release = outcome.release
    return {
        "release": release.source.release,
        "source": release.source.spec(),
        "files": release.files,
        "stand_ins": release.stand_ins,
        "adapted": release.adapted,
        "layout_model": release.caps.era,
        "seconds": round(outcome.seconds, 3),
        "verdict": "violated" if outcome.counterexamples else "holds",
        "regimes": {r.regime: {"verdict": outcome.verdicts()[r.regime], "cases": r.cases,
                               "seconds": round(r.seconds, 3)} for r in outcome.results},
        "counterexamples": [{
            "invariant": o.violations[0].invariant, "ranks": o.violations[0].ranks,
            "also_violated": [v.invariant for v in o.violations[1:]], "regime": regime,
            "case": json.loads(o.prepared.case.to_json()),
            "report": counterexample(release, regime, o)} for regime, o in outcome.counterexamples],
    }
