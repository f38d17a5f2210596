"""What crosses between the driver and a worker: the target loaded, each case's inputs, and each
rank's raw outputs, as plain data (JSON headers and byte blobs, framed by pcpcheck.shared.wire).

The driver builds `load_message` and `case_message`/`batch_message` from a prepared case and
reads `target_info` and `decode_rank`; the worker reads `rank_inputs` and writes `encode_rank`.
Nothing here judges: the worker's report is data the driver decodes and judges itself.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from pcpcheck.shared import wire
from pcpcheck.shared.errors import InterfaceDrift, LoadError, SourceError
from pcpcheck_spec.names import DCP, INCOMPLETE

MAX_OUTPUT = 4000  # bytes of a rank's printing kept per case
MAX_RANKS = 8
STATUS = struct.Struct(f"<qd{MAX_RANKS}d{MAX_RANKS}b")  # running rank, since, seconds/rank, states
MAX_BATCH = 32  # cases per message at most
MAX_AHEAD = 2 * MAX_BATCH  # cases a peer may run while a rank waits in a header round (2 batches)
# Rank states in the status file (written by the worker at every switch, read by the driver).
NOT_STARTED, RUNNING, WAITING, FINISHED = 0, 1, 2, 3


# The `function` of a vLLM release (`pcpcheck vllm`): its `source` is the release's source spec as
# JSON (pcpcheck.vllm.source.Source.spec); the worker loads the release and runs
# pcpcheck.vllm.step.rank_step on every rank.
RELEASE = "<vllm release>"
# The stages of a release's PCP KV path, in order (semantics section 10): the path table names
# each real (the release's file runs it) or modeled (pcpcheck's restatement).
BATCH_ORDER, SLOT_MAPPING, MANAGER_STAGE, SPLIT, WRAPPER, GATHER_STAGE, CACHE_WRITE = STAGES = (
    "batch order", "block tables / slot mapping", "manager", "decode/prefill split", "wrapper",
    "gather", "cache write")
# What a worker sends back of a release's rank step, as plain data (tensors travel as bytes).
STEP_FIELDS = ("layout", "tokens", "slot_map", "nd", "shard", "entry", "layout_error", "kernels",
               "order", "split", "slot_map1")


@dataclass(frozen=True)
class TargetInfo:
    """What the driver knows of a target: sent back by the worker that loaded it."""

    source: str  # as given (a path, module:function, impl): what the workers load
    function: str | None  # --function as given
    name: str
    stand_ins: tuple[str, ...]
    accepts_shard: bool
    function_name: str


@dataclass(frozen=True)
class ReleaseInfo(TargetInfo):
    """A vLLM release as the worker that loaded it described it, in plain data: `release` holds
    release, source (spec), files (relpath -> sha256), adapted, caps (Capabilities' fields),
    paths (the path table: per stage, real with its file and sha256 or modeled with why)."""

    release: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseStep:
    """A case for a release: its ranks build their own inputs (their managers lay the step out)."""

    case: object  # pcpcheck.shared.case.Case

    @property
    def size(self) -> int:
        return self.case.batch.pcp_size


@dataclass
class RankResult:
    """One rank's call, as the worker reported it (or as the driver records a lost rank)."""

    error: str | None = None
    error_detail: str | None = None
    trace: list[tuple] = field(default_factory=list)
    output: str = ""
    value: object = None  # decoded by the driver: tuples, lists, wire.Received, stand-ins
    # None: unknown (the rank never reported); an input's None: as the driver sent it
    inputs_after: list[bytes | None] | None = None
    poisoned: bool = False  # its process group failed: the pool must be replaced
    input_device: str = "cpu"  # where the rank's inputs were (outputs must be there too)
    step: dict | None = None  # a release's rank: its rank_step report (layout, inputs), plain data
    seconds: float = 0.0  # how long the rank's call ran (its own running time, as timed)
    lost: str | None = None  # "hung" or "died": the rank never reported; its worker was retired
    group1: "RankResult | None" = None  # a release's rank: its call for the replicated KV group


@dataclass
class Capabilities:
    """What a vLLM release can do, read from its own code by the worker that loaded it
    (pcpcheck.vllm.release), sent to the driver as plain data."""

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
    # padding rows then reach the kernel as one dummy request (pcpcheck.vllm.inputs)
    dummy_requests: bool = False
    # the interleave sizes it accepts under DCP (its config): its default, and every size that
    # divides the block size where validate_block_size allows them (else the default alone)
    interleave_default: int = 1
    interleave_divisors: bool = True
    not_applicable: dict[str, str] = field(default_factory=dict)  # regime -> reason

    def replicated_group_call(self, regime: str) -> bool:
        """Whether a step of `regime` calls the gather a second time, for the second KV group,
        replicated under DCP (`dcp_sharded` False): the worker makes that call, the driver
        judges it by REPLICA."""
        return self.replicated_kv_group and regime == DCP


# --- driver -> worker ----------------------------------------------------------------------

def load_message(target_source: str, function: str | None, copies: int) -> dict:
    return {"op": "load", "source": target_source, "function": function or "", "copies": copies}


def case_message(prepared, target: TargetInfo, ranks) -> tuple[dict, list]:
    """The case for the ranks a worker hosts: its inputs as bytes, nothing else (a release's
    step: the case as JSON; its ranks lay it out themselves)."""
    if target.function == RELEASE:
        return {"op": "case", "source": target.source, "function": RELEASE, "size": prepared.size,
                "step": prepared.case.to_json(), "ranks": list(ranks)}, []
    header = {"op": "case", "source": target.source, "function": target.function or "",
              "size": prepared.size, "shard": prepared.shard,
              "tensors": [[str(spec.torch_dtype), list(spec.trailing)] for spec in prepared.case.tensors],
              "nds": [prepared.nds[rank] for rank in ranks]}
    blobs = [content for rank in ranks for content in prepared.input_bytes(rank)]
    return header, blobs


def batch_message(prepareds, target: TargetInfo, ranks=None) -> tuple[dict, list]:
    """Several cases in one message (the worker runs them in order, reporting each), for
    `ranks` (None: every rank of each case)."""
    cases, counts, blobs = [], [], []
    for prepared in prepareds:
        header, more = case_message(prepared, target, range(prepared.size) if ranks is None else ranks)
        cases.append(header)
        counts.append(len(more))
        blobs += more
    return {"op": "cases", "cases": cases, "counts": counts}, blobs


def rank_inputs(header: dict, blobs: list, slot: int, device):
    """One rank's (tensors, slot_mapping, nd, sent), fresh tensors built from the driver's bytes;
    sent: on the CPU, each input as wire.SentTensor (for encode_rank), else None."""
    count = len(header["tensors"])
    base = slot * (count + 1)
    described = [(dtype, [len(blobs[base + k]) // max(1, _row_bytes(dtype, trailing)), *trailing])
                 for k, (dtype, trailing) in enumerate(header["tensors"])]
    described.append(("int64", [len(blobs[base + count]) // 8]))
    if device.type == "cpu":
        sent = [wire.SentTensor(dtype, shape, blobs[base + k])
                for k, (dtype, shape) in enumerate(described)]
        tensors = [each.tensor for each in sent]
    else:
        sent = None
        tensors = [wire.tensor_from_bytes(dtype, shape, blobs[base + k]).to(device)
                   for k, (dtype, shape) in enumerate(described)]
    return tuple(tensors[:count]), tensors[count], header["nds"][slot], sent


def _row_bytes(dtype: str, trailing) -> int:
    size = wire._dtype_by_name(dtype)[1]
    for n in trailing:
        size *= n
    return size


# --- worker -> driver ----------------------------------------------------------------------

def trace_entry(entry) -> list:
    return [item if isinstance(item, (int, str)) else list(item) if isinstance(item, tuple)
            else repr(item) for item in entry]


def encode_rank(rank: int, outcome, inputs, output: str, blobs: list, sent=None) -> dict:
    """One rank's result (a pcpcheck.worker.runner.RankOutcome) as plain data, tensors' bytes
    appended to blobs. `inputs`: (tensors, slot_mapping, ...) the call was given; `sent`: each as
    rank_inputs built it (wire.SentTensor), else None (each is read back whole)."""
    result = {"rank": rank, "error": outcome.error, "error_detail": outcome.error_detail,
              "trace": [trace_entry(e) for e in outcome.trace], "output": output, "value": None,
              "input_device": str(inputs[1].device)}
    if outcome.error is None:
        try:
            result["value"] = wire.encode_value(outcome.value, blobs)
        except Exception as exc:  # noqa: BLE001 - sparse, meta, a storage that cannot be read
            result["error"] = f"returned tensors pcpcheck cannot read: {type(exc).__name__}: {exc}"[:300]
    after = []  # per input: the blob of its content after the call, None if unchanged
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


def target_info(source: str, function: str | None, header: dict) -> TargetInfo:
    """The driver's TargetInfo from a worker's reply (LoadError if it is one)."""
    if header.get("op") == "load_error":
        raise _load_error(header.get("kind"))(str(header.get("message"))[:500])
    if header.get("op") != "loaded":
        raise LoadError(f"{source}: the worker answered {str(header.get('op'))[:50]!r} to loading")
    fields = (source, function, str(header["name"]), tuple(map(str, header["stand_ins"])),
              bool(header["accepts_shard"]), str(header["function_name"]))
    if function == RELEASE:
        return ReleaseInfo(*fields, release=json.loads(json.dumps(header["release"])))
    return TargetInfo(*fields)


def _load_error(kind) -> type:
    """The driver's class for a worker's load failure: a release's own kinds (one line each)."""
    return {"InterfaceDrift": InterfaceDrift, "SourceError": SourceError}.get(kind, LoadError)


def decode_rank(result: dict, blobs: list) -> RankResult:
    """A worker's report of one rank, decoded by the driver from plain data (a release's rank:
    its step report, and its call for a replicated KV group, one level deep)."""
    rank = _decode_call(result, blobs)
    if isinstance(result.get("step"), dict):
        rank.step = result["step"]
        if isinstance(result.get("group1"), dict):
            rank.group1 = _decode_call(result["group1"], blobs)
    return rank


def _decode_call(result: dict, blobs: list) -> RankResult:
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
    return rank


def lost_rank(reason: str, output: str = "", lost: str = "hung") -> RankResult:
    """A rank that never reported: its call did not complete; `lost`: "hung" (a rank of the
    case ran past the timeout) or "died" (a worker process of the case died)."""
    return RankResult(trace=[(INCOMPLETE, reason)], output=output, lost=lost)


def _text(value) -> str | None:
    return None if value is None else str(value)
