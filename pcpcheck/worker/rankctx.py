"""Which process groups the calling rank belongs to.

A target reaches its group through `get_pcp_group()` (vLLM's provider, or a stand-in the loader
binds to `current_group`). Ranks run as greenlets, threads or processes; each binds its own group
here. A context variable is private to each of them (greenlets and threads get their own context).

A tree's own `vllm.distributed.parallel_state` runs as the release wrote it, with its group
globals (`_PCP`, `_DCP`, `_TP`, `_WORLD`, ...) bound to `RankGroup`s: each answers as the calling
rank's group of that kind (GROUP_KINDS), so every rank, though they share one module, finds its
own group through the tree's own `get_pcp_group()`.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys

_group: contextvars.ContextVar = contextvars.ContextVar("pcpcheck_rank_group", default=None)
# the rank's DCP group where a step knows it (a release's dcp step: D = P, the PCP group's ranks)
_dcp: contextvars.ContextVar = contextvars.ContextVar("pcpcheck_rank_dcp", default=None)


def current_group():
    group = _group.get()
    if group is None:
        raise RuntimeError("no PCP group: the gather was called outside a pcpcheck rank")
    return group


@contextlib.contextmanager
def bound_group(group):
    token = _group.set(group)
    try:
        yield group
    finally:
        _group.reset(token)


@contextlib.contextmanager
def bound_dcp(group):
    """The rank's DCP group for the block (its PCP group on a dcp step, else a one-rank group)."""
    token = _dcp.set(group)
    try:
        yield group
    finally:
        _dcp.reset(token)


class SoloGroup:
    """A one-rank group: pcpcheck models TP = PP = DP = EP = 1."""

    world_size = 1
    rank_in_group = 0
    rank = 0
    ranks = (0,)
    local_rank = 0

    def all_gather(self, tensor, dim=0):
        return tensor

    def all_reduce(self, tensor):
        return tensor

    def broadcast(self, tensor, src=0):
        return tensor

    def barrier(self):
        return None


SOLO = SoloGroup()


def _dcp_group():
    group = _dcp.get()
    if group is None:
        from pcpcheck.worker.standins import refuse
        refuse("get_dcp_group(): pcpcheck binds the DCP group only on a release's steps, where "
               "the regime says who shares it", "vllm.distributed.parallel_state._DCP", "a use",
               sys._getframe(2))
    return group


# parallel_state's group globals, by the group each answers as
GROUP_KINDS = {"_WORLD": current_group, "_PCP": current_group, "_DCP": _dcp_group,
               **{name: lambda: SOLO for name in ("_TP", "_PP", "_DP", "_EP", "_ETP", "_EPLB",
                                                   "_INNER_DP_WORLD", "_ENGRAM_DP")}}


class RankGroup:
    """A group global of a tree's parallel_state: the calling rank's group of its kind."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(GROUP_KINDS[self._name](), attribute)

    def __repr__(self) -> str:
        return f"<the calling rank's {self._name.strip('_')} group (pcpcheck)>"
