"""Which PCP group the calling rank belongs to.

A target reaches its group through `get_pcp_group()` (vLLM's provider, or a stand-in the loader
binds to `current_group`). Ranks run as greenlets, threads or processes; each binds its own group
here. A context variable is private to each of them (greenlets and threads get their own context).
"""

from __future__ import annotations

import contextlib
import contextvars

_group: contextvars.ContextVar = contextvars.ContextVar("pcpcheck_rank_group", default=None)


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
