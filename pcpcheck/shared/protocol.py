"""The worker protocol: every operation between the driver and a worker (and the fork server
that forks workers), its request and its reply, each encoded and decoded side by side here and
nowhere else. Messages are plain data: a JSON header (its "op" names the operation) and byte
blobs, framed by pcpcheck.shared.wire.

    operation          request (who sends it)                 reply
    start              -                                      ready_reply (worker) / is_ready
    load               load_request (driver) / read_load      loaded_reply, load_error_reply
                                                              (worker) / target_info (driver)
    cases              cases_request, case_request (driver)   per case: result_reply (worker)
                       / read_cases (worker)                  / read_result, LinesRun.add
                                                              (driver)
    a case's inputs    in the request's blobs / rank_inputs   each rank: encode_rank,
                                                              encode_release_rank / decode_rank
    failure            -                                      fail_reply (worker, fork server)
                                                              / failure (driver)
    lost (torchrun)    -                                      lost_reply (a torchrun supervisor)
                                                              / read_lost (rank 0's driver)
    spawn, wait        spawn_request, wait_request (driver)   {"pid"}, {"code"} (fork server)
                       / read_fork_request (fork server)

Nothing here judges: the worker's report is data the driver decodes and judges itself.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from pcpcheck.shared import wire
from pcpcheck.shared.defaults import MAX_RANKS
from pcpcheck.shared.errors import InterfaceDrift, LoadError, SourceError
from pcpcheck_spec.names import DCP, INCOMPLETE, Batch

if TYPE_CHECKING:  # annotations only
    from pcpcheck.shared.case import Case

MAX_OUTPUT = 4000  # bytes of a rank's printing kept per case
STATUS = struct.Struct(f"<qd{MAX_RANKS}d{MAX_RANKS}b")  # running rank, since, seconds/rank, states
MAX_BATCH = 32  # cases per message at most
MAX_AHEAD = 2 * MAX_BATCH  # cases a peer may run while a rank waits in a header round (2 batches)
# Rank states in the status file (written by the worker at every switch, read by the driver).
NOT_STARTED, RUNNING, WAITING, FINISHED = 0, 1, 2, 3


# The `function` of a vLLM release (`pcpcheck vllm`): its `source` is the release's source spec as
# JSON (pcpcheck.shared.source.Source.spec); the worker loads the release and runs
# pcpcheck.worker.release_step.rank_step on every rank.
RELEASE = "<vllm release>"
# The stages of a release's PCP KV path, in order (semantics section 10): the path table names
# each real (the release's file runs it) or modeled (pcpcheck's restatement).
BATCH_ORDER, SLOT_MAPPING, MANAGER_STAGE, SPLIT, WRAPPER, GATHER_STAGE, CACHE_WRITE = STAGES = (
    "batch order", "block tables / slot mapping", "manager", "decode/prefill split", "wrapper",
    "gather", "cache write")
# What a worker sends back of a release's rank step, as plain data (tensors travel as bytes).
STEP_FIELDS = ("layout", "tokens", "slot_map", "nd", "shard", "entry", "layout_error", "kernels",
               "order", "split", "slot_map1")


@dataclass(frozen=True, kw_only=True)
class TargetInfo:
    """What the driver knows of a target: sent back by the worker that loaded it."""

    source: str  # as given (a path, module:function, impl): what the workers load
    function: str | None  # --function as given
    name: str
    stand_ins: tuple[str, ...]
    accepts_shard: bool
    function_name: str
    protocol: str = ""  # `--async`: the protocol class the worker found ("" for none)
    async_order: tuple[str, ...] = ()  # the caller's steps it drives it through
    streams: bool = False  # the gather's file uses the stream API: its streams are judged


@dataclass(frozen=True, kw_only=True)
class ReleaseInfo(TargetInfo):
    """A vLLM release as the worker that loaded it described it, in plain data: `release` holds
    release, source (spec), files (relpath -> sha256), adapted, caps (Capabilities' fields),
    paths (the path table: per stage, real with its file and sha256 or modeled with why),
    functions (per real file of the path table: the executable lines inside its functions)."""

    release: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseStep:
    """A case for a release: its ranks build their own inputs (their managers lay the step out)."""

    case: Case

    @property
    def size(self) -> int:
        return self.case.batch.pcp_size


class PreparedCase(Protocol):
    """What a request reads of a gather's case prepared by the driver
    (pcpcheck.judge.prepare.Prepared)."""

    @property
    def case(self) -> Case: ...
    @property
    def size(self) -> int: ...
    @property
    def shard(self) -> bool: ...
    @property
    def nds(self) -> list[int]: ...
    @property
    def real_rows(self) -> list[int]: ...
    def input_bytes(self, rank: int) -> list[bytes]: ...


class Outcome(Protocol):
    """What a rank's report reads of its call (pcpcheck.worker.runner.RankOutcome)."""

    value: object
    error: str | None
    error_detail: str | None
    trace: list[tuple[Any, ...]]  # (op, dim, shape, dtype) per collective
    streams: list[tuple[Any, ...]] | None  # an asynchronous step's stream trace


# A hosted rank's inputs as rank_inputs builds them: (tensors, slot_mapping, nd, sent).
RankInputs = tuple[tuple[torch.Tensor, ...], torch.Tensor, int, list[wire.SentTensor] | None]


@dataclass
class RankResult:
    """One rank's call, as the worker reported it (or as the driver records a lost rank)."""

    error: str | None = None
    error_detail: str | None = None
    trace: list[tuple[Any, ...]] = field(default_factory=list)
    output: str = ""
    value: object = None  # decoded by the driver: tuples, lists, wire.Received, stand-ins
    # None: unknown (the rank never reported); an input's None: as the driver sent it
    inputs_after: list[bytes | None] | None = None
    poisoned: bool = False  # its process group failed: the pool must be replaced
    input_device: str = "cpu"  # where the rank's inputs were (outputs must be there too)
    # a release's rank: its rank_step report (layout, inputs), plain data
    step: dict[str, Any] | None = None
    seconds: float = 0.0  # how long the rank's call ran (its own running time, as timed)
    lost: str | None = None  # "hung" or "died": the rank never reported; its worker was retired
    group1: RankResult | None = None  # a release's rank: its call for the replicated KV group
    streams: list[tuple[Any, ...]] | None = None  # an asynchronous step's stream trace


@dataclass(kw_only=True)
class Capabilities:
    """What a vLLM release can do, read from its own code by the worker that loaded it
    (pcpcheck.worker.release_code), sent to the driver as plain data."""

    era: str  # the reference layout model that judges it (reference.ERAS)
    manager_shards: bool  # PCPManager(shard_decode_requests=...) exists
    gather_shard: bool  # the gather takes shard_decode_requests
    wrapper_shard_keyword: str | None  # the wrappers' shard keyword (pcp_shard_decode_requests)
    graph_padding: bool  # _build_batch_layout(padded_num_tokens=...)
    replicated_method: bool  # PCPManager.replicated_requests exists
    # the second KV group drawn replicated under DCP: its BlockTables shards per group
    # (`dcp_sharded`, 0.31 on) and runs (triton installed)
    replicated_kv_group: bool = False
    # its slot kernel masks dummy requests (`idx_mapping == -1`, 0.31 on): a step's graph
    # padding rows then reach the kernel as one dummy request (pcpcheck.shared.step_inputs)
    dummy_requests: bool = False
    # the interleave sizes it accepts under DCP (its config): its default, and every size that
    # divides the block size where validate_block_size allows them (else the default alone)
    interleave_default: int = 1
    interleave_divisors: bool = True
    not_applicable: dict[str, str] = field(default_factory=dict)  # regime -> reason
    # the wrappers it has: every step enters through one (one tensor: the indexer's K; two: the
    # MLA latent cache), as its layers call them
    wrappers: tuple[str, ...] = ()
    # its speculators compute a later draft step's unexpanded map with the block tables' own
    # kernel (pcpcheck.worker.release_draft), and the kernels run here: draft maps are its own
    draft_path: bool = False

    def replicated_group_call(self, regime: str) -> bool:
        """Whether a step of `regime` calls the gather a second time, for the second KV group,
        replicated under DCP (`dcp_sharded` False): the worker makes that call, the driver
        judges it by REPLICA."""
        return self.replicated_kv_group and regime == DCP


# --- the operations --------------------------------------------------------------------------
LOAD, CASES, CASE = "load", "cases", "case"  # driver -> worker (CASE: torchrun, one case)
READY, LOADED, LOAD_ERROR, RESULT, FAIL = "ready", "loaded", "load_error", "result", "fail"
LOST = "lost"  # a torchrun supervisor's reply for a rank that never reported
SPAWN, WAIT = "spawn", "wait"  # driver -> fork server


def operation(header: wire.Header) -> str:
    """The operation a message carries ("" for none)."""
    return str(header.get("op") or "")


# --- start ------------------------------------------------------------------------------------

def ready_reply(pid: int | None = None) -> wire.Header:
    """A worker (its pid) or the fork server, started and waiting for requests."""
    return {"op": READY} if pid is None else {"op": READY, "pid": pid}


def is_ready(header: wire.Header) -> bool:
    return operation(header) == READY


def fail_reply(exc: BaseException, limit: int = 500) -> wire.Header:
    """A worker or the fork server that failed itself (pcpcheck's failure, not a target's)."""
    return {"op": FAIL, "message": f"{type(exc).__name__}: {exc}"[:limit]}


def failure(header: wire.Header) -> str | None:
    """What a failed worker or fork server said of its failure; None for any other message."""
    if operation(header) != FAIL:
        return None
    return str(header.get("message"))


# --- load -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadRequest:
    """A load request as the worker reads it: the target, its function ("" for none, RELEASE
    for a vLLM release), and how many instances (one per rank the worker hosts)."""

    source: str
    function: str
    copies: int

    @property
    def key(self) -> tuple[str, str]:
        """How a case names the target it runs on."""
        return self.source, self.function


# An asynchronous protocol travels inside the function a load names:
# "FUNCTION@async=CLASS/ORDER" (CLASS empty: the one class of the module with start and finish;
# ORDER: the caller's steps, comma-separated). One string keeps it in the key every case names.
ASYNC_MARK = "@async="


def async_function(function: str | None, protocol: str, order: Sequence[str]) -> str:
    return f"{function or ''}{ASYNC_MARK}{protocol}/{','.join(order)}"


def split_function(function: str | None) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(the gather function or None, the protocol class or None ("" to find it), the order)."""
    if not function or ASYNC_MARK not in function:
        return function or None, None, ()
    gather, _, rest = function.partition(ASYNC_MARK)
    protocol, _, order = rest.partition("/")
    return gather or None, protocol, tuple(step for step in order.split(",") if step)


def load_request(target_source: str, function: str | None, copies: int) -> wire.Header:
    return {"op": LOAD, "source": target_source, "function": function or "", "copies": copies}


def read_load(header: wire.Header) -> LoadRequest:
    return LoadRequest(header["source"], header["function"], header["copies"])


def loaded_reply(*, name: str, stand_ins: Iterable[str], accepts_shard: bool, function_name: str,
                 release: dict[str, Any] | None = None, protocol: str = "",
                 async_order: Sequence[str] = (), streams: bool = False) -> wire.Header:
    """The target loaded, described in plain data (a release: `release`, ReleaseInfo's)."""
    reply: wire.Header = {"op": LOADED, "name": name, "stand_ins": list(stand_ins),
                          "accepts_shard": accepts_shard, "function_name": function_name,
                          "protocol": protocol, "async_order": list(async_order),
                          "streams": streams}
    if release is not None:
        reply["release"] = release
    return reply


def load_error_reply(message: str, kind: str = "LoadError") -> wire.Header:
    """The target did not load; `kind`: the error's class for a release's own kinds."""
    return {"op": LOAD_ERROR, "kind": kind, "message": message}


def target_info(source: str, function: str | None, header: wire.Header) -> TargetInfo:
    """The driver's TargetInfo from a worker's reply (LoadError if it is one)."""
    if operation(header) == LOAD_ERROR:
        raise _load_error(header.get("kind"))(str(header.get("message"))[:500])
    if operation(header) != LOADED:
        raise LoadError(f"{source}: the worker answered {operation(header)[:50]!r} to loading")
    fields: dict[str, Any] = dict(source=source, function=function, name=str(header["name"]),
                                  protocol=str(header.get("protocol") or ""),
                                  async_order=tuple(map(str, header.get("async_order") or ())),
                                  streams=bool(header.get("streams")),
                                  stand_ins=tuple(map(str, header["stand_ins"])),
                                  accepts_shard=bool(header["accepts_shard"]),
                                  function_name=str(header["function_name"]))
    if function == RELEASE:
        return ReleaseInfo(**fields, release=json.loads(json.dumps(header["release"])))
    return TargetInfo(**fields)


def _load_error(kind: Any) -> type[LoadError]:
    """The driver's class for a worker's load failure: a release's own kinds (one line each)."""
    return {"InterfaceDrift": InterfaceDrift, "SourceError": SourceError}.get(kind, LoadError)


# --- cases ------------------------------------------------------------------------------------

def captured(batch: Batch) -> bool:
    """Whether the step's attention runs under a CUDA-graph capture, where an asynchronous
    protocol must fall back: a graph-padded step of decodes alone, which a FULL graph captures
    whole. A step with a prefill runs its attention and cache update eagerly between graph pieces
    (piecewise or breakable capture), whatever its padding (docs/async.md)."""
    return batch.graph_size > 0 and not any(request.prefilling for request in batch.requests)


def case_request(prepared: PreparedCase | ReleaseStep, target: TargetInfo, ranks: Sequence[int]
                 ) -> wire.Message:
    """The case for the ranks a worker hosts: its inputs as bytes, nothing else (a release's
    step: the case as JSON; its ranks lay it out themselves)."""
    if target.function == RELEASE:
        return {"op": CASE, "source": target.source, "function": RELEASE, "size": prepared.size,
                "step": prepared.case.to_json(), "ranks": list(ranks)}, []
    prepared = cast(PreparedCase, prepared)  # a gather's case (the target's kind says which)
    header = {"op": CASE, "source": target.source, "function": target.function or "",
              "size": prepared.size, "shard": prepared.shard,
              "tensors": [[str(spec.torch_dtype), list(spec.trailing)] for spec in prepared.case.tensors],
              "nds": [prepared.nds[rank] for rank in ranks]}
    if (target.protocol and prepared.shard) or target.streams:  # streams judged: the per-rank
        # counts a protocol is given, and whether a graph is being captured
        header["counts"] = [[count, nd] for count, nd in zip(prepared.real_rows, prepared.nds)]
        header["capturing"] = captured(prepared.case.batch)
    blobs = [content for rank in ranks for content in prepared.input_bytes(rank)]
    return header, blobs


def cases_request(prepareds: Iterable[PreparedCase | ReleaseStep], target: TargetInfo,
                  ranks: Sequence[int] | None = None) -> wire.Message:
    """Several cases in one message (the worker runs them in order, reporting each), for
    `ranks` (None: every rank of each case)."""
    cases, counts, blobs = [], [], []
    for prepared in prepareds:
        header, more = case_request(prepared, target, range(prepared.size) if ranks is None else ranks)
        cases.append(header)
        counts.append(len(more))
        blobs += more
    return {"op": CASES, "cases": cases, "counts": counts}, blobs


@dataclass(frozen=True)
class CaseRequest:
    """One case as a worker reads it: the target it runs on (LoadRequest.key), its world size, and
    either a release's step (JSON; its ranks lay it out) or the inputs of the ranks the worker
    hosts (rank_inputs)."""

    key: tuple[str, str]
    size: int
    step: str | None
    shard: bool
    header: wire.Header
    blobs: list[bytes]


def read_cases(header: wire.Header, blobs: list[bytes]) -> list[CaseRequest]:
    """The cases of a CASES or CASE message, in order."""
    if operation(header) == CASE:
        return [_read_case(header, blobs)]
    cases, offset = [], 0
    for case, count in zip(header["cases"], header["counts"]):
        cases.append(_read_case(case, blobs[offset:offset + count]))
        offset += count
    return cases


def _read_case(header: wire.Header, blobs: list[bytes]) -> CaseRequest:
    return CaseRequest((header["source"], header["function"]), header["size"], header.get("step"),
                bool(header.get("shard")), header, blobs)


def carries_cases(header: wire.Header) -> bool:
    """A message of cases (the worker runs it next, rather than going idle first)."""
    return operation(header) in (CASES, CASE)


def rank_inputs(case: CaseRequest, slot: int, device: torch.device) -> RankInputs:
    """One hosted rank's (tensors, slot_mapping, nd, sent), fresh tensors built from the driver's
    bytes; sent: on the CPU, each input as wire.SentTensor (for encode_rank), else None."""
    header, blobs = case.header, case.blobs
    count = len(header["tensors"])
    base = slot * (count + 1)
    described = [(dtype, [len(blobs[base + k]) // max(1, _row_bytes(dtype, trailing)), *trailing])
                 for k, (dtype, trailing) in enumerate(header["tensors"])]
    described.append(("int64", [len(blobs[base + count]) // 8]))
    sent: list[wire.SentTensor] | None
    if device.type == "cpu":
        sent = [wire.SentTensor(dtype, shape, blobs[base + k])
                for k, (dtype, shape) in enumerate(described)]
        tensors = [each.tensor for each in sent]
    else:
        sent = None
        tensors = [wire.tensor_from_bytes(dtype, shape, blobs[base + k]).to(device)
                   for k, (dtype, shape) in enumerate(described)]
    return tuple(tensors[:count]), tensors[count], header["nds"][slot], sent


def _row_bytes(dtype: str, trailing: Iterable[int]) -> int:
    size = wire.dtype_by_name(dtype)[1]
    for n in trailing:
        size *= n
    return size


# --- a case's result: each rank's report --------------------------------------------------------

def result_reply(ranks: list[wire.Header], refused: str | None = None,
                 lines: dict[str, Any] | None = None) -> wire.Header:
    """One case's result: each hosted rank's report (encode_rank), its tensors in the blobs;
    `refused`: a use of a stand-in the code made, which no verdict may rest on; `lines`: a
    release's step, what it ran of the path's lines (pcpcheck.worker.release_lines): "traced"
    (whether they were recorded on it) and "run" (relpath -> the lines no earlier step of the
    worker ran)."""
    reply: wire.Header = {"op": RESULT, "ranks": ranks, "refused": refused}
    if lines is not None:
        reply["lines"] = lines
    return reply


# A release's path lines are recorded on every step while steps run new lines; after a traced
# step that ran none, on ever fewer, down to one step in LINES_MAX_GAP + 1
# (pcpcheck.worker.release_lines).
LINES_MAX_GAP = 63


@dataclass
class LinesRun:
    """A release's path lines its steps ran, as the driver merges its workers' results (each
    release step's `lines`): relpath -> line numbers, and on how many of the steps received
    they were recorded (`traced` of `steps`)."""

    run: dict[str, set[int]] = field(default_factory=dict)
    steps: int = 0
    traced: int = 0

    def add(self, header: wire.Header) -> None:
        """A RESULT message's lines, if it carries them; ValueError if they are not a flag and
        relpaths with line numbers, as a target writing to its worker's pipe could make them."""
        report = header.get("lines")
        if report is None:
            return
        run = report.get("run") if isinstance(report, dict) else None
        if not isinstance(run, dict) or type(report.get("traced")) is not bool or not all(
                isinstance(relpath, str) and isinstance(numbers, list)
                and all(type(n) is int for n in numbers) for relpath, numbers in run.items()):
            raise ValueError("a result whose lines run are not a flag, relpaths and line numbers")
        self.steps += 1
        self.traced += report["traced"]
        for relpath, numbers in run.items():
            self.run.setdefault(relpath, set()).update(numbers)


def is_result(header: wire.Header) -> bool:
    return operation(header) == RESULT


def read_result(header: wire.Header, blobs: list[bytes], hosted: int | None = None
                ) -> list[RankResult]:
    """Each rank's report of a RESULT message, decoded; LoadError if the code under check used
    a stand-in as a value (a verdict would rest on a value pcpcheck made up). ValueError if the
    message is not a result of `hosted` ranks (None: any number), as a target writing to its
    worker's pipe could make it: the backend retires that worker."""
    refused = header.get("refused")
    if refused:
        raise LoadError(f"{str(refused)[:400]}: the run stops (exit 2), no verdict")
    ranks = header.get("ranks")
    if not is_result(header) or not isinstance(ranks, list) or not all(
            isinstance(result, dict) for result in ranks):
        raise ValueError(f"a reply that is no result (op {str(header.get('op'))[:40]!r})")
    if hosted is not None and len(ranks) != hosted:
        raise ValueError(f"a result of {len(ranks)} rank(s) for the {hosted} it hosts")
    try:
        return [decode_rank(result, blobs) for result in ranks]
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"a result pcpcheck cannot read ({type(exc).__name__}: {exc})"[:300]) from None


def trace_entry(entry: Iterable[object]) -> list[object]:
    return [item if isinstance(item, (int, str)) else list(item) if isinstance(item, tuple)
            else repr(item) for item in entry]


def encode_rank(rank: int, outcome: Outcome, inputs: RankInputs, output: str, blobs: list[bytes],
                sent: list[wire.SentTensor] | None = None) -> wire.Header:
    """One rank's result (a pcpcheck.worker.runner.RankOutcome) as plain data, tensors' bytes
    appended to blobs. `inputs`: (tensors, slot_mapping, ...) the call was given; `sent`: each as
    rank_inputs built it (wire.SentTensor), else None (each is read back whole)."""
    result = _encode_call(rank, outcome.value, outcome.error, outcome.error_detail, outcome.trace,
                          inputs, output, blobs, sent)
    if outcome.streams is not None:
        result["streams"] = [list(entry) for entry in outcome.streams]
    return result


def _encode_call(rank: int, value: object, error: str | None, error_detail: str | None,
                 trace: Iterable[Iterable[object]],
                 inputs: tuple[Sequence[torch.Tensor], torch.Tensor, *tuple[object, ...]],
                 output: str, blobs: list[bytes], sent: list[wire.SentTensor] | None = None
                 ) -> wire.Header:
    result: wire.Header = {"rank": rank, "error": error, "error_detail": error_detail,
                           "trace": [trace_entry(e) for e in trace], "output": output,
                           "value": None, "input_device": str(inputs[1].device)}
    if error is None:
        try:
            result["value"] = wire.encode_value(value, blobs)
        except Exception as exc:  # noqa: BLE001 - sparse, meta, a storage that cannot be read
            result["error"] = f"returned tensors pcpcheck cannot read: {type(exc).__name__}: {exc}"[:300]
    # per input: the blob of its content after the call, None if unchanged
    after: list[int | None] = []
    for k, tensor in enumerate((*inputs[0], inputs[1])):
        try:
            content = sent[k].read_back() if sent is not None else wire.tensor_bytes(tensor)[2]
        except Exception:  # noqa: BLE001 - the call left it unreadable: not what was sent
            content = b""
        if content is None:
            after.append(None)
        else:
            blobs.append(content)
            after.append(len(blobs) - 1)
    result["inputs_after"] = after
    return result


def encode_release_rank(rank: int, outcome: Outcome, output: str, blobs: list[bytes]
                        ) -> wire.Header:
    """One rank's step of a vLLM release (`outcome.value`: rank_step's report, else what stopped
    it) as plain data: the gather call it made (its trace up to the second call), the call for
    the replicated KV group if it made one, and the STEP_FIELDS of its report."""
    step = outcome.value if isinstance(outcome.value, dict) else None
    if step is not None and step.get("inputs") is not None:
        second = step.get("group1")
        split = second["trace_from"] if second else len(outcome.trace)
        result = _encode_call(rank, step["value"], step["error"], step["error_detail"],
                              outcome.trace[:split], step["inputs"], output, blobs)
        if second:  # the replicated KV group's call: its own outputs and collectives
            result["group1"] = _encode_call(rank, second["value"], second["error"],
                                            second["error_detail"], outcome.trace[split:],
                                            second["inputs"], "", blobs)
    else:  # no call: the manager raised (in the step), or rank_step itself did
        result = {"rank": rank, "error": outcome.error, "error_detail": outcome.error_detail,
                  "trace": [trace_entry(e) for e in outcome.trace], "output": output,
                  "value": None, "inputs_after": None}
    result["step"] = None if step is None else {key: step.get(key) for key in STEP_FIELDS}
    return result


def decode_rank(result: wire.Header, blobs: list[bytes]) -> RankResult:
    """A worker's report of one rank, decoded by the driver from plain data (a release's rank:
    its step report, and its call for a replicated KV group, one level deep)."""
    rank = _decode_call(result, blobs)
    if isinstance(result.get("step"), dict):
        rank.step = result["step"]
        if isinstance(result.get("group1"), dict):
            rank.group1 = _decode_call(result["group1"], blobs)
    return rank


def _decode_call(result: wire.Header, blobs: list[bytes]) -> RankResult:
    rank = RankResult(error=_text(result.get("error")), error_detail=_text(result.get("error_detail")),
                      output=str(result.get("output") or ""), poisoned=bool(result.get("poisoned")),
                      input_device=str(result.get("input_device", "cpu"))[:40])
    seconds = result.get("seconds")
    if isinstance(seconds, (int, float)) and 0 <= seconds < 1e9:  # what a worker says is data
        rank.seconds = float(seconds)
    for entry in result.get("trace") or []:
        rank.trace.append(tuple(tuple(item) if isinstance(item, list) else item for item in entry))
    try:
        after = result["inputs_after"]  # None: a release's rank that made no call
        rank.inputs_after = None if after is None else [None if i is None else bytes(blobs[i])
                                                         for i in after]
        if rank.error is None:
            rank.value = wire.decode_value(result.get("value"), blobs)
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
        rank.error = f"returned tensors pcpcheck cannot read: {type(exc).__name__}: {exc}"[:300]
    if result.get("streams") is not None:
        rank.streams = _stream_trace(result["streams"])
        if rank.streams is None:
            rank.error = rank.error or "reported a stream trace pcpcheck cannot read"
    return rank


_STREAM_ENTRY = (str, int, str, int, str)


def _stream_trace(entries: object) -> list[tuple[Any, ...]] | None:
    """A worker's stream trace, if it is one: entries (op, stream, object, index, phase)."""
    if not isinstance(entries, list):
        return None
    trace = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != len(_STREAM_ENTRY) or not all(
                type(item) is kind for item, kind in zip(entry, _STREAM_ENTRY)):
            return None
        trace.append(tuple(entry))
    return trace


def lost_rank(reason: str, output: str = "", lost: str = "hung") -> RankResult:
    """A rank that never reported: its call did not complete; `lost`: "hung" (a rank of the
    case ran past the timeout) or "died" (a worker process of the case died)."""
    return RankResult(trace=[(INCOMPLETE, reason)], output=output, lost=lost)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


# --- lost: a torchrun supervisor's word for its rank ------------------------------------------

def lost_reply(reason: str, output: str = "", lost: str = "hung") -> wire.Header:
    return {"op": LOST, "reason": reason, "output": output, "lost": lost}


def is_lost(header: wire.Header) -> bool:
    return operation(header) == LOST


def read_lost(header: wire.Header) -> RankResult:
    """The rank a LOST reply speaks for, as the driver records a rank that never reported."""
    return lost_rank(str(header.get("reason")), str(header.get("output", "")),
                     "died" if header.get("lost") == "died" else "hung")


# --- the fork server's requests ---------------------------------------------------------------

def spawn_request(config: dict[str, Any], env: dict[str, str], cwd: str) -> wire.Header:
    """Fork a worker running `config` (its two pipe ends travel with the request)."""
    return {"op": SPAWN, "config": config, "env": env, "cwd": cwd}


def wait_request(pid: int, seconds: float) -> wire.Header:
    """A worker's exit code, once it exits within `seconds`."""
    return {"op": WAIT, "pid": pid, "seconds": seconds}


def read_fork_request(request: wire.Header) -> tuple[str, wire.Header]:
    """(SPAWN or WAIT, the request's fields)."""
    kind = operation(request)
    if kind not in (SPAWN, WAIT):
        raise ValueError(f"not a fork server request: {kind!r}")
    return kind, request
