"""pcpcheck's command line, as a process: parse the arguments (pcpcheck.faces.options), run the
command (pcpcheck.faces.commands: it calls the API and renders what it returns), and turn Ctrl-C
and every error into one line and an exit code.

    pcpcheck                          check the bundled implementation in every regime
    pcpcheck check TARGET [options]   check a pcp.py file, a module:function, or `impl`
    pcpcheck diff OLD NEW [options]   run two versions on the same cases, report where they differ
                                      (two vLLM trees: both whole paths, stage by stage)
    pcpcheck vllm SOURCE [options]    check a vLLM release's own PCP path on every rank

Exit codes: 0 every invariant holds (diff: no difference), 1 a violation (diff of two gathers: a
difference; of two vLLM trees: a violation on either side), 2 a usage or load error (one line on
stderr, no traceback), 3 pcpcheck's own failure (one line; its traceback with --traceback),
never a verdict, 4 (diff of two vLLM trees) a difference with both sides holding every invariant.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import TextIO, cast

__all__ = ["command", "main"]

INTERRUPTED = 130  # the shell's code for a process ended by SIGINT
_sigint = {"deferred": False, "pending": False}


def command() -> int:
    """The `pcpcheck` command, a process of its own: once its arguments parse (`--version` and
    `--help` answer before anything is imported), its fork server is forked from it, before it
    runs a thread or a torch op (pcpcheck.backends.forkserver)."""
    import signal
    interrupted = []

    def on_sigint(signum, frame):
        interrupted.append(signum)
        if _sigint["deferred"]:
            _sigint["pending"] = True
            return
        raise KeyboardInterrupt

    def unraisable(info, default=sys.unraisablehook):
        # Ctrl-C landing in a callback Python cannot raise from (a weakref's, during an import)
        # is printed there and lost; the flag below reports it instead.
        if not issubclass(info.exc_type, KeyboardInterrupt):
            default(info)

    signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = unraisable
    code = main(prefork=True)
    if interrupted:
        # Raised inside exec() of a string (dataclasses and namedtuple build their methods so),
        # a KeyboardInterrupt sets a flag that makes CPython end the process by SIGINT at exit,
        # even once handled; any exec() resets it.
        exec("")
        if code != INTERRUPTED:
            print("pcpcheck: interrupted", file=sys.stderr)
            return INTERRUPTED
    return code


def main(argv: list[str] | None = None, *, prefork: bool = False) -> int:
    # Ctrl-C is clean from the first instant: this module imports nothing else at its top, so
    # the console script is in this handler as soon as it has imported it.
    try:
        return _main(sys.argv[1:] if argv is None else argv, prefork)
    except KeyboardInterrupt:
        print("pcpcheck: interrupted", file=sys.stderr)
        return INTERRUPTED


def _main(argv: list[str], prefork: bool) -> int:
    from pcpcheck.shared.errors import ERRORS, error_line, internal_error_line
    from pcpcheck.shared.results import EXIT_INTERNAL, EXIT_USAGE
    try:
        from pcpcheck.faces.options import parse
        args = parse(argv)
        _import_torch()
        from pcpcheck import api
        if prefork:
            gc.freeze()  # the imports' objects (torch's alone, about 200,000) out of every later
            # collection, here and in the processes forked from here: cases allocate many objects
            api.prefork()
        from pcpcheck.faces import commands
        return commands.run(args)
    except ERRORS as exc:
        print(f"pcpcheck: {error_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`pcpcheck | head`): nothing left to say
        stdout = cast(TextIO, sys.__stdout__)  # the pipe that broke is stdout
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        return EXIT_USAGE
    except OSError as exc:
        print(f"pcpcheck: cannot write {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - pcpcheck's own failure: its exit code, never a verdict's
        print(f"pcpcheck: {internal_error_line(exc)}", file=sys.stderr)
        if "--traceback" in argv:  # read from argv: the failure may come before it parses
            import traceback
            traceback.print_exception(exc)
        return EXIT_INTERNAL


def _import_torch() -> None:
    """Import torch with Ctrl-C held until it is done: its C++ initialisation calls back into
    Python, and a KeyboardInterrupt raised in such a callback aborts the process (SIGABRT, a
    C++ traceback) instead of unwinding to main."""
    _sigint["deferred"] = True
    try:
        import torch  # noqa: F401 - imported here, once, for the reason above
    finally:
        _sigint["deferred"] = False
    if _sigint["pending"]:
        _sigint["pending"] = False
        raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(command())
