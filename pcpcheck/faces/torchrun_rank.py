"""One torchrun process: `torchrun --standalone --nproc-per-node P -m pcpcheck.faces.torchrun_rank
[pcpcheck check arguments]` (or `python -m pcpcheck.faces.torchrun`, which keeps torch's failure
report off the output). Rank 0 runs `pcpcheck check` (pcpcheck.faces.commands.run_check) on the
API with a backend that spans every rank; the others serve it; every rank exits with rank 0's
code."""

from __future__ import annotations

import os
import sys

from pcpcheck.faces.options import parse
from pcpcheck.shared.errors import ERRORS, UsageError, error_line, internal_error_line
from pcpcheck.shared.results import EXIT_INTERNAL, EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    from pcpcheck import api
    from pcpcheck.faces import commands
    api.prefork()  # a process of its own, no thread nor torch op yet
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "check":
        argv = argv[1:]
    rank = int(os.environ.get("RANK", "0"))
    code = EXIT_USAGE
    try:
        args = parse(["check", *argv])
    except UsageError as exc:
        if rank == 0:
            print(f"pcpcheck: usage error: {exc}", file=sys.stderr)
        _exit(code)
    session = api.torchrun_session(args.backend, args.timeout)
    try:
        with session:
            if session.rank != 0:
                code = session.serve()
            else:
                if args.world_sizes and tuple(args.world_sizes) != (session.size,):
                    raise UsageError(f"--world-sizes {','.join(map(str, args.world_sizes))} but "
                                     f"torchrun started {session.size} ranks")
                args.world_sizes = (session.size,)
                print(f"pcpcheck: torchrun, {session.size} ranks, {session.backend}")
                code = commands.run_check(args, session.runner)
    except ERRORS as exc:
        print(f"pcpcheck: {error_line(exc)}", file=sys.stderr)
        code = EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - pcpcheck's own failure: its exit code, never a verdict's
        print(f"pcpcheck: {internal_error_line(exc)}", file=sys.stderr)
        if args.traceback:
            import traceback
            traceback.print_exception(exc)
        code = EXIT_INTERNAL
    finally:
        session.finish(code)
        _exit(code)
    return code


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
