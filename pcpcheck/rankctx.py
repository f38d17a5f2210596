"""Which PCP group the calling rank belongs to.

A target reaches its group through `get_pcp_group()` (vLLM's provider, or a stand-in the loader
binds to `current_group`). Ranks run as threads or processes; each binds its own group here.
"""

from __future__ import annotations

import contextlib
import threading

_local = threading.local()


def current_group():
    group = getattr(_local, "group", None)
    if group is None:
        raise RuntimeError("no PCP group: the gather was called outside a pcpcheck rank")
    return group


@contextlib.contextmanager
def bound_group(group):
    previous = getattr(_local, "group", None)
    _local.group = group
    try:
        yield group
    finally:
        _local.group = previous
