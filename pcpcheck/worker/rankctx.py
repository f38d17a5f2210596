"""Which process groups the calling rank belongs to.

A target reaches its group through `get_pcp_group()` (vLLM's provider, or a stand-in the loader
binds to `current_group`). Ranks run as greenlets, threads or processes; each binds its own group
here. A context variable is private to each of them (greenlets and threads get their own context).
"""

from __future__ import annotations

import contextlib
import contextvars

_group: contextvars.ContextVar = contextvars.ContextVar("pcpcheck_rank_group", default=None)
# the rank's DCP group where a step knows it (a release's dcp step: D = P, the PCP group's ranks)
_dcp: contextvars.ContextVar = contextvars.ContextVar("pcpcheck_rank_dcp", default=None)


def current_group():
    group = _group.get()
    if group is None:
        raise RuntimeError("no PCP group: the gather was called outside a pcpcheck rank")
    return group


@contextlib.contextmanager
def _bound(variable: contextvars.ContextVar, value):
    token = variable.set(value)
    try:
        yield value
    finally:
        variable.reset(token)


def bound_group(group):
    """The calling rank's PCP group for the block."""
    return _bound(_group, group)


def bound_group_or(default):
    """The calling rank's PCP group where one is bound, else `default`."""
    group = _group.get()
    return default if group is None else group


def current_dcp():
    """The rank's DCP group, None where the step bound none."""
    return _dcp.get()


def bound_dcp(group):
    """The rank's DCP group for the block (its PCP group on a dcp step, else a one-rank group)."""
    return _bound(_dcp, group)


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


class RankPosition:
    """A rank's place in a group of `size`, for code that reads only that (the manager's builder,
    `rank_in_group`) where the rank is laid out alone, outside a worker's ranks: no collective."""

    def __init__(self, rank: int, size: int):
        self.rank_in_group = self.rank = self.local_rank = rank
        self.world_size = size
        self.ranks = tuple(range(size))
