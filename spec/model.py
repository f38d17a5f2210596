"""Index-level model of the PCP token layout, the gather and the cache-write kernel.

Pure Python (ints, lists, loops) so CrossHair can execute it symbolically. Rows are labels: a
real token's id (its global index in batch order, >= 0) or a negative label for a padding row
(`pad_label`); a row the kernel reads past the end of the rows is `NO_ROW`.

Sections refer to docs/semantics.md (section N); SPEC.md states the invariants.
"""

from __future__ import annotations

from dataclasses import dataclass

from .names import (
    BRANCH_ALL_DECODE,
    BRANCH_MIXED,
    BRANCH_NO_DECODE,
    BRANCH_SHARDED,
    BRANCH_UNEXPANDED,
    DCP,
    DRAFT,
    DRAFT_REGIMES,
    EXPANDED_REGIMES,
    NO_ROW,
    PAD_SLOT_ID,
    SHARDED,
    Batch,
)


@dataclass(frozen=True)
class SpecLayout:
    """Per-rank inputs of the gather for one step (same fields as reference.Layout, as lists)."""

    width: int  # W (expanded regimes) or L (draft regimes)
    num_rows: int  # L: rows of every rank's tensors
    counts: list[int]  # real rows per rank
    gidx: list[int] | None  # P*W global token index per rank-major row (padding: 0); drafts: None
    wmask: list[bool] | None  # P*W write mask; drafts: None
    tokens: list[list[int]]  # per rank, L row labels
    slot_maps: list[list[int]]  # per rank, the slot mapping handed to the gather
    num_decode_tokens: list[int]  # per rank, nd handed to the gather
    shard: bool  # shard_decode_requests


def dcp_size(batch: Batch) -> int:
    """D: the KV cache is sharded over the P ranks in the dcp regime, else replicated (D = 1)."""
    return batch.pcp_size if batch.regime == DCP else 1


def shard_decode_requests(batch: Batch) -> bool:
    """The gather's flag: decodes are dealt round-robin only in the sharded regime."""
    return batch.regime == SHARDED


def pad_label(rank: int, row: int, num_rows: int) -> int:
    """Label of padding row `row` of rank `rank` (num_rows rows per rank): always negative."""
    return -(1 + rank * num_rows + row)


# ---------------------------------------------------------------------------------------------
# Section 3: global slot mapping


def token_slot(batch: Batch, request_index: int, position: int, dcp_rank: int) -> int:
    """Slot of one token (sequence position `position` of a request) on DCP rank `dcp_rank`,
    PAD_SLOT_ID when another DCP rank owns it."""
    ranks = dcp_size(batch)
    block_size = batch.block_size
    interleave = batch.interleave if ranks > 1 else 1
    virtual_block = position // (block_size * ranks)
    offset = position % (block_size * ranks)
    if (offset // interleave) % ranks != dcp_rank:
        return PAD_SLOT_ID
    local = (offset // (interleave * ranks)) * interleave + offset % interleave
    if local >= block_size:  # interleave not dividing the block size: slots would collide
        raise ValueError(f"WF_SLOTS: interleave {interleave} does not divide block size {block_size}")
    blocks = batch.requests[request_index].blocks
    if virtual_block >= len(blocks):
        raise ValueError(f"WF_SLOTS: request {request_index} has no block for position {position}")
    return blocks[virtual_block] * block_size + local


def global_slots(batch: Batch, dcp_rank: int) -> list[int]:
    """Slot of every token in global order (length N); -1 where dcp_rank does not own it."""
    slots: list[int] = []
    for index, request in enumerate(batch.requests):
        for i in range(request.num_tokens):
            slots.append(token_slot(batch, index, request.context_len + i, dcp_rank))
    return slots


# ---------------------------------------------------------------------------------------------
# Section 2: layout


def is_replicated(batch: Batch, num_tokens: int, prefilling: bool) -> bool:
    """Decodes always; under DCP also prefills too short to fill all 2P chunks (#56157)."""
    if not prefilling:
        return True
    if dcp_size(batch) <= 1:
        return False
    chunks = 2 * batch.pcp_size
    chunk_len = -(-num_tokens // chunks)
    return (chunks - 1) * chunk_len >= num_tokens


def split_positions(num_tokens: int, pcp_size: int, rank: int) -> list[int]:
    """Query positions rank `rank` gets of a split prefill: head chunk r, then tail chunk 2P-1-r
    (DualChunkSwap, no padding: empty chunks contribute nothing)."""
    chunks = 2 * pcp_size
    chunk_len = -(-num_tokens // chunks)
    positions: list[int] = []
    for chunk in (rank, chunks - 1 - rank):
        start = chunk * chunk_len
        end = min(start + chunk_len, num_tokens)
        positions.extend(range(start, end))
    return positions


def rank_rows(batch: Batch) -> tuple[list[list[int]], list[list[bool]], list[int]]:
    """Per rank: the global token ids of its real rows in row order, per row whether the row
    must be written (the write mask before padding), and its count of decode rows (nd)."""
    pcp_size = batch.pcp_size
    sharding = batch.regime == SHARDED
    rows: list[list[int]] = [[] for _ in range(pcp_size)]
    writes: list[list[bool]] = [[] for _ in range(pcp_size)]
    decode_counts = [0] * pcp_size
    # Row order is (is_prefilling, request index, chunk start): two passes over the requests.
    for prefill_pass in (False, True):
        if prefill_pass:
            decode_counts = [len(rank_tokens) for rank_tokens in rows]
        first_token = 0
        ordinal = 0  # counts replicated requests with q > 0 (round-robin owners, not sticky)
        for request in batch.requests:
            q = request.num_tokens
            replicated = is_replicated(batch, q, request.prefilling)
            if request.prefilling == prefill_pass and q > 0:
                for rank in range(pcp_size):
                    if not replicated:
                        positions = split_positions(q, pcp_size, rank)
                        masked = True
                    elif sharding:
                        positions = list(range(q)) if ordinal % pcp_size == rank else []
                        masked = True
                    else:
                        positions = list(range(q))
                        masked = rank == 0  # rank 0 is the canonical writer of replicated rows
                    for position in positions:
                        rows[rank].append(first_token + position)
                        writes[rank].append(masked)
            if replicated and q > 0:
                ordinal += 1
            first_token += q
    return rows, writes, decode_counts


def draft_layout(batch: Batch) -> SpecLayout:
    """Replicated speculative step: every rank holds the global batch, unexpanded slot map."""
    if any(request.prefilling for request in batch.requests):
        raise ValueError("WF_LAYOUT: draft regimes hold decodes only")
    pcp_size = batch.pcp_size
    num_tokens = sum(request.num_tokens for request in batch.requests)
    num_rows = num_tokens + batch.dp_pad
    nd: int | None  # draft-mixed: the batch's, None refused below
    if batch.regime == DRAFT:
        nd = num_tokens
    else:
        nd = batch.num_decode_tokens
        if nd is None or not 0 <= nd <= num_rows:
            raise ValueError(f"WF_LAYOUT: draft-mixed needs 0 <= num_decode_tokens <= L, got {nd}")
    slot_map = global_slots(batch, 0)
    if batch.pad_slot_map:
        slot_map = slot_map + [PAD_SLOT_ID] * batch.dp_pad
    tokens = []
    for rank in range(pcp_size):
        pads = [pad_label(rank, j, num_rows) for j in range(num_tokens, num_rows)]
        tokens.append(list(range(num_tokens)) + pads)
    return SpecLayout(
        width=num_rows,
        num_rows=num_rows,
        counts=[num_tokens] * pcp_size,
        gidx=None,
        wmask=None,
        tokens=tokens,
        slot_maps=[list(slot_map) for _ in range(pcp_size)],
        num_decode_tokens=[nd] * pcp_size,
        shard=False,
    )


def layout(batch: Batch) -> SpecLayout:
    """The PCP manager's per-rank tensors, expanded slot maps and gather arguments (section 2)."""
    if batch.regime in DRAFT_REGIMES:
        return draft_layout(batch)
    if batch.regime not in EXPANDED_REGIMES:
        raise ValueError(f"unknown regime {batch.regime!r}")
    pcp_size = batch.pcp_size
    rows, writes, nds = rank_rows(batch)
    counts = [len(rank_tokens) for rank_tokens in rows]
    widest = max(counts)
    if 0 < batch.graph_size < widest:
        raise ValueError(f"WF_WIDTH: graph size {batch.graph_size} below max_r n_r = {widest}")
    width = max(widest, batch.graph_size)
    gidx: list[int] = []
    wmask: list[bool] = []
    tokens: list[list[int]] = []
    for rank in range(pcp_size):
        padding = width - counts[rank]
        gidx.extend(rows[rank] + [0] * padding)
        wmask.extend(writes[rank] + [False] * padding)
        pads = [pad_label(rank, j, width) for j in range(counts[rank], width)]
        tokens.append(rows[rank] + pads)
    # Each rank expands the global map its own DCP rank computes (D = 1: all use DCP rank 0).
    slot_maps = []
    for rank in range(pcp_size):
        slots = global_slots(batch, rank if dcp_size(batch) > 1 else 0)
        slot_maps.append([slots[g] if m else PAD_SLOT_ID for g, m in zip(gidx, wmask)])
    return SpecLayout(
        width=width,
        num_rows=width,
        counts=counts,
        gidx=gidx,
        wmask=wmask,
        tokens=tokens,
        slot_maps=slot_maps,
        num_decode_tokens=nds,
        shard=shard_decode_requests(batch),
    )


# ---------------------------------------------------------------------------------------------
# Section 5: the gather, at label level


def branch(num_rows: int, num_slots: int, nd: int, shard: bool) -> str:
    """Branch letter of one rank's call, in the table's order."""
    if num_slots <= num_rows:
        return BRANCH_UNEXPANDED
    if shard:
        return BRANCH_SHARDED
    if nd == num_rows:
        return BRANCH_ALL_DECODE
    if nd == 0:
        return BRANCH_NO_DECODE
    return BRANCH_MIXED


def contribution(rows: list[int], num_slots: int, nd: int, shard: bool) -> list[int] | None:
    """What one rank passes to the all_gather (None: its branch issues no collective)."""
    letter = branch(len(rows), num_slots, nd, shard)
    if letter in (BRANCH_SHARDED, BRANCH_NO_DECODE):
        return rows
    if letter == BRANCH_MIXED:
        return rows[nd:]
    return None


def all_gather(contributions: list[list[int] | None], rank: int) -> list[int]:
    """Rank-major concatenation; every rank must join with an equal shape (else a real run
    hangs or raises: the model raises ValueError)."""
    mine = contributions[rank]
    for peer in contributions:
        if peer is None or mine is None or len(peer) != len(mine):
            raise ValueError("COLLECTIVE: ranks disagree on the all_gather")
    gathered: list[int] = []
    for peer in contributions:
        gathered.extend(peer)  # type: ignore[arg-type]  # the loop above raised on a None
    return gathered


def gather_rank(
    rank: int, rows: list[list[int]], slot_maps: list[list[int]], nds: list[int], shard: bool
) -> tuple[list[int], list[int]]:
    """One rank's (rows out, slots out)."""
    local = rows[rank]
    slots = slot_maps[rank]
    num_rows = len(local)
    nd = nds[rank]
    letter = branch(num_rows, len(slots), nd, shard)
    if letter == BRANCH_UNEXPANDED:
        # Spec's answer: every real row of an unexpanded map is written (upstream: [:nd]).
        return local[: len(slots)], slots[: len(slots)]
    if letter == BRANCH_ALL_DECODE:
        return list(local), slots[:num_rows]  # rank 0's block: the canonical replicated slots
    contributions = [
        contribution(rows[q], len(slot_maps[q]), nds[q], shard) for q in range(len(rows))
    ]
    gathered = all_gather(contributions, rank)
    pcp_size = len(rows)
    if letter in (BRANCH_SHARDED, BRANCH_NO_DECODE):
        return gathered, slots[: pcp_size * num_rows]
    # Mixed: local decode rows with rank 0's decode slots, then every rank's non-decode rows.
    out_slots = slots[:nd]
    for q in range(pcp_size):
        out_slots = out_slots + slots[q * num_rows + nd : (q + 1) * num_rows]
    return local[:nd] + gathered, out_slots


def gather(
    rows: list[list[int]], slot_maps: list[list[int]], nds: list[int], shard: bool
) -> list[tuple[list[int], list[int]]]:
    """Every rank's gather output (rows as labels, slots), for one tensor per rank."""
    return [gather_rank(rank, rows, slot_maps, nds, shard) for rank in range(len(rows))]


def collective_trace(
    num_rows: int, num_slots: int, nd: int, shard: bool
) -> list[tuple[str, int]]:
    """The collectives one rank issues per tensor: ("all_gather", rows sent), or none."""
    letter = branch(num_rows, num_slots, nd, shard)
    if letter in (BRANCH_SHARDED, BRANCH_NO_DECODE):
        return [("all_gather", num_rows)]
    if letter == BRANCH_MIXED:
        return [("all_gather", num_rows - nd)]
    return []


# ---------------------------------------------------------------------------------------------
# Section 4: the cache-write kernel, and the caches the step must leave


def write(rows: list[int], slots: list[int]) -> dict[int, int]:
    """Kernel rule: row k goes to slots[k]; negative slots skipped; a row past the end of the
    rows (an out-of-bounds read) writes NO_ROW. A slot written twice keeps the last write."""
    cache: dict[int, int] = {}
    for k, slot in enumerate(slots):
        if slot < 0:
            continue
        cache[slot] = rows[k] if k < len(rows) else NO_ROW
    return cache


def expected_caches(batch: Batch) -> list[dict[int, int]]:
    """Per rank, slot -> token after the step: D = 1 every rank holds every real token (a full
    replica); D > 1 rank r holds exactly the tokens its DCP rank owns."""
    caches = []
    for rank in range(batch.pcp_size):
        dcp_rank = rank if dcp_size(batch) > 1 else 0
        slots = global_slots(batch, dcp_rank)
        caches.append({slot: token for token, slot in enumerate(slots) if slot >= 0})
    return caches
