"""The command line's arguments: one parser for `pcpcheck check|diff|vllm`, read by the command
(pcpcheck.faces.cli) and by torchrun's rank entry (pcpcheck.faces.torchrun_rank). Parsing imports
nothing heavy: `pcpcheck --version` and `--help` answer at once."""

from __future__ import annotations

import argparse
import difflib
import os

from pcpcheck.shared.defaults import (
    DEFAULT_BACKEND,
    DEFAULT_DEVICE,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_MAX_RANKS,
    DEFAULT_RELEASE_EXAMPLES,
    DEFAULT_TIMEOUT,
    MAX_RANKS,
    MIN_RANKS,
)
from pcpcheck.shared.errors import UsageError
from pcpcheck.shared.results import version
from pcpcheck_spec.names import (
    ASYNC_ORDER,
    ASYNC_STEPS,
    DEFAULT_REGIMES,
    HAZARD_REGIMES,
    ORDER_FINISH,
    ORDER_FINISH_NO_WAIT,
    ORDER_START,
    REGIMES,
)

DESCRIPTION = ("pcpcheck: holds an implementation of vLLM's context-parallel KV-cache gather "
               "to the spec")
COMMANDS = ("check", "diff", "vllm", "merge")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit itself; we want one line and exit 2
        raise UsageError(message)

    def parse_known_args(self, args=None, namespace=None):
        # Each subcommand's parser sees its own leftovers here, before the top parser reports
        # them all as "unrecognized arguments": only it knows which options were meant.
        parsed, extras = super().parse_known_args(args, namespace)
        for word in extras:
            self._refuse_a_mistyped_option(word)
        return parsed, extras

    def _refuse_a_mistyped_option(self, word: str) -> None:
        """`--max-exampels 5` (or `--max-exampels=5`): an unknown option close to one of this
        parser's is a typo (a prefix of one argparse has already taken: allow_abbrev)."""
        if not word.startswith("-") or word == "-":
            return
        name = word.split("=", 1)[0]
        options = {option.lstrip("-"): option for option in self._option_string_actions}
        # dashes stripped: every option shares them, which would make unrelated names "close"
        close = difflib.get_close_matches(name.lstrip("-").lower(), options, n=1, cutoff=0.7)
        if close:
            raise UsageError(f"unknown option {name!r}: did you mean {options[close[0]]!r}? "
                             f"({self.prog} --help lists every option)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def _add_common(parser: argparse.ArgumentParser, max_examples: int | None = DEFAULT_MAX_EXAMPLES,
                unit: str = "cases") -> None:
    parser.add_argument("--function", help="name of the gather function in the target file")
    _add_search(parser, max_examples, unit)


def _add_search(parser: argparse.ArgumentParser, max_examples: int | None, unit: str) -> None:
    """What every searching command takes: regimes, how many `unit` per regime (None: `unit`
    says the defaults), ranks, seed, the per-rank timeout and the JSON output."""
    parser.add_argument("--regime", action="append", choices=(*REGIMES, "all"), metavar="REGIME",
                        help=f"regime to check, repeatable: {', '.join(REGIMES)}, or all "
                             f"(default: {', '.join(DEFAULT_REGIMES)}; {', '.join(HAZARD_REGIMES)} "
                             "is a hazard regime, checked only when named or with all)")
    parser.add_argument("--max-examples", type=_positive_int, default=max_examples,
                        help=f"{unit} drawn per regime"
                             + (" (default %(default)s)" if max_examples else ""))
    parser.add_argument("--max-ranks", type=int, default=DEFAULT_MAX_RANKS,
                        help=f"largest PCP size P drawn, {MIN_RANKS}..{MAX_RANKS} (default %(default)s)")
    parser.add_argument("--seed", type=int, help="random seed (default: derandomized, repeatable)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds a rank may take for one case before it counts as hung "
                             "(default %(default)s)")
    parser.add_argument("--json", metavar="FILE",
                        help="write the result as JSON (schema: docs/json-schema.md); - writes it "
                             "to stdout, the report then going to stderr")
    parser.add_argument("--traceback", action="store_true",
                        help="on a failure of pcpcheck itself (exit 3), also print its traceback")


def _async_order(text: str) -> tuple[str, ...]:
    """The caller's steps: start first, then attention, release, reader and one finish (or
    finish-nowait), each once, in the caller's order."""
    order = tuple(step.strip() for step in text.split(","))
    finishes = {ORDER_FINISH, ORDER_FINISH_NO_WAIT}
    canonical = sorted(ORDER_FINISH if step in finishes else step for step in order)
    if not order or order[0] != ORDER_START or any(step not in ASYNC_STEPS for step in order) \
            or canonical != sorted(ASYNC_ORDER):
        raise argparse.ArgumentTypeError(
            f"{text!r}: start first, then attention, release, reader and finish (or "
            "finish-nowait), each once, in the caller's order")
    return order


def _add_async(parser: argparse.ArgumentParser) -> None:
    """An asynchronous replication protocol beside the gather (docs/async.md)."""
    parser.add_argument("--async", dest="async_protocol", nargs="?", const="", metavar="CLASS",
                        help="also check the target's asynchronous protocol: CLASS, with start "
                             "and finish methods (default: the one class that has them), driven "
                             "as the model runner does on the CPU model of CUDA streams, in the "
                             "sharded regime")
    parser.add_argument("--async-order", type=_async_order, default=ASYNC_ORDER, metavar="STEPS",
                        help="the caller's steps around the protocol, comma-separated (default "
                             f"{','.join(ASYNC_ORDER)}; finish-nowait calls finish(wait=False))")


def _add_reports(parser: argparse.ArgumentParser) -> None:
    """The verdict for a CI's own views: JUnit and the Markdown job summary."""
    parser.add_argument("--junit", metavar="FILE",
                        help="write a JUnit XML report: one test case per regime x invariant")
    parser.add_argument("--summary", metavar="FILE",
                        help="write the verdict table as Markdown (a CI job summary)")


def _add_ci_outputs(parser: argparse.ArgumentParser) -> None:
    """What `check` and `vllm` write for CI besides --json, and the known violations."""
    _add_reports(parser)
    parser.add_argument("--html", metavar="DIR|NAME.html",
                        help="write a page per counterexample and a summary page into DIR; "
                             "a path ending .html is the summary page itself, the others "
                             "written beside it")
    parser.add_argument("--baseline", metavar="FILE",
                        help="known violations, one 'REGIME INVARIANT' per line (# comments): "
                             "they do not fail the run; listed ones no longer found are reported")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _world_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(dict.fromkeys(int(part) for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of whole numbers: {text!r}") from None
    if not sizes or not all(MIN_RANKS <= size <= MAX_RANKS for size in sizes):
        raise argparse.ArgumentTypeError(f"every world size must be between {MIN_RANKS} and {MAX_RANKS}: {text!r}")
    return sizes


def _add_backend(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("threads", "gloo", "nccl"), default=DEFAULT_BACKEND,
                        help="ranks as in-process threads (default), or torch.distributed "
                             "processes over gloo (CPU) or NCCL (one GPU per rank)")
    parser.add_argument("--world-sizes", type=_world_sizes, metavar="P,P,...",
                        help=f"world sizes P to draw, each {MIN_RANKS}..{MAX_RANKS} (default: "
                             f"{MIN_RANKS}..--max-ranks for threads, 2,4 for gloo, 2 and the GPU "
                             "count for nccl)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=DEFAULT_DEVICE,
                        help="threads backend: put every tensor and the cache write on this device")


def _add_shard(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shard", metavar="K/N",
                        help="run part K of the run split N ways (a CI's parallel jobs: "
                             "exhaustive, every N-th step of the scope; random, the cases split "
                             "N ways, each part with its own seed); `pcpcheck merge` joins the "
                             "parts' --json files")


# --exhaustive's default scopes as --scope writes them (pcpcheck.search.scope's DEFAULT_SCOPE and
# RELEASE_DEFAULT_SCOPE: importing it here would import numpy; tests/test_exhaustive.py keeps
# them one)
CHECK_SCOPE = "ranks=2/3/4,requests=3,tokens=4,context=1,block-sizes=2,interleaves=1/2,graph=1,dp=1"
RELEASE_SCOPE = "ranks=2/3/4,requests=2,tokens=4,context=1,block-sizes=1/2,interleaves=1/2,graph=1,dp=1"


def _add_exhaustive(parser: argparse.ArgumentParser, default_scope: str = CHECK_SCOPE) -> None:
    parser.add_argument("--exhaustive", action="store_true",
                        help="check every step within --scope, each once, smallest first (the "
                             "first violation is a smallest one: no shrinking), instead of "
                             "--max-examples random cases")
    parser.add_argument("--scope", metavar="KEY=VALUE,...",
                        help="--exhaustive's bounds: ranks=A..B or A/B/C, requests=N, tokens=N "
                             "(per request), context=N, block-sizes=A/B/C, interleaves=A/B, "
                             "graph=N (rows past the widest rank), dp=N (draft DP padding); "
                             f"unnamed keys keep the default ({default_scope})")


def parser() -> argparse.ArgumentParser:
    """The command line's parser (the command's subcommands; torchrun's rank entry takes
    `check`'s)."""
    parser = _Parser(prog="pcpcheck", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"pcpcheck {version()}")
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)
    check = commands.add_parser("check", help="check a gather implementation against the spec")
    check.add_argument("target", nargs="?", default="impl",
                       help="a .py file, module:function, or impl (the bundled one, default)")
    _add_common(check)
    _add_backend(check)
    check.add_argument("--repro-dir", metavar="DIR",
                       help="write a standalone pytest reproducer per violation into DIR")
    check.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                       help="wall-clock limit across all regimes; the report says how many "
                            "cases each regime reached")
    check.add_argument("--jobs", type=_positive_int, metavar="N",
                       help="threads backend: regimes searched by N driver processes at once, "
                            "each with its own worker (default: one per two cores); the "
                            "result does not depend on it")
    _add_ci_outputs(check)
    check.add_argument("--replay", metavar="CASE_JSON",
                       help="judge this one case (as printed in a counterexample's replay line)")
    _add_exhaustive(check)
    _add_shard(check)
    _add_async(check)
    diff = commands.add_parser("diff", help="compare two versions of the gather, or two vLLM "
                                            "trees' whole PCP paths, on the same cases")
    diff.add_argument("old", metavar="OLD", help="the version the search's outcomes are compared "
                                                 "against: a .py file, module:function or impl; "
                                                 "or a vLLM tree, as vllm takes it")
    diff.add_argument("new", metavar="NEW", help="the changed version, in the same form")
    # two vLLM trees (what `vllm` takes) run the same steps through both whole paths
    _add_common(diff, None, f"cases (default {DEFAULT_MAX_EXAMPLES}), or steps where OLD and NEW "
                            f"are vLLM trees (default {DEFAULT_RELEASE_EXAMPLES}),")
    diff.add_argument("--html", metavar="DIR|NAME.html",
                      help="two vLLM trees: write the comparison as a page (DIR/index.html)")
    diff.add_argument("--replay", metavar="CASE_JSON",
                      help="two vLLM trees: rerun this one step on both (a difference's replay "
                           "line)")
    _add_vllm(commands)
    merge = commands.add_parser("merge", help="join the --json results of a run's --shard parts "
                                              "into one verdict")
    merge.add_argument("parts", nargs="+", metavar="PART.json",
                       help="each part's --json file (pcpcheck check|vllm --shard K/N)")
    merge.add_argument("--json", metavar="FILE",
                       help="write the merged result as JSON; - writes it to stdout")
    _add_reports(merge)
    return parser


def _add_vllm(commands) -> None:
    vllm = commands.add_parser("vllm", help="check a vLLM release's own PCP path on all ranks")
    vllm.add_argument("source", help="a release (0.33.0, vllm==0.33.0), a wheel, a checkout, "
                                     "or installed")
    _add_search(vllm, DEFAULT_RELEASE_EXAMPLES, "steps")
    vllm.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                      help="wall-clock limit across all regimes")
    _add_ci_outputs(vllm)
    vllm.add_argument("--empty-steps", action="store_true",
                      help="also draw steps with no scheduled token (a hazard: the model "
                           "runner never runs them)")
    vllm.add_argument("--replay", metavar="CASE_JSON", help="judge this one step")
    _add_exhaustive(vllm, RELEASE_SCOPE)
    _add_shard(vllm)
    vllm.add_argument("--steps", metavar="DIR|FILE",
                      help="replay steps recorded from a live vLLM (docs/record.md) and compare "
                           "them with the release's own computation")
    vllm.add_argument("--repro-dir", metavar="DIR",
                      help="with --steps: write a standalone pytest reproducer per violated step")
    vllm.add_argument("--changed-against", metavar="BASE",
                      help="also list the lines SOURCE changes against BASE (a git revision of "
                           "the checkout, or a second tree: a release, a wheel, a checkout) and "
                           "which the steps ran; one no step ran is reported not exercised, "
                           "which leaves the exit code the verdict's")


def _refuse_a_mistyped_command(word: str) -> None:
    """`pcpcheck chek impl` would check a target named "chek": a word close to a command, that
    cannot be a target (no file of that name, no path, no module:function), is a typo."""
    if word.startswith("-") or word == "impl" or any(c in word for c in "/\\.:") \
            or os.path.exists(word):
        return
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    if close:
        raise UsageError(f"unknown command {word!r}: did you mean {close[0]!r}? (commands: "
                         f"{', '.join(COMMANDS)}; a target is a .py file, module:function or "
                         "impl)")


def parse(argv: list[str]) -> argparse.Namespace:
    if argv and argv[0] not in (*COMMANDS, "-h", "--help", "--version"):
        _refuse_a_mistyped_command(argv[0])
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help", "--version"):
        argv = ["check", *argv]
    args = parser().parse_args(argv)
    if args.command == "merge":
        return args
    if not args.regime:
        args.regimes = DEFAULT_REGIMES
    elif "all" in args.regime:
        args.regimes = REGIMES
    else:
        args.regimes = tuple(dict.fromkeys(args.regime))
    if not 0 < args.timeout < float("inf"):  # nan fails both comparisons
        raise UsageError(f"--timeout must be positive and finite (seconds), got {args.timeout}")
    if args.command in ("check", "vllm") and args.replay and (args.exhaustive or args.scope):
        raise UsageError("--replay judges one case; --exhaustive and --scope search a scope")
    if args.command == "vllm" and args.steps:  # its findings are text: nothing else applies
        given = [f"--{name.replace('_', '-')}" for name in ("json", "junit", "summary", "html",
                                                            "baseline", "replay", "empty_steps",
                                                            "exhaustive", "scope",
                                                            "changed_against")
                 if getattr(args, name)]
        if given:
            raise UsageError(f"--steps takes none of {', '.join(given)}")
    if args.command == "vllm" and args.replay and args.changed_against:
        raise UsageError("--changed-against applies to a search (a step's replay runs one step)")
    if args.command == "vllm" and args.repro_dir and not args.steps:
        raise UsageError("--repro-dir applies to --steps (a drawn step's replay line is its "
                         "reproducer)")
    if args.command in ("check", "vllm", "diff") and args.replay:  # malformed: exit 2 at once
        from pcpcheck.api import read_case
        try:
            args.replay = read_case(args.replay)
        except UsageError as exc:
            raise UsageError(f"--replay is {exc}") from None
    return args
