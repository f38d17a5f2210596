"""`pcpcheck diff OLD NEW`: two versions of the gather on the same cases, the minimal case where
their per-rank caches (or errors) differ, both outcomes side by side, and each side's verdict."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from pcpcheck import report
from pcpcheck.api import DEFAULT_MAX_EXAMPLES, SCHEMA_VERSION, Options, validate, version
from pcpcheck.cases import cases, describe
from pcpcheck.check import Observation, incomplete
from pcpcheck.backends import make_backend
from pcpcheck.check import run_case
from pcpcheck_spec.invariants import INCOMPLETE
from pcpcheck_spec.names import DEFAULT_REGIMES

EXIT_SAME, EXIT_DIFFERENT = 0, 1


class OutcomesDiffer(Exception):
    def __init__(self, old: Observation, new: Observation):
        super().__init__("outcomes differ")
        self.old, self.new = old, new


def outcome(observation: Observation, rank: int):
    """What a rank ended with, as far as the cache is concerned: an error, or its caches."""
    view = observation.ranks[rank]
    if view.error is not None:
        return ("raised",)
    if incomplete(view.trace):
        return ("collective failed",)
    return ("caches", view.caches)


def differing_ranks(old: Observation, new: Observation) -> list[int]:
    return [rank for rank in range(len(old.ranks)) if outcome(old, rank) != outcome(new, rank)]


def find_difference(old_target, new_target, regime: str, runner, *, max_examples: int,
                    max_ranks: int, derandomize: bool = True, seed: int | None = None):
    """The minimal case (hypothesis-shrunk) where the two targets' outcomes differ, or None."""
    counted = {"cases": 0}

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=derandomize,
              verbosity=Verbosity.quiet, phases=(Phase.generate, Phase.shrink),
              suppress_health_check=list(HealthCheck))
    @given(case=cases(regimes=(regime,), max_ranks=max_ranks))
    def same_outcomes(case):
        counted["cases"] += 1
        old = run_case(case, old_target, runner)
        new = run_case(case, new_target, runner)
        if differing_ranks(old, new):
            raise OutcomesDiffer(old, new)

    if seed is not None and not derandomize:
        same_outcomes = hypothesis_seed(seed)(same_outcomes)
    try:
        same_outcomes()
    except OutcomesDiffer as found:
        return counted["cases"], found
    return counted["cases"], None


def side(observation: Observation, rank: int) -> str:
    view = observation.ranks[rank]
    if view.error:
        return f"error: {view.error}"
    reasons = [entry[1] for entry in view.trace if entry[0] == INCOMPLETE]
    if reasons:
        return f"collective failed: {reasons[0]}"
    diffs = report.cache_diff(observation, rank)
    return "cache as expected" if not diffs else "cache: " + "; ".join(diffs)


def verdict(observation: Observation) -> str:
    if not observation.violations:
        return "satisfies the spec"
    return "violates " + ", ".join(f"{v.invariant} (ranks {v.ranks})" for v in observation.violations)


def render(found: OutcomesDiffer, regime: str, old_name: str, new_name: str) -> str:
    case = found.old.prepared.case
    lines = [f"Outcomes differ (regime {regime}): {describe(case)}",
             f"  old = {old_name}: {verdict(found.old)}",
             f"  new = {new_name}: {verdict(found.new)}"]
    lines += report.token_table(found.old)
    for rank in differing_ranks(found.old, found.new):
        lines.append(f"  rank {rank}: old {side(found.old, rank)}")
        lines.append(f"  {' ' * len(str(rank))}       new {side(found.new, rank)}")
    lines.append(f"  case: {case.to_json()}")
    return "\n".join(lines)


@dataclass(frozen=True)
class RegimeDiff:
    regime: str
    cases: int
    case: str | None  # the minimal differing case (Case JSON), None when the outcomes agree
    report: str  # the side-by-side text, "" when they agree


@dataclass(frozen=True)
class DiffResult:
    version: str
    old: str
    new: str
    options: Options
    regimes: tuple[RegimeDiff, ...]
    schema: int = SCHEMA_VERSION

    @property
    def differs(self) -> bool:
        return any(r.case is not None for r in self.regimes)

    @property
    def exit_code(self) -> int:
        return EXIT_DIFFERENT if self.differs else EXIT_SAME

    def to_json(self) -> str:
        document = asdict(self)
        for regime in document["regimes"]:
            regime["case"] = None if regime["case"] is None else json.loads(regime["case"])
        return json.dumps({"schema": document.pop("schema"), "kind": "diff",
                           "verdict": "different" if self.differs else "same", **document},
                          indent=2)


def diff(old, new, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_MAX_EXAMPLES,
         max_ranks: int = 8, seed: int | None = None, function: str | None = None,
         timeout: float = 10.0, on_regime=None) -> DiffResult:
    """Run two versions on the same drawn cases; per regime the minimal case where they differ.
    `on_regime(RegimeDiff)` as each regime ends."""
    from pcpcheck.api import resolve_target
    options = Options(tuple(dict.fromkeys(regimes)), max_examples, max_ranks, seed, None,
                      "threads", None, "cpu", timeout, function, None)
    validate(options)
    old_source, new_source = resolve_target(old), resolve_target(new)
    found_per_regime = []
    with make_backend("threads", timeout=timeout) as runner:
        old_target = runner.load(old_source, function)
        new_target = runner.load(new_source, function)
        for regime in options.regimes:
            count, found = find_difference(old_target, new_target, regime, runner,
                                           max_examples=max_examples, max_ranks=max_ranks,
                                           derandomize=seed is None, seed=seed)
            result = RegimeDiff(regime, count, None, "") if found is None else RegimeDiff(
                regime, count, found.old.prepared.case.to_json(),
                render(found, regime, old_target.source, new_target.source))
            found_per_regime.append(result)
            if on_regime is not None:
                on_regime(result)
    return DiffResult(version(), old_source, new_source, options, tuple(found_per_regime))


def run_diff(args) -> int:
    """`pcpcheck diff`: print as each regime ends; --json after the verdict, never masking it."""
    from pcpcheck.cli import check_outputs, use_cache_dir, write_outputs
    check_outputs(args)
    use_cache_dir()
    print(f"pcpcheck diff: old {args.old}, new {args.new}")

    def show(regime: RegimeDiff) -> None:
        state = "same outcomes" if regime.case is None else "DIFFERENT"
        print(f"  {regime.regime:<12} {regime.cases:>6} cases: {state}", flush=True)
        if regime.report:
            print(regime.report)

    result = diff(args.old, args.new, regimes=args.regimes, max_examples=args.max_examples,
                  max_ranks=args.max_ranks, seed=args.seed, function=args.function,
                  timeout=args.timeout, on_regime=show)
    differences = sum(r.case is not None for r in result.regimes)
    print(f"\n{differences} regime(s) with a difference" if differences else "\nno difference found")
    write_outputs(args, result)
    return result.exit_code
