"""Where a verdict is made: every predicate of spec/invariants.py that applies, through the
registry, on a case's observation at the index level (rows as labels)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pcpcheck.judge import coverage
from pcpcheck.judge.observe import RankView
from pcpcheck.judge.prepare import Prepared
from pcpcheck_spec.names import (
    ASYNC_FALLBACK,
    ASYNC_INPUT,
    ASYNC_LIFETIME,
    ASYNC_READ,
    READER_ATTENTION,
    READER_NEXT,
)
from pcpcheck_spec.registry import Step, evaluate

ORDERINGS = (ASYNC_INPUT, ASYNC_READ, ASYNC_LIFETIME)  # what only an order between streams exercises
PROTOCOL_ONLY = (ASYNC_FALLBACK, ASYNC_READ)  # what only a protocol can break


@dataclass
class Violation:
    invariant: str
    ranks: list[int]  # the ranks on which it fails


@dataclass(kw_only=True)
class Observation:
    prepared: Prepared
    ranks: list[RankView]
    violations: list[Violation]
    checked: tuple[str, ...]  # invariant IDs evaluated on this case
    note: str = ""  # how its search ended early, if it did (engine: shrinking stopped)

    @property
    def costly(self) -> bool:
        """A rank hung or died: running the case again costs a timeout or a worker."""
        return any(view.lost for view in self.ranks)

def readers(prepared: Prepared) -> list[dict[int, list[int]]]:
    """Per rank, the slots each reader of an asynchronous step reads (spec.names): the layer's
    attention every slot the rank holds but its peers' decode rows (those arrive on the side
    stream, joined by finish), the next reader the complete replica."""
    peers_decodes = [set(np.asarray(tokens[:nd]).tolist())
                     for tokens, nd in zip(prepared.tokens, prepared.nds)]
    out = []
    for rank, expected in enumerate(prepared.expected):
        others = set().union(*(decodes for peer, decodes in enumerate(peers_decodes) if peer != rank))
        out.append({READER_ATTENTION: sorted(slot for slot, token in expected.items()
                                             if token not in others),
                    READER_NEXT: sorted(expected)})
    return out


def judge(prepared: Prepared, views: list[RankView], regime: str | None = None
          ) -> tuple[list[Violation], tuple[str, ...]]:
    """Evaluate every predicate of spec.registry that applies in `regime` (default: the case's);
    violations in priority order, and the IDs whose predicate actually ran on this case."""
    step = Step(views, prepared.expected, prepared.labels[prepared.labels >= 0].tolist(),
                len(prepared.case.tensors),
                readers(prepared) if any(view.streams is not None for view in views) else [])
    failed, ran = evaluate(step, regime or prepared.case.batch.regime)
    exercised = coverage.asynchronous([view.streams for view in views])
    if exercised is not None:
        # what the step did not exercise counts as checked only where it found a fault: the
        # orderings where no rank started a protocol or used a side stream; where there is no
        # protocol (a gather judged alone), the fallback rule and the readers' order (the caller
        # writes the slots and reads them on one stream)
        unexercised = (() if exercised in coverage.ORDERED else ORDERINGS) + (
            PROTOCOL_ONLY if exercised in coverage.STREAM_FEATURES else ())
        ran = tuple(i for i in ran if i not in unexercised or i in failed)
    return [Violation(i, ranks) for i, ranks in failed.items()], ran
