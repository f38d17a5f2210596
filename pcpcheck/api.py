"""pcpcheck's Python API: `check` a target in every regime, `replay` one case.

    result = pcpcheck.check("path/to/pcp.py", regimes=("sharded",), budget_s=60)
    result.holds, result.exit_code, result.counterexamples, result.to_json()

The command line (`pcpcheck.cli`) and the pytest plugin are thin layers over `check`.
A CheckResult is immutable and round-trips through JSON (`docs/json-schema.md`); the live
`Observation` of each counterexample (for `--html`) rides along in memory only.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace

from pcpcheck import report
from pcpcheck.baseline import Baseline, load_baseline
from pcpcheck.cases import Case
from pcpcheck.backends import BACKENDS, make_backend
from pcpcheck.backends.base import WorkerError
from pcpcheck.check import run_case
from pcpcheck.engine import CheckerError, RegimeResult, Replays, search
from pcpcheck.loader import LoadError
from pcpcheck_spec.names import DEFAULT_REGIMES, HAZARD_REGIMES, REGIMES, SHARDED
from pcpcheck_spec.registry import IDS

SCHEMA_VERSION = 1
DEFAULT_MAX_EXAMPLES = 3000
EXIT_HOLDS, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2
DEFAULT_RELEASE_EXAMPLES = 1000  # steps per regime of `pcpcheck vllm` (each runs a release's manager)
NO_SHARD_FLAG = ("the gather has no shard_decode_requests parameter: decodes are never sharded "
                 "in its era (vLLM before 0.32)")


class UsageError(ValueError):
    """Bad options: one line (the CLI exits 2)."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    try:
        return dist_version("pcpcheck")
    except PackageNotFoundError:
        return "unknown"


# --- the result ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    regimes: tuple[str, ...]
    max_examples: int
    max_ranks: int
    seed: int | None
    budget_s: float | None
    backend: str
    world_sizes: tuple[int, ...] | None
    device: str
    timeout: float
    function: str | None
    baseline: str | None
    empty_steps: bool = False  # pcpcheck vllm: also steps with no scheduled token (a hazard)


@dataclass(frozen=True)
class InvariantCount:
    invariant: str
    checked: int  # cases on which it was evaluated
    violated: int  # of which it failed


@dataclass(frozen=True)
class RegimeSummary:
    regime: str
    cases: int
    seconds: float
    check_seconds: float  # running and judging alone (drawing and shrinking excluded)
    invariants: tuple[InvariantCount, ...]
    budget_reached: bool  # stopped by --budget before max_examples
    not_applicable: str | None = None  # why the target cannot reach this regime (nothing drawn)

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


@dataclass(frozen=True)
class Counterexample:
    regime: str
    violations: tuple[ViolationRecord, ...]  # the first is what the case is reported under
    case: str  # Case JSON: `pcpcheck check TARGET --replay CASE`
    replay: str  # that command line
    report: str  # the text report
    known: bool  # listed in the baseline
    hazard: bool = False  # found in a hazard regime (spec.names.HAZARD_REGIMES)
    flaky: tuple[int, int] | None = None  # (replays, how many showed it) when not all did
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
    known: tuple[tuple[str, str], ...]  # (regime, invariant) listed and found again
    fixed: tuple[tuple[str, str], ...]  # listed, regime checked, no longer found: shrink the file


@dataclass(frozen=True)
class ReleaseRecord:
    """What `check_release` checked: a vLLM release's files, as its worker read them."""

    release: str  # the version the source states
    kind: str  # wheel | checkout | installed
    location: str
    files: tuple[tuple[str, str], ...]  # (path in the release, sha256) of every file read
    adapted: tuple[str, ...]  # working stand-ins given and how pcpcheck adapted to the release
    layout_model: str  # the reference layout era that judged it (reference.ERAS)
    capabilities: dict = field(default_factory=dict)  # read from its code (vllm.release.Capabilities)


@dataclass(frozen=True)
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

    @property
    def new_violations(self) -> tuple[Counterexample, ...]:
        return tuple(c for c in self.counterexamples if not c.known)

    @property
    def holds(self) -> bool:
        """No violation outside the baseline."""
        return not self.new_violations

    @property
    def exit_code(self) -> int:
        return EXIT_HOLDS if self.holds else EXIT_VIOLATION

    def outcome(self, regime: str, invariant: str) -> tuple[str, Counterexample | None]:
        """One regime x invariant: ("passed" | "failed" | "known" | "n/a", its counterexample).
        An invariant violated only alongside an earlier one cites that case."""
        summary = next(s for s in self.regimes if s.regime == regime)
        count = summary.count(invariant)
        if not count.checked:
            return "n/a", None
        if not count.violated:
            return "passed", None
        cases = [c for c in self.counterexamples if c.regime == regime]
        cited = next((c for c in cases if c.invariant == invariant), None) or next(
            (c for c in cases if any(v.invariant == invariant for v in c.violations)), None)
        known = cited is not None and cited.known and cited.invariant == invariant
        return ("known" if known else "failed"), cited

    @property
    def verdict(self) -> str:
        return "holds" if self.holds else "violated"

    def verdicts(self) -> dict[str, str]:
        """regime -> 'holds' | 'n/a: reason' | 'VIOLATED: ID, ID' (first IDs of its counterexamples)."""
        out = {}
        for summary in self.regimes:
            found = [c.invariant for c in self.counterexamples if c.regime == summary.regime]
            out[summary.regime] = (f"n/a: {summary.not_applicable}" if summary.not_applicable
                                   else "VIOLATED: " + ", ".join(found) if found else "holds")
        return out

    def to_json(self) -> str:
        """The document of docs/json-schema.md."""
        return json.dumps({
            "schema": self.schema, "tool": "pcpcheck", "version": self.version,
            "verdict": self.verdict, "target": self.target, "target_name": self.target_name,
            "stand_ins": list(self.stand_ins), "options": asdict(self.options),
            "regimes": {s.regime: {
                "cases": s.cases, "seconds": s.seconds, "check_seconds": s.check_seconds,
                "budget_reached": s.budget_reached, "not_applicable": s.not_applicable,
                "invariants": {c.invariant: {"checked": c.checked, "violated": c.violated}
                               for c in s.invariants}} for s in self.regimes},
            "counterexamples": [{
                "regime": c.regime, "invariant": c.invariant, "ranks": list(c.ranks),
                "violations": [{"invariant": v.invariant, "ranks": list(v.ranks)}
                               for v in c.violations],
                "known": c.known, "hazard": c.hazard,
                "flaky": None if c.flaky is None else {"replays": c.flaky[0], "reproduced": c.flaky[1]},
                "folded_into": c.folded_into, "case": json.loads(c.case), "replay": c.replay,
                "report": c.report} for c in self.counterexamples],
            "baseline": None if self.baseline is None else {
                "path": self.baseline.path, "known": [list(e) for e in self.baseline.known],
                "fixed": [list(e) for e in self.baseline.fixed]},
            "reproducers": list(self.reproducers), "seconds": self.seconds,
            "release": None if self.release is None else {
                **asdict(self.release), "files": dict(self.release.files),
                "adapted": list(self.release.adapted)},
        }, indent=2)

    @staticmethod
    def from_json(text: str) -> "CheckResult":
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
                               "world_sizes": None if sizes is None else tuple(sizes)}),
            regimes=tuple(RegimeSummary(
                regime, r["cases"], r["seconds"], r["check_seconds"],
                tuple(InvariantCount(i, c["checked"], c["violated"])
                      for i, c in r["invariants"].items()), r["budget_reached"],
                r.get("not_applicable"))
                for regime, r in data["regimes"].items()),
            counterexamples=tuple(Counterexample(
                regime=c["regime"],
                violations=tuple(ViolationRecord(v["invariant"], tuple(v["ranks"]))
                                 for v in c["violations"]),
                case=json.dumps(c["case"], separators=(",", ":")), replay=c["replay"],
                report=c["report"], known=c["known"], hazard=c["hazard"],
                flaky=None if c["flaky"] is None else (c["flaky"]["replays"], c["flaky"]["reproduced"]),
                folded_into=c["folded_into"]) for c in data["counterexamples"]),
            baseline=None if baseline is None else BaselineOutcome(
                baseline["path"], tuple(map(tuple, baseline["known"])),
                tuple(map(tuple, baseline["fixed"]))),
            reproducers=tuple(data["reproducers"]), schema=data["schema"],
            seconds=data.get("seconds", 0.0),
            release=None if data.get("release") is None else ReleaseRecord(**{
                **data["release"], "files": tuple(data["release"]["files"].items()),
                "adapted": tuple(data["release"]["adapted"]),
                "capabilities": data["release"].get("capabilities", {})}))


# --- running ------------------------------------------------------------------------------------

def resolve_target(target) -> str:
    """A target as the loader (and a worker process) takes it: a callable becomes module:name."""
    if isinstance(target, (str, os.PathLike)) or target is None:
        return "impl" if target is None else os.fspath(target)
    if not callable(target):
        raise UsageError(f"target must be a callable, a path or module:function, "
                         f"not {type(target).__name__}")
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    where = f"{module}:{name}"
    if not module or not name or module == "__main__" or not name.isidentifier():
        raise UsageError(f"{where}: a callable target must be a module-level function importable "
                         "by name (ranks run in other processes); pass 'module:function' or a path")
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception as exc:  # noqa: BLE001 - its module may fail to import anywhere else too
        raise UsageError(f"{where}: its module does not import: {type(exc).__name__}: {exc}") from None
    if found is not target and getattr(found, "__wrapped__", None) is not target:
        raise UsageError(f"{where}: importing it by that name gives a different object")
    return where


def validate(options: Options) -> None:
    """Every option in range, or UsageError naming it."""
    unknown = [r for r in options.regimes if r not in REGIMES]
    if unknown or not options.regimes:
        raise UsageError(f"regimes must be among {', '.join(REGIMES)}, got {list(options.regimes)}")
    if options.max_examples < 1:
        raise UsageError(f"max_examples must be at least 1, got {options.max_examples}")
    if not 2 <= options.max_ranks <= 8:
        raise UsageError(f"--max-ranks must be between 2 and 8, got {options.max_ranks}")
    if not 0 < options.timeout < float("inf"):  # nan fails both comparisons
        raise UsageError(f"--timeout must be positive and finite (seconds), got {options.timeout}")
    if options.budget_s is not None and options.budget_s <= 0:
        raise UsageError(f"--budget must be positive seconds, got {options.budget_s}")
    if options.backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {options.backend!r}")
    if options.world_sizes and not all(2 <= p <= 8 for p in options.world_sizes):
        raise UsageError(f"every world size must be between 2 and 8: {list(options.world_sizes)}")


def default_world_sizes(backend: str, world_sizes, device: str):
    """The world sizes a process backend pools (None for threads), checked against the GPUs."""
    if backend == "threads":
        return world_sizes
    import torch
    if device != "cpu":
        raise UsageError(f"--device {device} is for --backend threads ({backend} ranks use "
                         + ("cuda:rank" if backend == "nccl" else "the CPU") + ")")
    gpus = torch.cuda.device_count() if backend == "nccl" else 0
    if backend == "nccl":
        if gpus < 2:
            raise UsageError(f"--backend nccl needs at least 2 GPUs, found {gpus}")
        if world_sizes and max(world_sizes) > gpus:
            raise UsageError(f"--backend nccl: world size {max(world_sizes)} needs "
                             f"{max(world_sizes)} GPUs, found {gpus}")
    if world_sizes:
        return tuple(world_sizes)
    return (2, 4) if backend == "gloo" else tuple(sorted({2, min(gpus, 8)}))


def make_runner(backend: str, *, timeout: float, world_sizes, device: str, start: bool = True):
    """The backend (pcpcheck.backends), its process pools started unless start=False (a replay)."""
    try:
        return make_backend(backend, timeout=timeout, world_sizes=world_sizes if start else None,
                            device=device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class Progress:
    """What `check` tells as it goes (all optional): the CLI prints lines, a TTY a live one."""

    def started(self, target, options: Options) -> None: ...
    def case(self, regime: str, result) -> None: ...  # result: the engine's RegimeResult so far
    def finished(self, summary: RegimeSummary) -> None: ...


def check(target, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_MAX_EXAMPLES,
          max_ranks: int = 8, seed: int | None = None, budget_s: float | None = None,
          backend: str = "threads", baseline: str | os.PathLike | None = None,
          function: str | None = None, timeout: float = 10.0, world_sizes=None,
          device: str = "cpu", progress: Progress | None = None, runner=None,
          jobs: int | None = None) -> CheckResult:
    """Check a gather implementation against the spec in each regime.

    target: a callable (importable as module:function), a .py path, 'module:function' or 'impl'.
    seed None: derandomized, the same cases every run. budget_s: wall-clock seconds across
    regimes, shared out among the regimes still to run. baseline: a file of known violations
    (`REGIME INVARIANT` per line). runner: an already started backend (torchrun's rank 0).
    jobs: driver processes searching regimes at once (default_jobs: one per two cores on the
    threads backend); the result does not depend on it.
    Raises UsageError, LoadError, WorkerError (rank processes failed to start), CheckerError.
    """
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(tuple(dict.fromkeys(regimes)), max_examples, max_ranks, seed, budget_s,
                      backend, tuple(world_sizes) if world_sizes else None, device, timeout,
                      function, None if baseline is None else os.fspath(baseline))
    validate(options)
    known = load_baseline(options.baseline) if options.baseline else Baseline(options.baseline, ())
    source = resolve_target(target)
    progress = progress or Progress()
    jobs = default_jobs(backend, runner) if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    started = time.monotonic()
    if runner is None:
        sizes = default_world_sizes(backend, options.world_sizes, device)
        options = Options(**{**asdict(options), "world_sizes": sizes})
        if jobs > 1 and backend == "threads" and len(options.regimes) > 1:
            loaded, results = _search_in_drivers(source, options, jobs, progress)
        else:
            with make_runner(backend, timeout=timeout, world_sizes=sizes, device=device) as own:
                loaded, results = _search_here(source, own, options, progress)
    else:
        loaded, results = _search_here(source, runner, options, progress)
    return replace(_result(source, loaded, options, results, known),
                   seconds=round(time.monotonic() - started, 3))


def _search_here(source: str, runner, options: Options, progress: Progress):
    """The regimes searched one after another on `runner`: (target, results)."""
    from pcpcheck.jobs import budget_share
    loaded = runner.load(source, options.function)  # in the backend's workers, never here
    progress.started(loaded, options)
    deadline = None if options.budget_s is None else time.monotonic() + options.budget_s
    results = []
    for index, regime in enumerate(options.regimes):
        share = budget_share(deadline, len(options.regimes) - index)
        results.append(_search_regime(loaded, runner, options, regime, share,
                                      lambda r, regime=regime: progress.case(regime, r)))
        progress.finished(_summary(results[-1]))
    return loaded, results


def default_jobs(backend: str, runner=None) -> int:
    """Driver processes by default on the threads backend: one per two cores, since a driver
    and its worker, with cases streamed in batches, keep two cores busy (measured on 2 cores:
    the default run took 10.1 s with one driver and 10.5-10.8 s with two). A process backend's
    pools, or a runner given, are driven by this process alone."""
    return max(1, (os.cpu_count() or 1) // 2) if backend == "threads" and runner is None else 1


def _search_regime(target, runner, options: Options, regime: str, deadline, on_case) -> RegimeResult:
    if regime == SHARDED and not target.accepts_shard:  # its era has no decode sharding
        return RegimeResult(regime, not_applicable=NO_SHARD_FLAG)
    return search(target, regime, runner, max_examples=options.max_examples,
                  max_ranks=options.max_ranks, derandomize=options.seed is None, seed=options.seed,
                  pcp_sizes=options.world_sizes, deadline=deadline, on_case=on_case)


def _search_in_drivers(source: str, options: Options, jobs: int, progress: Progress):
    """The regimes searched by `jobs` driver processes at once (pcpcheck.jobs); progress lines
    in regime order, each when it and every regime before it are done."""
    from pcpcheck.jobs import search_in_parallel

    def open_backend():
        runner = make_runner("threads", timeout=options.timeout, world_sizes=options.world_sizes,
                             device=options.device)
        try:
            return runner, runner.load(source, options.function)
        except BaseException:
            runner.close()
            raise

    def search_regime(index, target, runner, share, on_case):
        return _search_regime(target, runner, options, options.regimes[index], share, on_case)

    loaded, done, shown = [], {}, [0]

    def on_loaded(target):
        loaded.append(target)
        progress.started(target, options)

    def on_done(index, result):
        done[index] = result
        while shown[0] in done:  # in order: a later regime's line waits for the earlier ones
            progress.finished(_summary(done[shown[0]]))
            shown[0] += 1

    results = search_in_parallel(
        len(options.regimes), jobs, open_backend, search_regime, budget_s=options.budget_s,
        on_loaded=on_loaded, on_case=lambda index, r: progress.case(options.regimes[index], r),
        on_done=on_done)
    return loaded[0], results


def _summary(result) -> RegimeSummary:
    return RegimeSummary(result.regime, result.cases, round(result.seconds, 3),
                         round(result.check_seconds, 3),
                         tuple(InvariantCount(i, result.checked[i], result.violated[i])
                               for i in IDS if i in result.checked),
                         result.budget_reached, result.not_applicable or None)


def _result(source: str, target, options: Options, results, baseline: Baseline,
            describe=None, release: ReleaseRecord | None = None) -> CheckResult:
    """`describe(regime, observation, replays) -> (replay command, report text)`: default the
    gather's (`pcpcheck check`)."""
    if describe is None:
        def describe(regime, observation, replays):
            return (report.replay_command(target.source, observation, options.function),
                    report.counterexample(observation, regime, target.source, options.function,
                                          target, replays))
    shrunk = [(r.regime, o, p) for r in results for o, p in zip(r.counterexamples, r.replays)]
    into = report.fold([(regime, o) for regime, o, _ in shrunk])
    counterexamples = []
    for (regime, observation, replays), host in zip(shrunk, into):
        first = observation.violations[0].invariant
        command, text = describe(regime, observation, replays)
        counterexamples.append(Counterexample(
            regime=regime,
            violations=tuple(ViolationRecord(v.invariant, tuple(v.ranks))
                             for v in observation.violations),
            case=observation.prepared.case.to_json(),
            replay=command, report=text,
            known=(regime, first) in baseline.entries,
            hazard=regime in HAZARD_REGIMES,
            flaky=(replays.runs, replays.reproduced) if replays.flaky else None,
            folded_into=host, observation=observation))
    outcome = None
    if options.baseline:
        found = {(c.regime, c.invariant) for c in counterexamples}
        outcome = BaselineOutcome(
            options.baseline, tuple(e for e in baseline.entries if e in found),
            tuple(e for e in baseline.entries if e not in found and e[0] in options.regimes))
    return CheckResult(version(), source, target.name, tuple(target.stand_ins), options,
                       tuple(_summary(r) for r in results), tuple(counterexamples), outcome,
                       release=release)


# --- a vLLM release ------------------------------------------------------------------------------

def check_release(source, *, regimes=DEFAULT_REGIMES, max_examples: int = DEFAULT_RELEASE_EXAMPLES,
                  max_ranks: int = 8, seed: int | None = None, budget_s: float | None = None,
                  timeout: float = 10.0, empty_steps: bool = False,
                  progress: Progress | None = None) -> CheckResult:
    """Check a vLLM release's own PCP path (`pcpcheck vllm SOURCE`): its PCPManager's layout
    (LAYOUT) and its gather and wrappers on every rank, per regime it can reach.

    source: a release ('0.33.0', 'vllm==0.33.0'; fetched with pip into the wheel cache), a wheel,
    a checkout, or 'installed'. The release is read and fetched here, but loaded and run only in
    the backend's worker process. Raises UsageError, SourceError, InterfaceDrift (LoadError's), WorkerError.
    """
    from pcpcheck.vllm.source import resolve
    from pcpcheck.vllm.verdict import counterexample, replay_command, search_regime
    if isinstance(regimes, str):
        regimes = (regimes,)
    options = Options(tuple(dict.fromkeys(regimes)), max_examples, max_ranks, seed, budget_s,
                      "threads", None, "cpu", timeout, None, None, empty_steps)
    validate(options)
    spec = resolve(os.fspath(source)).spec()  # finds or fetches the files; executes nothing
    progress = progress or Progress()
    with make_runner("threads", timeout=timeout, world_sizes=None, device="cpu") as backend:
        release = load_release(backend, spec)
        progress.started(release, options)
        deadline = None if budget_s is None else time.monotonic() + budget_s
        results = []
        for index, regime in enumerate(options.regimes):
            share = None if deadline is None else \
                time.monotonic() + (deadline - time.monotonic()) / (len(options.regimes) - index)
            result = search_regime(release, regime, backend, max_examples=max_examples,
                                   max_ranks=max_ranks, seed=seed, empty_steps=empty_steps,
                                   deadline=share,
                                   on_case=lambda r, regime=regime: progress.case(regime, r))
            results.append(result)
            progress.finished(_summary(result))
    return _result(spec["location"], release, options, results, Baseline(None, ()),
                   describe=lambda regime, observation, replays: (
                       replay_command(release, observation),
                       counterexample(release, regime, observation, replays)),
                   release=release_record(release))


def load_release(backend, spec: dict):
    """The release loaded in the backend's worker: its ReleaseInfo (plain data)."""
    from pcpcheck.backends.base import RELEASE
    return backend.load(json.dumps(spec, sort_keys=True), RELEASE)


def release_record(release) -> ReleaseRecord:
    info = release.release
    return ReleaseRecord(info["release"], info["source"]["kind"], info["source"]["location"],
                         tuple(info["files"].items()), tuple(info["adapted"]),
                         info["caps"]["era"], dict(info["caps"]))


# --- one case -----------------------------------------------------------------------------------

def replay_result(args, target, observation) -> CheckResult:
    """The CheckResult of `pcpcheck check --replay` (one case, run once), for --json."""
    from collections import Counter
    regime = observation.prepared.case.batch.regime
    result = RegimeResult(regime, cases=1, checked=Counter(observation.checked),
                          violated=Counter(v.invariant for v in observation.violations))
    if observation.violations:
        result.counterexamples, result.replays = [observation], [Replays(1, 1)]
    options = Options((regime,), 1, args.max_ranks, args.seed, None, args.backend,
                      args.world_sizes, args.device, args.timeout, args.function, None)
    return _result(args.target, target, options, [result], Baseline(None, ()))


@dataclass(frozen=True)
class Verdict:
    holds: bool
    violated: tuple[str, ...]  # invariant IDs, the first is what the case is reported under
    report: str  # the counterexample as `pcpcheck check` prints it, or "" when it holds


def replay(target, case_json: str, function: str | None = None,
           timeout: float = 10.0) -> Verdict:
    """Judge one case (JSON as printed by pcpcheck) against a target (run in a worker)."""
    case = Case.from_json(case_json)
    with make_backend("threads", timeout=timeout) as backend:
        loaded = backend.load(resolve_target(target), function)
        observation = run_case(case, loaded, backend)
    violated = tuple(v.invariant for v in observation.violations)
    text = report.counterexample(observation, case.batch.regime, loaded.source, function,
                                 loaded) if violated else ""
    return Verdict(not violated, violated, text)


__all__ = ["check", "check_release", "replay", "ReleaseRecord", "CheckResult", "Counterexample", "RegimeSummary", "Options",
           "Verdict", "UsageError", "LoadError", "CheckerError", "WorkerError", "Progress",
           "version", "SCHEMA_VERSION"]
