"""Drawing cases, and checking one given from outside.

One builder (`_build`) makes a well-formed case (pcpcheck.shared.case.Case) from a sequence of
choices; hypothesis (`cases`, the strategy) and a seeded random.Random (`draw_case`) feed it.
`parse_case` reads a case given from outside (--replay, a reproducer) and checks the spec's
preconditions on it.
"""

from __future__ import annotations

import functools
import random

from hypothesis import strategies as st

import pcpcheck_reference as reference
from pcpcheck.shared.case import DTYPES, Case, TensorSpec
from pcpcheck.shared.defaults import DEFAULT_MAX_RANKS, MAX_RANKS, MIN_RANKS
from pcpcheck_spec import model
from pcpcheck_spec.names import (
    DCP,
    DRAFT_DECODE_THRESHOLD,
    DRAFT_MIXED,
    DRAFT_REGIMES,
    REGIMES,
    Batch,
    Request,
)

# Trailing shapes as the callers pass them: MLA's latent (R,) and k_pe (1, R) flattened, the
# indexer's (H,). Each row must have >= 4 bytes to carry its label.
TRAILING_SHAPES = ((4,), (8,), (2, 4), (1, 16), (3, 2, 2))


# One draw per tensor (drawing is the search's bottleneck): every trailing shape x dtype.
TENSOR_SPECS = tuple(TensorSpec(shape, dtype) for shape in TRAILING_SHAPES for dtype in sorted(DTYPES))


# --- validation: the spec's preconditions on a case given from outside (--replay) ------------
MAX_TENSORS = 8
MAX_ROW_BYTES = 1 << 16


def _whole(value, name: str, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low \
            or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name} must be a whole number {bound}, got {value!r}")


def parse_case(text: str) -> Case:
    """The case a JSON text describes; ValueError (one line naming the field) for malformed
    JSON or a case outside the spec's preconditions (`validate_case`)."""
    case = Case.from_json(text)
    validate_case(case)
    return case


def validate_case(case: Case) -> None:
    """Raise ValueError (one line) unless `case` is well formed: what `cases` draws by
    construction (SPEC.md, WF_SLOTS, WF_LAYOUT, WF_WIDTH), for a case given from outside."""
    batch = case.batch
    if batch.regime not in REGIMES:
        raise ValueError(f"unknown regime {batch.regime!r} (one of {', '.join(REGIMES)})")
    _whole(batch.pcp_size, "pcp_size", MIN_RANKS, MAX_RANKS)
    _whole(batch.block_size, "block_size", 1)
    _whole(batch.interleave, "interleave", 1)
    _whole(batch.graph_size, "graph_size", 0)
    _whole(batch.dp_pad, "dp_pad", 0)
    if not isinstance(batch.pad_slot_map, bool):
        raise ValueError(f"pad_slot_map must be true or false, got {batch.pad_slot_map!r}")
    if batch.regime != DCP and batch.interleave != 1:
        raise ValueError(f"interleave {batch.interleave} applies to the dcp regime only")
    if batch.regime not in DRAFT_REGIMES and (batch.dp_pad or batch.pad_slot_map):
        raise ValueError("dp_pad and pad_slot_map apply to the draft regimes only")
    seen: dict[int, int] = {}
    for index, request in enumerate(batch.requests):
        _whole(request.num_tokens, f"request {index}: num_tokens", 0)
        _whole(request.context_len, f"request {index}: context_len", 0)
        if not isinstance(request.prefilling, bool):
            raise ValueError(f"request {index}: prefilling must be true or false")
        for block in request.blocks:
            _whole(block, f"request {index}: block", 0)
            if block in seen:  # WF_SLOTS: two tokens would share a slot
                raise ValueError(f"WF_SLOTS: block {block} is in request {seen[block]} and in "
                                 f"request {index} (a block belongs to one request)")
            seen[block] = index
    real = sum(r.num_tokens for r in batch.requests)
    if batch.regime == DRAFT_MIXED:
        if not isinstance(batch.num_decode_tokens, int) or isinstance(batch.num_decode_tokens, bool) \
                or not 0 <= batch.num_decode_tokens < real:
            raise ValueError(f"WF_LAYOUT: draft-mixed needs num_decode_tokens between 0 and "
                             f"{real - 1} (the real rows, less one), got {batch.num_decode_tokens!r}")
    elif batch.num_decode_tokens is not None:
        raise ValueError(f"num_decode_tokens is given by the layout in {batch.regime}; got "
                         f"{batch.num_decode_tokens!r}, expected null")
    if not 1 <= len(case.tensors) <= MAX_TENSORS:
        raise ValueError(f"tensors must hold 1 to {MAX_TENSORS} tensors, got {len(case.tensors)}")
    for k, spec in enumerate(case.tensors):
        if not isinstance(spec.dtype, str) or spec.dtype not in DTYPES:
            raise ValueError(f"tensor {k}: unknown dtype {spec.dtype!r} (one of {', '.join(DTYPES)})")
        for size in spec.trailing:
            _whole(size, f"tensor {k}: trailing size", 1)
        if not 4 <= spec.row_bytes <= MAX_ROW_BYTES:
            raise ValueError(f"tensor {k}: a row of {spec.row_bytes} bytes; a row carries its "
                             f"label in 4 bytes, at most {MAX_ROW_BYTES}")
    try:
        model.layout(batch)  # WF_SLOTS (a block for every position), WF_LAYOUT, WF_WIDTH
    except ValueError as exc:
        raise ValueError(str(exc)) from None


# --- drawing cases ----------------------------------------------------------------------------
# One builder (`_build`) states how a case is made from a sequence of choices (bounded integers
# and booleans). Two choosers feed it: hypothesis (`cases`, the strategy: shrinking and property
# tests) and a seeded random.Random (`draw_case`, the search's fast generation, 10-20x cheaper
# per case than a hypothesis example). Both make the same choices in the same order, so the
# choices a fast-drawn case records replay through `cases` as the same case: hypothesis shrinks
# a case the fast generator found (pcpcheck.search.engine).
_BLOCK_SIZES = (1, 2, 4, 16)
_INTERLEAVES = (1, 2)
MAX_REQUESTS = 6
MAX_TENSORS_DRAWN = 3


class RandomChooser:
    """Choices from a seeded random.Random, recorded in order (hypothesis replays them).
    An integer is uniform except that either bound comes 1 time in 16, as hypothesis favours
    boundary values."""

    def __init__(self, rng: random.Random) -> None:
        self.choices: list = []
        self._random = rng.random
        # randint(low, high) is low + _randbelow(high - low + 1): the same draws, one call
        self._below = rng._randbelow  # type: ignore[attr-defined]

    def integer(self, low: int, high: int) -> int:
        roll = self._random()
        value = low if roll < 0.0625 else high if roll < 0.125 else low + self._below(high - low + 1)
        self.choices.append(value)
        return value

    def boolean(self) -> bool:
        value = self._random() < 0.5
        self.choices.append(value)
        return value

    def group(self, build, *args):
        return build(self, *args)


class _HypothesisChooser:
    """The same choices drawn by hypothesis; each group is a span its shrinker can delete or
    move as a whole."""

    def __init__(self, draw):
        self.draw = draw

    def integer(self, low: int, high: int) -> int:
        return self.draw(_ints(low, high))

    def boolean(self) -> bool:
        return self.draw(_BOOLS)

    def group(self, build, *args):
        return self.draw(_group(build, args))


_BOOLS = st.booleans()
_ints = functools.lru_cache(maxsize=None)(st.integers)  # built once: building costs a draw


@st.composite
def _group(draw, build, args):
    return build(_HypothesisChooser(draw), *args)


def _pick(choose, options):
    return options[choose.integer(0, len(options) - 1)] if len(options) > 1 else options[0]


def _more(choose, count: int, low: int, high: int) -> bool:
    """Whether a list of `count` items (low..high of them) gets another: 3 times in 4, as
    hypothesis' lists of this size; shrinking the choice to 0 ends the list there."""
    return count < high and (count < low or choose.integer(0, 3) != 0)


def _request(choose, regime: str, pcp_size: int, block_span: int) -> tuple[int, bool, int]:
    """(q, prefilling, context) of one request; its blocks are assigned once all are drawn."""
    if regime in DRAFT_REGIMES:
        # draft: decodes of 1 + speculative tokens; draft-mixed: draft blocks, some of q >= 2
        prefilling, num_tokens = False, choose.integer(1, 3)
    else:
        prefilling = choose.boolean()
        # q = 0: scheduled nothing this step; decodes carry 1 + speculative tokens.
        num_tokens = choose.integer(0, 4 * pcp_size + 3 if prefilling else 3)
    return num_tokens, prefilling, choose.integer(0, 2 * block_span)


def _requests(choose, regime: str, pcp_size: int, block_size: int, dcp_size: int):
    block_span = block_size * dcp_size
    drawn: list[tuple[int, bool, int]] = []
    # A list, not a drawn count: the shrinker deletes whole requests (no leftover empty request).
    while _more(choose, len(drawn), 1 if regime == DRAFT_MIXED else 0, MAX_REQUESTS):
        drawn.append(choose.group(_request, regime, pcp_size, block_span))
    if regime == DRAFT_MIXED and max(q for q, _, _ in drawn) <= DRAFT_DECODE_THRESHOLD:
        # the hazard needs a multi-token draft block the kernel classifies as prefill
        drawn[-1] = (DRAFT_DECODE_THRESHOLD + 1, *drawn[-1][1:])
    next_block = choose.integer(0, 3)
    requests = []
    for num_tokens, prefilling, context_len in drawn:
        num_blocks = -(-(context_len + num_tokens) // block_span)
        requests.append(Request(num_tokens, prefilling, context_len,
                                tuple(range(next_block, next_block + num_blocks))))
        next_block += num_blocks
    if choose.boolean():  # blocks in reverse order
        top = next_block - 1
        requests = [Request(r.num_tokens, r.prefilling, r.context_len,
                            tuple(top - b for b in r.blocks)) for r in requests]
    return tuple(requests)


def kernel_decode_tokens(requests) -> int:
    """The attention kernel's nd for a draft step: the leading rows of requests whose query
    length is within the decode threshold (a multi-token block from there on counts as prefill)."""
    nd = 0
    for request in requests:
        if request.num_tokens > DRAFT_DECODE_THRESHOLD:
            break
        nd += request.num_tokens
    return nd


def _build(choose, regimes, max_ranks: int, pcp_sizes) -> Case:
    """A well-formed case from `choose`'s choices: every precondition of SPEC.md (WF_*) holds by
    construction."""
    regime = _pick(choose, tuple(regimes))
    pcp_size = _pick(choose, tuple(pcp_sizes)) if pcp_sizes else choose.integer(2, max_ranks)
    dcp_size = pcp_size if regime == DCP else 1
    block_size = _pick(choose, _BLOCK_SIZES)
    interleave = _pick(choose, _INTERLEAVES) if regime == DCP else 1
    if regime == DCP and block_size % interleave:
        interleave = 1
    requests = choose.group(_requests, regime, pcp_size, block_size, dcp_size)
    batch = Batch(regime, pcp_size, requests, block_size, interleave)
    if regime in DRAFT_REGIMES:
        nd = kernel_decode_tokens(requests) if regime == DRAFT_MIXED else None
        batch = Batch(regime, pcp_size, requests, block_size, interleave, dp_pad=choose.integer(0, 3),
                      pad_slot_map=choose.boolean(), num_decode_tokens=nd)
    elif choose.boolean():  # graph padding: a few rows past the widest rank
        widest = max(reference.rank_counts(batch), default=0)
        batch = Batch(regime, pcp_size, requests, block_size, interleave,
                      graph_size=widest + choose.integer(1, 3))
    specs: list[TensorSpec] = []
    while _more(choose, len(specs), 1, MAX_TENSORS_DRAWN):
        specs.append(_pick(choose, TENSOR_SPECS))
    return Case(batch, tuple(specs))


@st.composite
def cases(draw, regimes=REGIMES, max_ranks: int = DEFAULT_MAX_RANKS, pcp_sizes=None) -> Case:
    """Well-formed cases, drawn by hypothesis. `pcp_sizes`: the world sizes P may take (a
    process backend's pools); default 2..max_ranks."""
    return _build(_HypothesisChooser(draw), regimes, max_ranks, pcp_sizes)


def draw_case(rng, regimes=REGIMES, max_ranks: int = DEFAULT_MAX_RANKS, pcp_sizes=None
              ) -> tuple[Case, list]:
    """A case `cases` could draw, from the random.Random `rng`, and the choices that make it
    (hypothesis.database.choices_to_bytes of them replays it through `cases`)."""
    choose = RandomChooser(rng)
    return _build(choose, regimes, max_ranks, pcp_sizes), choose.choices
