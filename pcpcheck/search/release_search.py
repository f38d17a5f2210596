"""`pcpcheck vllm`'s search per regime: each drawn or enumerated step as the release would see it
(`era_case`), run through its own path in the worker and judged here (pcpcheck.judge.release_case).

`pcpcheck.api.check_release` drives it and returns a CheckResult naming the release, the files
read with their sha256, the stand-ins and adaptations, and the layout model (era) that judged it;
per regime: holds, VIOLATED (shrunk counterexamples) or not applicable (the reason read from the
release's code). Everything here runs in the driver on plain data (a ReleaseInfo): the release's
code runs only in the backend's worker.
"""

from __future__ import annotations

import dataclasses
import functools

import pcpcheck_reference as reference
from pcpcheck.judge.release_case import capabilities, run_release_cases
from pcpcheck.search.engine import RegimeResult, search
from pcpcheck.search.exhaustive import exhaust
from pcpcheck.shared.case import Case
from pcpcheck.shared.protocol import Capabilities, ReleaseInfo
from pcpcheck_spec.names import DCP, DRAFT, DRAFT_REGIMES, Batch


def search_regime(release: ReleaseInfo, regime: str, backend, *, max_examples: int,
                  max_ranks: int, seed: int | None, empty_steps: bool, deadline=None,
                  on_case=None, on_wait=None, scope=None, shard=None) -> RegimeResult:
    """One regime of a release: not applicable (the reason from its code), or searched (every
    step of `scope`, a pcpcheck.search.scope.Scope, in the release's order when one is given;
    `shard`: part K of N, pcpcheck.search.shard)."""
    reason = capabilities(release).not_applicable.get(regime)
    if reason:
        return RegimeResult(regime=regime, not_applicable=reason)
    if scope is not None:
        return exhaust(release, regime, backend, scope, deadline=deadline, on_case=on_case,
                       on_wait=on_wait, run_many=run_release_cases, shard=shard,
                       transform=functools.partial(era_case, caps=capabilities(release),
                                                   empty_steps=empty_steps))
    return search(release, regime, backend, max_examples=max_examples, max_ranks=max_ranks,
                  derandomize=seed is None, seed=seed, deadline=deadline, on_case=on_case,
                  transform=functools.partial(era_case, caps=capabilities(release),
                                              empty_steps=empty_steps),
                  run_many=run_release_cases, reduce=False, on_wait=on_wait, shard=shard)


def release_order(batch: Batch) -> Batch:
    """The step in the model runner's order (section 9, 0.33's key): decodes with draft tokens
    first, then requests whose scheduled length equals the decode query length (1), then by
    length; the prefilling flag is not in the key, so a 1-token continued prefill stands among
    the decodes. The sort is stable."""
    def key(request):
        drafts = not request.prefilling and request.num_tokens > 1
        return (not drafts, request.num_tokens != 1, request.num_tokens)
    return dataclasses.replace(batch, requests=tuple(sorted(batch.requests, key=key)))


def accepts_interleave(caps: Capabilities, interleave: int, block_size: int) -> bool:
    """Whether the release's config accepts this DCP interleave size with this block size."""
    fits = 1 <= interleave <= block_size and block_size % interleave == 0
    return fits and (interleave == caps.interleave_default or caps.interleave_divisors)


def era_case(case: Case, caps: Capabilities, empty_steps: bool = False) -> Case | None:
    """A drawn case as the release would see it: requests in its batch order, graph padding only
    where it has it (the same extra rows over the widest rank of its own era's layout), one query
    token per decode where it rejects drafts, an interleave size it accepts (else its default),
    no empty step unless asked (None: not a step this release runs), and tensors its layers pass
    a wrapper: the MLA latent cache's two at most (a third drawn is dropped), where it has the
    wrappers."""
    if caps.wrappers and len(case.tensors) > 2:
        case = dataclasses.replace(case, tensors=case.tensors[:2])
    batch = case.batch
    empty = not any(r.num_tokens for r in batch.requests)
    if empty and not empty_steps:
        return None
    if batch.regime == DCP and not accepts_interleave(caps, batch.interleave, batch.block_size):
        if not accepts_interleave(caps, caps.interleave_default, batch.block_size):
            return None  # its default does not fit this block size: it rejects the config
        batch = dataclasses.replace(batch, interleave=caps.interleave_default)
    if DRAFT in caps.not_applicable:  # no speculative tokens: a decode has 1 query token
        batch = dataclasses.replace(batch, requests=tuple(
            r if r.prefilling else dataclasses.replace(r, num_tokens=min(r.num_tokens, 1))
            for r in batch.requests))
    ordered = release_order(batch)
    if batch.regime not in DRAFT_REGIMES:
        graph = 0
        if batch.graph_size and caps.graph_padding and not empty:  # no graph runs empty
            extra = batch.graph_size - int(reference.layout(batch).counts.max(initial=0))
            widest = reference.layout(dataclasses.replace(ordered, graph_size=0),
                                      era=caps.era).counts.max(initial=0)
            graph = int(widest) + max(extra, 1)
        ordered = dataclasses.replace(ordered, graph_size=graph)
    return dataclasses.replace(case, batch=ordered)
