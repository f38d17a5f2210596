"""`pcpcheck vllm SOURCE --steps DIR|FILE`: recorded steps of a live vLLM (the schema of
pcpcheck.shared.recording, docs/record.md) replayed through the release's own path.

Each recorded step becomes the Case the release path runs (`pcpcheck vllm --replay` runs one),
every invariant is judged on it, and what the release computes on CPU for each rank (its
expanded slot map and num_decode_tokens, integers) is compared with what the live rank
recorded: a difference is its own finding (MISMATCH), naming the step and rank, never a pass.
A step the layout model does not accept is reported (OUTSIDE), never dropped. A violated step
is shrunk like a drawn one (pcpcheck.search.minimize.reduced, in the release's batch order).
Runs in the driver on plain data: the release's code runs only in the backend's worker.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from pcpcheck.judge.explain import release_counterexample as counterexample
from pcpcheck.judge.release_case import capabilities, run_release_cases
from pcpcheck.search.draw import validate_case
from pcpcheck.search.minimize import reduced
from pcpcheck.search.release_search import release_order
from pcpcheck.shared.case import Case, TensorSpec
from pcpcheck.shared.errors import UsageError
from pcpcheck.shared.protocol import ReleaseInfo
from pcpcheck.shared.recording import DRAFT_STEP, OUTPUTS, read_lines
from pcpcheck.shared.results import EXIT_HOLDS, EXIT_VIOLATION
from pcpcheck_spec.names import DCP, DRAFT, REPLICATED, SHARDED, Batch, Request

MISMATCH, OUTSIDE, DISAGREE = "MISMATCH", "OUTSIDE", "DISAGREE"
# The MLA wrapper's two tensors (kv_c_normed, k_pe), small: the entry the live MLA layers call.
MLA_TENSORS = (TensorSpec((8,), "bfloat16"), TensorSpec((4,), "bfloat16"))
_PER_RANK = ("rank", "dcp_rank", "release")  # what differs between ranks of one step


@dataclass(kw_only=True)
class RecordedStep:
    step: int
    where: str  # FILE:LINE of its first line
    description: dict  # the step as the scheduler handed it, and the configuration
    ranks: dict[int, dict] = field(default_factory=dict)  # rank -> its release fields
    disagree: list[str] = field(default_factory=list)  # ranks whose step differs from `where`'s


@dataclass(kw_only=True)
class Finding:
    step: int
    kind: str  # an invariant's ID, MISMATCH, OUTSIDE or DISAGREE
    text: str
    case: str | None = None  # the (shrunk) case's JSON, for a violated invariant


@dataclass(kw_only=True)
class StepsResult:
    target_name: str
    source: str  # the release's location (a wheel or checkout)
    release: str  # its version
    files: list[str]
    steps: int
    judged: int
    findings: list[Finding]
    # ranks' steps whose gather outputs' sha256 was recorded: carried, never compared (the live
    # inputs' values are recorded as a hash only, so the replay cannot recompute the outputs)
    outputs_hashed: int = 0

    @property
    def exit_code(self) -> int:
        return EXIT_VIOLATION if self.findings else EXIT_HOLDS

    def text(self) -> str:
        lines = [f"pcpcheck: {self.steps} recorded steps of {self.target_name} "
                 f"({', '.join(self.files)}): {self.judged} judged"
                 + (f"; gather outputs hashed on {self.outputs_hashed} ranks' steps (recorded, "
                    "not compared: docs/record.md)" if self.outputs_hashed else "")]
        lines += [finding.text for finding in self.findings]
        lines.append(f"{len(self.findings)} findings" if self.findings
                     else "every recorded step holds and equals the release's replay")
        return "\n".join(lines)


def recording_files(path) -> list[Path]:
    """A recording: one file, or every *.jsonl file of a directory (one per rank)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise UsageError(f"--steps {path}: no *.jsonl file in the directory")
        return files
    if not path.is_file():
        raise UsageError(f"--steps {path}: no such file or directory")
    return [path]


def outputs_hashed(steps: list[RecordedStep]) -> int:
    return sum("outputs" in release.get("sha256", {}) for step in steps
               for release in step.ranks.values())


def read_recording(path) -> list[RecordedStep]:
    """Every recorded step, ranks grouped; UsageError (exit 2) on a malformed line."""
    steps: dict[int, RecordedStep] = {}
    records = read_lines(recording_files(path))
    for where, record in records:
        if record["kind"] == OUTPUTS:
            continue  # attached below, once every rank's step line is grouped
        description = {k: v for k, v in record.items() if k not in _PER_RANK}
        step = steps.setdefault(record["step"], RecordedStep(step=record["step"], where=where, description=description))
        rank, known = record["rank"], step.ranks.get(record["rank"])
        if known is not None and known == record["release"]:
            continue  # the same PCP rank recorded by another tensor-parallel rank
        if known is not None or not _merge_blocks(step.description, description):
            step.disagree.append(f"{where} (rank {rank})")
            continue
        step.ranks[rank] = record["release"]
    for where, record in records:
        if record["kind"] == OUTPUTS:
            _attach_outputs(steps, where, record)
    return [steps[number] for number in sorted(steps)]


def _attach_outputs(steps: dict[int, RecordedStep], where: str, record: dict) -> None:
    """An outputs line's sha256 as its step's `release.sha256.outputs` for its rank; UsageError
    for one with no step line (a step line without one is a gather that hung or crashed)."""
    step, rank = steps.get(record["step"]), record["rank"]
    if step is None or rank not in step.ranks:
        raise UsageError(f"{where}: outputs of step {record['step']} rank {rank}, which has no "
                         "step line")
    hashes = step.ranks[rank].setdefault("sha256", {})
    if hashes.setdefault("outputs", record["sha256"]) != record["sha256"]:
        step.disagree.append(f"{where} (rank {rank}, gather outputs)")


def _merge_blocks(into: dict, other: dict) -> bool:
    """Whether two ranks' lines describe the same step; if so, `into`'s blocks completed by
    `other`'s (a DCP rank sees the blocks of the tokens it owns only, the others null)."""
    def bare(description):
        return {**description, "requests": [{k: v for k, v in r.items() if k != "block_ids"}
                                            for r in description["requests"]]}
    if bare(into) != bare(other):
        return False
    merged = []
    for mine, theirs in zip(into["requests"], other["requests"]):
        if len(mine["block_ids"]) != len(theirs["block_ids"]):
            return False
        groups = []
        for a, b in zip(mine["block_ids"], theirs["block_ids"]):
            if len(a) != len(b) or any(x is not None and y is not None and x != y
                                       for x, y in zip(a, b)):
                return False
            groups.append([x if x is not None else y for x, y in zip(a, b)])
        merged.append(groups)
    for request, groups in zip(into["requests"], merged):
        request["block_ids"] = groups
    return True


def regime_of(description: dict) -> str:
    if description["kind"] == DRAFT_STEP:
        return DRAFT
    if description["dcp_size"] > 1:
        return DCP
    return SHARDED if description["shard_decode_requests"] else REPLICATED


def case_of(step: RecordedStep) -> Case:
    """The Case the release path runs for a recorded step, in its recorded batch order; ValueError
    (one line) for a step outside what the layout model accepts."""
    d = step.description
    if d["dcp_size"] not in (1, d["pcp_size"]):
        raise ValueError(f"dcp_size {d['dcp_size']} with pcp_size {d['pcp_size']}: the layout "
                         "model has D = 1 or D = P")
    # Virtual blocks before `first_block`, and those no recorded rank saw (null), hold no token
    # of this step a rank writes: a block unused in the step stands for each.
    used = [b for r in d["requests"] for b in r["block_ids"][0] if b is not None]
    fresh = iter(range(1 + max(used, default=-1), 1 << 40))
    requests = tuple(Request(r["scheduled"], r["prefilling"], r["computed"], tuple(
        [next(fresh) for _ in range(r["first_block"])]
        + [next(fresh) if b is None else b for b in r["block_ids"][0]])) for r in d["requests"])
    regime = regime_of(d)
    real = sum(r.num_tokens for r in requests)
    slots = [len(release["slot_mapping"]) for release in step.ranks.values()]
    batch = Batch(regime, d["pcp_size"], requests, d["block_size"], d["interleave"],
                  d["graph_size"] if regime != DRAFT else 0, d["dp_pad"] if regime == DRAFT else 0,
                  regime == DRAFT and any(n > real for n in slots))
    case = Case(batch, MLA_TENSORS)
    validate_case(case)
    return case


def _run_in_release_order(cases, release, backend):
    """run_release_cases on cases in the release's batch order (a shrunk step stays one the
    model runner could hand the manager)."""
    return run_release_cases((dataclasses.replace(c, batch=release_order(c.batch)) for c in cases),
                             release, backend)


def mismatches(step: RecordedStep, observation) -> list[Finding]:
    """Each recorded rank's integers against what the release computed for it on CPU."""
    found = []
    prepared = observation.prepared
    for rank, recorded in sorted(step.ranks.items()):
        computed = {"slot_mapping": [int(s) for s in prepared.slot_maps[rank]],
                    "num_decode_tokens": int(prepared.nds[rank])}
        for key, value in computed.items():
            if recorded[key] != value:
                found.append(Finding(step=step.step, kind=MISMATCH,
                                     text=f"{MISMATCH}: step {step.step} rank {rank}: {key} recorded "
                                     f"{recorded[key]}, the release computes {value}"))
    return found


def replay_steps(release: ReleaseInfo, steps: list[RecordedStep], backend, *,
                 shrink: bool = True) -> tuple[list[Finding], int]:
    """Findings of the recorded steps on the loaded release, and how many were judged."""
    caps = capabilities(release)
    findings, runnable = [], []
    for step in steps:
        if step.disagree:
            findings.append(Finding(step=step.step, kind=DISAGREE, text=f"{DISAGREE}: step {step.step}: "
                                    f"{', '.join(step.disagree)} differ from {step.where}"))
        try:
            case = case_of(step)
            reason = caps.not_applicable.get(case.batch.regime)
            if reason is None and case.batch.graph_size and not caps.graph_padding:
                reason = "graph padding, which this release has not"
            if reason:
                raise ValueError(f"regime {case.batch.regime}: {reason}")
        except ValueError as exc:
            findings.append(Finding(step=step.step, kind=OUTSIDE, text=f"{OUTSIDE}: step {step.step} "
                                    f"({step.where}) is outside the layout model: {exc}"))
            continue
        runnable.append((step, case))
    # every step judged first: shrinking runs cases of its own on the same backend
    observations = list(run_release_cases([case for _, case in runnable], release, backend))
    for (step, _), observation in zip(runnable, observations):
        findings += mismatches(step, observation)
        if observation.violations:
            regime = observation.prepared.case.batch.regime
            if shrink:
                observation = reduced(observation, release, backend, _run_in_release_order)
            first = observation.violations[0].invariant
            findings.append(Finding(step=step.step, kind=first,
                                    text=f"step {step.step} ({step.where}): "
                                    + counterexample(release, regime, observation),
                                    case=observation.prepared.case.to_json()))
    return sorted(findings, key=lambda f: f.step), len(runnable)
