"""What the API returns, and its JSON (`docs/json-schema.md`): a CheckResult per check, a
DiffResult per diff. Every rendering (the terminal report, JSON, JUnit, HTML, reproducers, pytest
items) reads these and computes no verdict of its own: `CheckResult.outcome` is the one answer
per regime x invariant.

A CheckResult is immutable and round-trips through JSON; the live `Observation` of each
counterexample (for `--html`) rides along in memory only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pcpcheck.shared.changed import Changes, FileReach, reach
from pcpcheck.shared.defaults import (
    DEFAULT_BACKEND,
    DEFAULT_DEVICE,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_MAX_RANKS,
    DEFAULT_TIMEOUT,
)

SCHEMA_VERSION = 1
# 0 holds, 1 a violation, 2 an error in what pcpcheck was given, 3 pcpcheck's own failure
EXIT_HOLDS, EXIT_VIOLATION, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def version() -> str:
    """pcpcheck's version, as installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    try:
        return dist_version("pcpcheck")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, kw_only=True)
class Options:
    """A check's options, as the API was called (JSON: `options`)."""

    regimes: tuple[str, ...]
    max_examples: int = DEFAULT_MAX_EXAMPLES
    max_ranks: int = DEFAULT_MAX_RANKS
    seed: int | None = None
    budget_s: float | None = None
    backend: str = DEFAULT_BACKEND
    world_sizes: tuple[int, ...] | None = None
    device: str = DEFAULT_DEVICE
    timeout: float = DEFAULT_TIMEOUT
    function: str | None = None
    baseline: str | None = None
    empty_steps: bool = False  # pcpcheck vllm: also steps with no scheduled token (a hazard)
    scope: str | None = None  # exhaustive: every step within this scope (--scope's KEY=VALUE,...)
    shard: tuple[int, int] | None = None  # (K, N): part K of the run split N ways (--shard K/N)


@dataclass(frozen=True)
class InvariantCount:
    invariant: str
    checked: int  # cases on which it was evaluated
    violated: int  # of which it failed


@dataclass(frozen=True, kw_only=True)
class RegimeSummary:
    regime: str
    cases: int
    seconds: float
    check_seconds: float  # running and judging alone (drawing and shrinking excluded)
    invariants: tuple[InvariantCount, ...]
    budget_reached: bool  # stopped by --budget before max_examples
    not_applicable: str | None = None  # why the target cannot reach this regime (nothing drawn)
    slowest_call: float = 0.0  # seconds of the slowest rank's call of any case
    mean_call: float = 0.0  # the slowest rank's call per case, on average
    # What the cases exercised (pcpcheck.judge.coverage), every branch and feature, 0 where none
    # did: (branch letter, cases whose ranks took it), (layout feature, cases exercising it); a
    # feature no case of the run could reach is left out (coverage.unreachable: shown n/a)
    branches: tuple[tuple[str, int], ...] = ()
    features: tuple[tuple[str, int], ...] = ()
    scope_steps: int | None = None  # exhaustive: the steps the scope holds (`cases` of them ran)
    real_stages: tuple[tuple[str, int], ...] = ()  # `pcpcheck vllm`: stage -> steps run by the release's code

    @property
    def complete(self) -> bool:
        """An exhaustive search that ran every step of its scope."""
        return self.scope_steps is not None and self.cases == self.scope_steps

    @property
    def checked(self) -> dict[str, int]:
        return {c.invariant: c.checked for c in self.invariants}

    @property
    def violated(self) -> dict[str, int]:
        return {c.invariant: c.violated for c in self.invariants if c.violated}

    def count(self, invariant: str) -> InvariantCount:
        return next((c for c in self.invariants if c.invariant == invariant),
                    InvariantCount(invariant, 0, 0))


@dataclass(frozen=True)
class ViolationRecord:
    invariant: str
    ranks: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Counterexample:
    regime: str
    violations: tuple[ViolationRecord, ...]  # the first is what the case is reported under
    case: str  # Case JSON: `pcpcheck check TARGET --replay CASE`
    replay: str  # that command line
    report: str  # the text report
    known: bool  # every invariant it violates is listed in the baseline for its regime
    hazard: bool = False  # found in a hazard regime (spec.names.HAZARD_REGIMES)
    flaky: tuple[int, int] | None = None  # (replays, how many showed it) when not all did
    note: str | None = None  # how its shrinking ended when it ended early or differently
    folded_into: int | None = None  # index of the shown counterexample that also shows it
    observation: object = field(default=None, compare=False, repr=False)  # in memory only

    @property
    def invariant(self) -> str:
        return self.violations[0].invariant

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.violations[0].ranks


@dataclass(frozen=True)
class BaselineOutcome:
    path: str
    known: tuple[tuple[str, str], ...]  # (regime, invariant) listed and violated in this run
    fixed: tuple[tuple[str, str], ...]  # listed, regime checked, not violated: shrink the file


@dataclass(frozen=True, kw_only=True)
class PathStage:
    """One stage of a release's PCP KV path: `real` (its `file`, with `sha256`, runs; `reason`
    says where it does not reach) or `modeled` (pcpcheck's restatement; `reason` says why)."""

    stage: str
    status: str  # real | modeled
    file: str | None
    sha256: str | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class FileLines:
    """A real file of a release's path table: the executable lines inside its function and
    method bodies (`functions`), and those the run's steps ran (`run`), ascending."""

    file: str  # its path in the release
    functions: tuple[int, ...]
    run: tuple[int, ...]

    def to_json(self) -> dict[str, list[int]]:
        return {"functions": list(self.functions), "run": list(self.run)}


# A regime whose reach pcpcheck could not work out from the release's code (its not_applicable
# reason starts so): nothing drawn, and the verdict says so, never assumed either way.
NOT_EVALUATED = "not evaluated: "


def unreached(reason: str, not_applicable: str = "n/a: ") -> str:
    """A regime not run, in words: 'not evaluated: why', else `not_applicable` and why."""
    return reason if reason.startswith(NOT_EVALUATED) else f"{not_applicable}{reason}"


@dataclass(frozen=True, kw_only=True)
class ReleaseRecord:
    """What `check_release` checked: a vLLM release's files, as its worker read them."""

    release: str  # the version the source states
    kind: str  # wheel | checkout | installed
    location: str
    files: tuple[tuple[str, str], ...]  # (path in the release, sha256) of every file read
    adapted: tuple[str, ...]  # working stand-ins given and how pcpcheck adapted to the release
    layout_model: str  # the reference layout era that judged it (reference.ERAS)
    # read from its code (pcpcheck.shared.protocol.Capabilities' fields)
    capabilities: dict[str, Any] = field(default_factory=dict)
    paths: tuple[PathStage, ...] = ()  # the path table, stage by stage
    lines: tuple[FileLines, ...] = ()  # each real file of the path table: its lines run
    # the steps of the run, and of them those the lines were recorded on (traced)
    lines_steps: int = 0
    lines_traced: int = 0
    changes: Changes | None = None  # --changed-against: the lines a change touched

    def file_lines(self, relpath: str | None) -> FileLines | None:
        return next((entry for entry in self.lines if entry.file == relpath), None)

    def changed(self) -> tuple[FileReach, ...]:
        """Each changed file, each changed line with whether the run ran it (shared.changed)."""
        if self.changes is None:
            return ()
        return reach(self.changes, self.lines, (relpath for relpath, _ in self.files))


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    version: str
    target: str  # as given (a path, module:function, impl)
    target_name: str
    stand_ins: tuple[str, ...]  # vllm names the loader stood in for
    options: Options
    regimes: tuple[RegimeSummary, ...]
    counterexamples: tuple[Counterexample, ...]
    baseline: BaselineOutcome | None = None
    reproducers: tuple[str, ...] = ()  # files written by --repro-dir
    schema: int = SCHEMA_VERSION
    release: ReleaseRecord | None = None  # `pcpcheck vllm`: the release checked
    seconds: float = 0.0  # wall clock of the whole search (regimes may run at once: --jobs)
    shards: int = 0  # a merge of the results of a run split this many ways (--shard K/N)
    missing_shards: tuple[int, ...] = ()  # the parts K a merge lacks: no verdict over the run

    @property
    def incomplete(self) -> bool:
        """A merge some parts of the run are missing from (a violation still fails it)."""
        return bool(self.missing_shards)

    def _known(self) -> set[tuple[str, str]]:
        return set(self.baseline.known) if self.baseline else set()

    @property
    def failures(self) -> tuple[tuple[str, str], ...]:
        """Every (regime, invariant) violated and not listed in the baseline: what fails a run
        (and a pytest item, and a JUnit case)."""
        known = self._known()
        return tuple((s.regime, c.invariant) for s in self.regimes for c in s.invariants
                     if c.violated and (s.regime, c.invariant) not in known)

    @property
    def new_violations(self) -> tuple[Counterexample, ...]:
        """The counterexamples that show a violation outside the baseline."""
        return tuple(c for c in self.counterexamples if not c.known)

    @property
    def holds(self) -> bool:
        """No violation outside the baseline."""
        return not self.failures

    @property
    def exit_code(self) -> int:
        if not self.holds:
            return EXIT_VIOLATION
        return EXIT_USAGE if self.incomplete else EXIT_HOLDS

    def summary(self, regime: str) -> RegimeSummary:
        return next(s for s in self.regimes if s.regime == regime)

    def outcome(self, regime: str, invariant: str) -> tuple[str, Counterexample | None]:
        """One regime x invariant, the one answer every rendering gives (terminal, JSON exit
        code, JUnit, pytest items): "n/a" (not checked there: the invariant does not apply, or
        the regime is not applicable to the target), "passed", "known" (violated, listed in the
        baseline) or "failed", with the counterexample that shows it (reported under it if one
        is, else one that also violates it)."""
        count = self.summary(regime).count(invariant)
        if not count.checked:
            return "n/a", None
        if not count.violated:
            return "passed", None
        cases = [c for c in self.counterexamples if c.regime == regime]
        cited = next((c for c in cases if c.invariant == invariant), None) or next(
            (c for c in cases if any(v.invariant == invariant for v in c.violations)), None)
        return ("known" if (regime, invariant) in self._known() else "failed"), cited

    @property
    def verdict(self) -> str:
        return "violated" if not self.holds else "incomplete" if self.incomplete else "holds"

    def verdicts(self) -> dict[str, str]:
        """regime -> 'holds' | 'n/a: reason' | 'not evaluated: reason' | 'VIOLATED: ID, ID'
        (first IDs of its counterexamples)."""
        out = {}
        for summary in self.regimes:
            found = [c.invariant for c in self.counterexamples if c.regime == summary.regime]
            out[summary.regime] = (unreached(summary.not_applicable) if summary.not_applicable
                                   else "VIOLATED: " + ", ".join(found) if found else "holds")
        return out

    def to_json(self) -> str:
        """The document of docs/json-schema.md."""
        return json.dumps({
            "schema": self.schema, "tool": "pcpcheck", "version": self.version,
            "verdict": self.verdict, "verdicts": self.verdicts(), "target": self.target,
            "target_name": self.target_name,
            "stand_ins": list(self.stand_ins), "options": asdict(self.options),
            "regimes": {s.regime: {
                "cases": s.cases, "seconds": s.seconds, "check_seconds": s.check_seconds,
                "budget_reached": s.budget_reached, "not_applicable": s.not_applicable,
                "slowest_call": s.slowest_call, "mean_call": s.mean_call,
                "coverage": {"branches": dict(s.branches), "features": dict(s.features)},
                "scope_steps": s.scope_steps,
                "real_stages": dict(s.real_stages),
                "invariants": {c.invariant: {"checked": c.checked, "violated": c.violated}
                               for c in s.invariants}} for s in self.regimes},
            "counterexamples": [{
                "regime": c.regime, "invariant": c.invariant, "ranks": list(c.ranks),
                "violations": [{"invariant": v.invariant, "ranks": list(v.ranks)}
                               for v in c.violations],
                "known": c.known, "hazard": c.hazard,
                "flaky": None if c.flaky is None else {"replays": c.flaky[0], "reproduced": c.flaky[1]},
                "note": c.note,
                "folded_into": c.folded_into, "case": json.loads(c.case), "replay": c.replay,
                "report": c.report} for c in self.counterexamples],
            "baseline": None if self.baseline is None else {
                "path": self.baseline.path, "known": [list(e) for e in self.baseline.known],
                "fixed": [list(e) for e in self.baseline.fixed]},
            "reproducers": list(self.reproducers), "seconds": self.seconds,
            "merge": None if not self.shards else {"shards": self.shards,
                                                   "missing": list(self.missing_shards)},
            "release": None if self.release is None else {
                **asdict(self.release), "files": dict(self.release.files),
                "adapted": list(self.release.adapted),
                "lines": {entry.file: entry.to_json() for entry in self.release.lines},
                "changes": None if self.release.changes is None
                else self.release.changes.to_json(self.release.changed())},
        }, indent=2)

    @staticmethod
    def from_json(text: str) -> CheckResult:
        data = json.loads(text)
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"result schema {data.get('schema')!r}; this pcpcheck reads {SCHEMA_VERSION}")
        options = data["options"]
        sizes = options["world_sizes"]
        baseline = data["baseline"]
        return CheckResult(
            version=data["version"], target=data["target"], target_name=data["target_name"],
            stand_ins=tuple(data["stand_ins"]),
            options=Options(**{**options, "regimes": tuple(options["regimes"]),
                               "world_sizes": None if sizes is None else tuple(sizes),
                               "shard": None if options.get("shard") is None
                               else tuple(options["shard"])}),
            regimes=tuple(RegimeSummary(
                regime=regime, cases=r["cases"], seconds=r["seconds"],
                check_seconds=r["check_seconds"],
                invariants=tuple(InvariantCount(i, c["checked"], c["violated"])
                                 for i, c in r["invariants"].items()),
                budget_reached=r["budget_reached"], not_applicable=r.get("not_applicable"),
                slowest_call=r.get("slowest_call", 0.0), mean_call=r.get("mean_call", 0.0),
                branches=tuple(r.get("coverage", {}).get("branches", {}).items()),
                features=tuple(r.get("coverage", {}).get("features", {}).items()),
                scope_steps=r.get("scope_steps"),
                real_stages=tuple(r.get("real_stages", {}).items()))
                for regime, r in data["regimes"].items()),
            counterexamples=tuple(Counterexample(
                regime=c["regime"],
                violations=tuple(ViolationRecord(v["invariant"], tuple(v["ranks"]))
                                 for v in c["violations"]),
                case=json.dumps(c["case"], separators=(",", ":")), replay=c["replay"],
                report=c["report"], known=c["known"], hazard=c["hazard"],
                flaky=None if c["flaky"] is None else (c["flaky"]["replays"], c["flaky"]["reproduced"]),
                note=c.get("note"),
                folded_into=c["folded_into"]) for c in data["counterexamples"]),
            baseline=None if baseline is None else BaselineOutcome(
                baseline["path"], tuple(map(tuple, baseline["known"])),
                tuple(map(tuple, baseline["fixed"]))),
            reproducers=tuple(data["reproducers"]), schema=data["schema"],
            seconds=data.get("seconds", 0.0),
            shards=(data.get("merge") or {}).get("shards", 0),
            missing_shards=tuple((data.get("merge") or {}).get("missing", ())),
            release=None if data.get("release") is None else ReleaseRecord(**{
                **data["release"], "files": tuple(data["release"]["files"].items()),
                "adapted": tuple(data["release"]["adapted"]),
                "capabilities": data["release"].get("capabilities", {}),
                "paths": tuple(PathStage(**stage) for stage in data["release"].get("paths", ())),
                "lines": tuple(FileLines(file=relpath, functions=tuple(entry["functions"]),
                                         run=tuple(entry["run"]))
                               for relpath, entry in data["release"].get("lines", {}).items()),
                "changes": None if data["release"].get("changes") is None
                else Changes.from_json(data["release"]["changes"])}))


@dataclass(frozen=True)
class Verdict:
    """`replay`'s answer for one case."""

    holds: bool
    violated: tuple[str, ...]  # invariant IDs, the first is what the case is reported under
    report: str  # the counterexample as `pcpcheck check` prints it, or "" when it holds


@dataclass(frozen=True, kw_only=True)
class RegimeDiff:
    regime: str
    cases: int
    case: str | None  # the minimal differing case (Case JSON), None when the outcomes agree
    report: str  # the side-by-side text, "" when they agree
    not_applicable: str | None = None  # why one of the targets cannot reach the regime


@dataclass(frozen=True, kw_only=True)
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
        return EXIT_VIOLATION if self.differs else EXIT_HOLDS

    def to_json(self) -> str:
        document = asdict(self)
        for regime in document["regimes"]:
            regime["case"] = None if regime["case"] is None else json.loads(regime["case"])
        return json.dumps({"schema": document.pop("schema"), "kind": "diff",
                           "verdict": "different" if self.differs else "same", **document},
                          indent=2)


# --- a tree diff: `pcpcheck diff OLD NEW` for two vLLM trees ---------------------------------------

EXIT_DIFFERENT = 4  # a tree diff: the paths differ, both sides holding every invariant
SIDES = ("old", "new")  # a tree diff's two trees, as its report and JSON name them


@dataclass(frozen=True, kw_only=True)
class StageRank:
    """One rank's value of a step's first differing stage, both sides as text."""

    rank: int
    old: str
    new: str


@dataclass(frozen=True, kw_only=True)
class DifferingStep:
    """The smallest step found whose paths first differ at `stage`."""

    stage: str
    case: str  # the drawn step (Case JSON): `pcpcheck diff OLD NEW --replay CASE`
    batch: str  # the step in one line
    ranks: tuple[StageRank, ...]  # the stage's values side by side, per rank where they differ
    old_value: tuple[Any, ...]  # the stage's value per rank, plain data
    new_value: tuple[Any, ...]
    old_violations: tuple[str, ...]  # the invariants each side violates on it (none: holds)
    new_violations: tuple[str, ...]
    old_report: str  # a side's counterexample report where it violates, else ""
    new_report: str
    replay: str  # the command that reruns the step on both trees
    report: str  # the text
    flaky: tuple[int, int] | None = None  # (replays, how many showed this stage) if not all did


@dataclass(frozen=True, kw_only=True)
class SideViolation:
    """A side's violation on a step where the two paths agree (both sides alike, or one side
    failing without a difference the stages show): the smallest such step."""

    side: str  # old | new
    invariant: str
    case: str
    replay: str  # `pcpcheck vllm SIDE --replay` of that side's step
    report: str  # the side's counterexample report
    other_violations: tuple[str, ...] = ()  # what the other side violates on the same step


@dataclass(frozen=True, kw_only=True)
class RegimeTreeDiff:
    regime: str
    steps: int = 0  # steps run on both trees (shrinking included)
    differing: int = 0  # of which the paths differ at some stage
    first_stages: tuple[tuple[str, int], ...] = ()  # (stage, steps first differing there), path order
    violated: tuple[tuple[str, str, int], ...] = ()  # (side, invariant, steps violating it)
    differences: tuple[DifferingStep, ...] = ()  # per first stage, the smallest step, smallest first
    violations: tuple[SideViolation, ...] = ()
    not_applicable: str | None = None  # which side cannot reach the regime, and why
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TreeDiffResult:
    version: str
    old: str  # each tree's location (a wheel, a checkout)
    new: str
    old_release: str  # each tree's version, as it states it
    new_release: str
    options: Options
    regimes: tuple[RegimeTreeDiff, ...]
    seconds: float = 0.0
    schema: int = SCHEMA_VERSION

    @property
    def differs(self) -> bool:
        return any(r.differing for r in self.regimes)

    @property
    def violated(self) -> bool:
        return any(r.violated for r in self.regimes)

    @property
    def verdict(self) -> str:
        return "violated" if self.violated else "different" if self.differs else "same"

    @property
    def exit_code(self) -> int:
        """1 a violation on either side (as everywhere in pcpcheck), 4 a difference with both
        sides holding, 0 no difference."""
        return (EXIT_VIOLATION if self.violated else EXIT_DIFFERENT if self.differs
                else EXIT_HOLDS)

    def to_json(self) -> str:
        document = asdict(self)
        for regime, record in zip(document["regimes"], self.regimes):
            regime["first_stages"] = dict(record.first_stages)
            regime["violated"] = {side: {invariant: steps for s, invariant, steps
                                         in record.violated if s == side}
                                  for side in SIDES}
            for found in regime["differences"] + regime["violations"]:
                found["case"] = json.loads(found["case"])
        return json.dumps({"schema": document.pop("schema"), "kind": "tree-diff",
                           "verdict": self.verdict, **document}, indent=2)
