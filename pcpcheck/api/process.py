"""What a command sets up for the process it runs in, before it calls the API: its fork server
forked early, hypothesis's files out of the caller's directory, and under torchrun its session.
The API itself leaves a host process (a test suite) as it found it."""

from __future__ import annotations

import os


def prefork() -> None:
    """Start this process's fork server now, as a fork of it (pcpcheck.backends.forkserver):
    for a command's own process, at its start, before it runs a thread or a torch op."""
    from pcpcheck.backends.pool import FORK_SERVER
    FORK_SERVER.prefork()


def use_cache_dir() -> None:
    """Hypothesis's files (its constants cache, any database) go to $XDG_CACHE_HOME/pcpcheck,
    never the caller's working directory. Commands only: the API leaves a host suite's alone."""
    from hypothesis.configuration import set_hypothesis_home_dir
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    set_hypothesis_home_dir(os.path.join(base, "pcpcheck", "hypothesis"))


def torchrun_session(backend: str, timeout: float):
    """This torchrun process's part of a check (pcpcheck.backends.torchrun_store.Session): gloo or
    nccl as asked, else nccl where CUDA is, gloo elsewhere."""
    from pcpcheck.backends.torchrun_store import Session
    if backend not in ("gloo", "nccl"):
        import torch
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    return Session(backend, timeout)
