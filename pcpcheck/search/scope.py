"""Bounded exhaustive checking: every well-formed step within a stated scope, each once, in
order of size (`pcpcheck check --exhaustive`).

A Scope bounds the world sizes P, the requests of a step, the tokens and cached context of each,
the block sizes, the interleaves (dcp), the graph padding (rows past the widest rank) and the DP
padding (draft rows past the real count). `steps(scope, regime)` yields the steps as Cases in
order of size: P, then the number of requests, the tokens, the context, then block size,
interleave and padding, so the first violating step met is a smallest one (reduce.size's order).
Every case carries one float32 (4,) tensor: row content, dtype and shape are not the layout's.

Symmetries, each step enumerated once per class (spec/SPEC.md, "Bounded exhaustive checking"):
- physical block ids: a step's blocks are 0, 1, 2, ... in request order (canonical block ids);
- a draft map "padded with -1 to the rows" when there is no padding row is the unpadded map,
  so pad_slot_map is enumerated only with dp_pad > 0.
The request order is never one: it is the batch order, part of the layout.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from dataclasses import dataclass

import pcpcheck_reference as reference
from pcpcheck.search.draw import kernel_decode_tokens
from pcpcheck.shared.case import Case, TensorSpec
from pcpcheck_spec.names import (
    DCP,
    DRAFT_DECODE_THRESHOLD,
    DRAFT_MIXED,
    DRAFT_REGIMES,
    Batch,
    Request,
)

TENSORS = (TensorSpec((4,), "float32"),)


@dataclass(frozen=True, kw_only=True)
class Scope:
    pcp_sizes: tuple[int, ...] = (2, 3, 4)
    max_requests: int = 3
    max_tokens: int = 3  # per request
    max_context: int = 1  # cached tokens before a request's first position
    block_sizes: tuple[int, ...] = (1, 2, 4)
    interleaves: tuple[int, ...] = (1, 2)  # dcp only, where the interleave divides the block size
    max_graph_pad: int = 1  # expanded regimes: graph size = widest rank + 1..this (0: none)
    max_dp_pad: int = 1  # draft regimes: rows past the real count

    def describe(self) -> str:
        """The scope as a report states it."""
        ranks = _span(self.pcp_sizes)
        return (f"P {ranks}, <= {self.max_requests} requests of <= {self.max_tokens} tokens, "
                f"context <= {self.max_context}, block sizes {_list(self.block_sizes)}, "
                f"interleave {_list(self.interleaves)}, graph padding <= {self.max_graph_pad}, "
                f"DP padding <= {self.max_dp_pad}, one float32 (4,) tensor")


    def spec(self) -> str:
        """The scope as --scope takes it (parse_scope reads it back)."""
        return ",".join(f"{key}=" + ("/".join(map(str, value)) if kind == "set" else str(value))
                        for key, (name, kind) in _KEYS.items()
                        for value in (getattr(self, name),))


# `check --exhaustive`'s default: 3 requests of up to 4 tokens (a head/tail split needs 4), block
# size 2 (a request within a block and across blocks), 130,545 steps in the four default regimes,
# about a minute on 2 cores for impl (benchmarks/README.md); every zoo bug's minimal case is in it.
DEFAULT_SCOPE = Scope(max_requests=3, max_tokens=4, block_sizes=(2,))
# `vllm --exhaustive`'s: a release's step runs its manager and kernels, ~10x a gather's cost.
RELEASE_DEFAULT_SCOPE = Scope(max_requests=2, max_tokens=4, block_sizes=(1, 2))


def _span(values) -> str:
    values = sorted(values)
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}..{values[-1]}"
    return _list(values)


def _list(values) -> str:
    return ", ".join(map(str, sorted(values)))


# --scope's keys: name -> (field, kind); kind "range" takes A..B or A/B/C, "int" a whole number
_KEYS = {"ranks": ("pcp_sizes", "set"), "requests": ("max_requests", "int"),
         "tokens": ("max_tokens", "int"), "context": ("max_context", "int"),
         "block-sizes": ("block_sizes", "set"), "interleaves": ("interleaves", "set"),
         "graph": ("max_graph_pad", "int"), "dp": ("max_dp_pad", "int")}
_LIMITS = {"pcp_sizes": (2, 8), "max_requests": (0, 6), "max_tokens": (1, 16),
           "max_context": (0, 16), "block_sizes": (1, 16), "interleaves": (1, 4),
           "max_graph_pad": (0, 4), "max_dp_pad": (0, 4)}


def parse_scope(text: str, base: Scope = DEFAULT_SCOPE) -> Scope:
    """A scope from `KEY=VALUE,...` (keys: ranks, requests, tokens, context, block-sizes,
    interleaves, graph, dp; a set as A..B or A/B/C); unnamed keys keep `base`'s.
    ValueError (one line naming the key) otherwise."""
    values = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key not in _KEYS or not value:
            raise ValueError(f"scope: {part!r} is not KEY=VALUE with KEY one of {', '.join(_KEYS)}")
        name, kind = _KEYS[key]
        low, high = _LIMITS[name]
        parsed: int | tuple[int, ...]
        numbers: tuple[int, ...]
        try:
            if kind == "int":
                parsed = int(value)
                numbers = (parsed,)
            elif re.fullmatch(r"\d+\.\.\d+", value):
                first, last = map(int, value.split(".."))
                parsed = numbers = tuple(range(first, last + 1))
            else:
                parsed = numbers = tuple(sorted({int(v) for v in value.split("/")}))
        except ValueError:
            raise ValueError(f"scope: {key}={value!r} is not a whole number, A..B or A/B/C") from None
        if not numbers or not all(low <= n <= high for n in numbers):
            raise ValueError(f"scope: {key} must be between {low} and {high}, got {value!r}")
        values[name] = parsed
    return Scope(**{**base.__dict__, **values})


def _request_kinds(scope: Scope, regime: str) -> list[tuple[int, bool, int]]:
    """Every (tokens, prefilling, context) one request of the regime may have: decodes and
    prefills of 1..max_tokens with each context (drafts: decodes only), and in expanded regimes
    a request that schedules nothing, as one kind (no rows, no block: its flag and context are
    seen nowhere)."""
    contexts = range(scope.max_context + 1)
    tokens = range(1, scope.max_tokens + 1)
    kinds = [(q, False, c) for q in tokens for c in contexts]
    if regime not in DRAFT_REGIMES:
        kinds = [(0, False, 0)] + kinds + [(q, True, c) for q in tokens for c in contexts]
    return kinds


def _batch(regime: str, pcp_size: int, drawn, block_size: int, interleave: int) -> Batch:
    """The batch of these requests with canonical block ids: 0, 1, ... in request order."""
    span = block_size * (pcp_size if regime == DCP else 1)
    requests, next_block = [], 0
    for q, prefilling, context in drawn:
        count = -(-(context + q) // span)
        requests.append(Request(q, prefilling, context, tuple(range(next_block, next_block + count))))
        next_block += count
    return Batch(regime, pcp_size, tuple(requests), block_size, interleave)


def _variants(batch: Batch, scope: Scope):
    """The batch with each padding the scope allows, least padding first."""
    if batch.regime in DRAFT_REGIMES:
        nd = kernel_decode_tokens(batch.requests) if batch.regime == DRAFT_MIXED else None
        for dp_pad in range(scope.max_dp_pad + 1):
            for padded in ((False, True) if dp_pad else (False,)):
                yield Batch(batch.regime, batch.pcp_size, batch.requests, batch.block_size,
                            batch.interleave, 0, dp_pad, padded, nd)
        return
    yield batch
    widest = int(reference.layout(batch).counts.max(initial=0))
    for extra in range(1, scope.max_graph_pad + 1):
        yield Batch(batch.regime, batch.pcp_size, batch.requests, batch.block_size,
                    batch.interleave, widest + extra)


def steps(scope: Scope, regime: str):
    """Every well-formed step of the regime within the scope, each once (up to the symmetries
    of the module docstring), as Cases in order of size."""
    kinds = _request_kinds(scope, regime)
    for pcp_size in sorted(scope.pcp_sizes):
        for count in range(scope.max_requests + 1):
            levels = defaultdict(list)  # (tokens, context) -> request tuples
            for drawn in itertools.product(kinds, repeat=count):
                if regime == DRAFT_MIXED and all(q <= DRAFT_DECODE_THRESHOLD for q, _, _ in drawn):
                    continue  # the hazard needs a multi-token block classified prefill
                levels[sum(q for q, _, _ in drawn), sum(c for _, _, c in drawn)].append(drawn)
            for level in sorted(levels):
                for block_size in sorted(scope.block_sizes):
                    for interleave in _interleaves(scope, regime, block_size):
                        for drawn in levels[level]:
                            batch = _batch(regime, pcp_size, drawn, block_size, interleave)
                            for variant in _variants(batch, scope):
                                yield Case(variant, TENSORS)


def _interleaves(scope: Scope, regime: str, block_size: int):
    if regime != DCP:
        return (1,)
    return tuple(i for i in sorted(scope.interleaves) if block_size % i == 0)


def count(scope: Scope, regime: str) -> int:
    """How many steps `steps` yields, in closed form: per P and block size, the request
    sequences (k kinds, at most max_requests of them: sum of k**n; draft-mixed less those with
    no multi-token block) times the interleaves and the paddings each takes."""
    kinds = len(_request_kinds(scope, regime))
    single = scope.max_context + 1  # kinds of q <= DRAFT_DECODE_THRESHOLD = 1 (draft-mixed)
    sequences = sum(kinds ** n - (single ** n if regime == DRAFT_MIXED else 0)
                    for n in range(scope.max_requests + 1))
    paddings = (1 + 2 * scope.max_dp_pad if regime in DRAFT_REGIMES else 1 + scope.max_graph_pad)
    per_size = sum(len(_interleaves(scope, regime, b)) for b in scope.block_sizes)
    return len(scope.pcp_sizes) * per_size * sequences * paddings
