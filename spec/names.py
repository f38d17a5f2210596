"""Names and constants shared by spec, reference, impl and pcpcheck.

This module holds vocabulary only: constants, invariant IDs and plain data types describing a
scheduler step. It holds no behaviour, so reference/ and impl/ may import it without borrowing
spec/'s logic.
"""

from __future__ import annotations

from dataclasses import dataclass

PAD_SLOT_ID = -1  # skipped by the cache-write kernel (test is `slot < 0`); slot 0 is a real slot
# The first item of a collective trace entry of a rank whose collective or call never completed
# (a trace entry is otherwise (op, dim, shape, dtype)).
INCOMPLETE = "incomplete"

# Row labels of the index-level view: a real token's label is its token id (>= 0).
NO_ROW = -(2**31)  # an output row that is no input row, or a row that is missing
# A padding row's label is -(1 + r*L + j) for row j of rank r (L rows per rank): always
# negative, distinct across ranks. Each statement computes it itself (spec.model.pad_label, ...).


# Regimes a case is drawn from (docs/semantics.md sections 2 and 5).
SHARDED = "sharded"  # D = 1, decodes dealt round-robin, gather called with shard=True
REPLICATED = "replicated"  # D = 1, decode sharding off: decodes on every rank
DCP = "dcp"  # D = P: KV cache sharded, each rank's expanded map holds only its own tokens
DRAFT = "draft"  # replicated speculative step: unexpanded map, every real row a decode
# Hazard (docs/semantics.md sections 2, 9): a multi-token draft block (q >= 2) the kernel
# classifies as prefill (decode threshold 1), so nd < real rows. Latent in vLLM 0.33.0, not live:
# opt-in.
DRAFT_MIXED = "draft-mixed"
REGIMES = (SHARDED, REPLICATED, DCP, DRAFT, DRAFT_MIXED)
HAZARD_REGIMES = (DRAFT_MIXED,)  # checked only on request; their violations are tagged hazard
DEFAULT_REGIMES = tuple(regime for regime in REGIMES if regime not in HAZARD_REGIMES)
DRAFT_DECODE_THRESHOLD = 1  # draft-mixed: a request counts as a decode iff q <= this
EXPANDED_REGIMES = (SHARDED, REPLICATED, DCP)
DRAFT_REGIMES = (DRAFT, DRAFT_MIXED)

# Gather branches (docs/semantics.md section 5).
BRANCH_UNEXPANDED = "A"
BRANCH_SHARDED = "B"
BRANCH_ALL_DECODE = "C"
BRANCH_NO_DECODE = "D"
BRANCH_MIXED = "E"

# Invariant IDs (SPEC.md states each; spec/registry.py maps each to its predicate, scope and
# regimes, in reporting priority: a case is reported under the first ID it violates).
RETURNS = "RETURNS"
REPLICA = "REPLICA"
SHARD = "SHARD"
PAIRING = "PAIRING"
LENGTH = "LENGTH"
UNIQUE = "UNIQUE"
PAD_HYGIENE = "PAD_HYGIENE"
COLLECTIVE = "COLLECTIVE"
NO_MUTATION = "NO_MUTATION"
# LAYOUT: a vLLM release's own PCP manager lays a step out as the reference does (checked by
# `pcpcheck vllm` only, which runs the manager; spec.registry scopes it).
LAYOUT = "LAYOUT"

# Asynchronous replication (bug class 16; SPEC.md "Asynchronous replication"): checked where the
# target ships a start/finish protocol (`pcpcheck check --async`), on the sharded regime's steps.
ASYNC_READ = "ASYNC_READ"  # a reader of the cache is ordered after every write it must see
ASYNC_INPUT = "ASYNC_INPUT"  # a read of an input is ordered after the input's producer
ASYNC_LIFETIME = "ASYNC_LIFETIME"  # no input is released while another stream still needs it
ASYNC_FALLBACK = "ASYNC_FALLBACK"  # start falls back where it must, and cleanly

# A stream trace (spec/streams.py): one rank's step as issued, in host order. Each entry is
# (op, stream, object, index, phase); stream HOST for what the host itself waits on.
HOST = -1
MAIN_STREAM = 0  # the model runner's current stream when the step begins
WRITE, READ = "write", "read"  # an access of (object, index) by the stream
RECORD, WAIT = "record", "wait"  # an event recorded on / waited for by the stream
SYNC = "sync"  # the host waits for a stream, an event or the device (stream HOST)
KEEP = "keep"  # Tensor.record_stream: the input's memory is kept until the stream's work is done
RELEASE = "release"  # the caller drops an input: its memory may be reused by the stream
STARTED = "started"  # start's answer (index 1: it started, 0: it fell back), stream MAIN_STREAM
CAPTURING = "capturing"  # index 1: a CUDA graph is being captured (start must fall back)
SLOT, INPUT, READER, EVENT, STREAM, DEVICE = "slot", "input", "reader", "event", "stream", "device"
FLAG = "flag"  # the object of a STARTED or CAPTURING entry (stream HOST)
# What the caller does (`--async-order`): the model runner's default order, and the steps
# it may take. READER_ATTENTION and READER_NEXT index the two readers of a step.
ORDER_START, ORDER_ATTENTION, ORDER_RELEASE = "start", "attention", "release"
ORDER_FINISH, ORDER_FINISH_NO_WAIT, ORDER_READER = "finish", "finish-nowait", "reader"
ASYNC_ORDER = (ORDER_START, ORDER_ATTENTION, ORDER_RELEASE, ORDER_FINISH, ORDER_READER)
ASYNC_STEPS = (*ASYNC_ORDER, ORDER_FINISH_NO_WAIT)
READER_ATTENTION, READER_NEXT = 0, 1

# Precondition IDs: what makes a step well formed (a case violating one is not drawn).
# WF_SLOTS: every real token has a distinct non-negative slot, owned by one DCP rank (dcp: the
# interleave divides the block size).
WF_SLOTS = "WF_SLOTS"
WF_LAYOUT = "WF_LAYOUT"  # per-rank rows follow the manager's layout: decodes first, W rows each
WF_WIDTH = "WF_WIDTH"  # graph size 0 or >= max_r n_r; tensors' row count L equals the stride W
PRECONDITIONS = (WF_SLOTS, WF_LAYOUT, WF_WIDTH)


@dataclass(frozen=True)
class Request:
    """One request of a scheduler step, in global batch order."""

    num_tokens: int  # q: tokens scheduled this step (0 allowed: the request has no rows)
    prefilling: bool  # False: a decode (q >= 1, 1 + speculative tokens)
    context_len: int = 0  # tokens already in the cache; this step's positions start here
    blocks: tuple[int, ...] = ()  # block table: physical block per virtual block of B*D positions


@dataclass(frozen=True)
class Batch:
    """A scheduler step as the PCP manager sees it.

    Token ids: the global token index in batch order (request order, then position), 0..N-1.
    Every rank of a case sees the same Batch; D = P in the dcp regime, else 1 (each statement
    derives D and the shard flag from the regime itself).
    """

    regime: str
    pcp_size: int  # P >= 2
    requests: tuple[Request, ...]
    block_size: int = 16  # B
    interleave: int = 1  # I, cp_kv_cache_interleave_size (dcp only)
    graph_size: int = 0  # CUDA-graph batch size per rank; 0: none (W = max_r n_r)
    dp_pad: int = 0  # draft regimes: tensor rows past the real count (data-parallel padding)
    pad_slot_map: bool = False  # draft regimes: unexpanded map padded with -1 to the row count
    num_decode_tokens: int | None = None  # draft-mixed: the kernel's nd (< real count); else derived
