"""`--shard K/N`: part K of a run split N ways, for a CI's parallel jobs; `pcpcheck merge` joins
the parts' results into one verdict (pcpcheck.api.merge).

The parts are disjoint and together the whole: an exhaustive run takes every N-th step of the
scope's order, from the K-th (each part keeps the order of size, so its first violation is the
smallest of its steps, and the smallest over all parts is the unsplit run's); a random run
searches every regime with its cases split N ways, each part drawing from a seed of its own.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from typing import TypeVar

Shard = tuple[int, int]  # (K, N): part K of N, 1 <= K <= N
T = TypeVar("T")


def parse_shard(text: str) -> Shard:
    """'K/N' -> (K, N); ValueError naming the problem."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ValueError(f"--shard takes K/N (part K of N, e.g. 2/3), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text}: K must be between 1 and N")
    return index, count


def take(items: Iterable[T], shard: Shard | None) -> Iterator[T]:
    """The part's items: every N-th, from the K-th."""
    if shard is None:
        return iter(items)
    return itertools.islice(items, shard[0] - 1, None, shard[1])


def share(total: int, shard: Shard | None) -> int:
    """How many of `total` items (steps, cases) the part takes."""
    if shard is None:
        return total
    return len(range(shard[0] - 1, total, shard[1]))


def part_seed(base: int | None, shard: Shard | None) -> int | str | None:
    """The random search's seed for the part: `base` unsplit (None: a random one), else one of
    the part's own."""
    return base if shard is None else f"{base}/shard {shard[0]} of {shard[1]}"
