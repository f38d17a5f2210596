"""torchrun without torch's failure report: `python -m pcpcheck.faces.torchrun [torchrun options] --
[pcpcheck check arguments]`.

Plain `torchrun ... -m pcpcheck.faces.torchrun_rank ARGS` works too, but torchrun's own agent
prints a ChildFailedError report (a traceback-like block) whenever a rank exits non-zero, which
is what a violation is (exit 1). This launcher runs torchrun's launcher in-process
(`torch.distributed.run.run`), keeps its agent's logging to errors of its own, and exits with
rank 0's code: the report pcpcheck's rank 0 printed is the only output.
"""

from __future__ import annotations

import logging
import sys

MODULE = "pcpcheck.faces.torchrun_rank"
USAGE = "usage: python -m pcpcheck.faces.torchrun [torchrun options] -- [pcpcheck check arguments]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" not in argv:
        print(f"pcpcheck: {USAGE}", file=sys.stderr)
        return 2
    split = argv.index("--")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run
    for name in ("torch.distributed.run", "torch.distributed.elastic"):  # its own notices
        logging.getLogger(name).setLevel(logging.CRITICAL)
    args = get_args_parser().parse_args([*argv[:split], "-m", MODULE, *argv[split + 1:]])
    try:
        run(args)
    except ChildFailedError as failed:  # a verdict (1) or a usage error (2): rank 0's code
        codes = {rank: failure.exitcode for rank, failure in failed.failures.items()}
        return codes.get(0, max(codes.values(), default=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
