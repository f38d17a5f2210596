"""How pcpcheck's processes end with the process that started them (Linux prctl), so that a
killed driver leaves no worker, server or `--jobs` driver behind."""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_CHILD_SUBREAPER = 1, 15, 36


def prctl(option: int, value: int | bytes) -> None:
    """prctl(option, value); nothing where there is no prctl (not Linux)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(option, value)
    except Exception:  # noqa: BLE001 - not Linux
        pass


def die_with_parent(parent: int) -> None:
    """The kernel kills this process when `parent` dies, even by SIGKILL (Linux; elsewhere a
    closed pipe still ends an idle worker); exit now if it is already gone."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
