"""Which lines of a release's path files its steps run (`pcpcheck vllm`), in the worker: per file
of the path table that the release's own code runs (status real), the executable lines inside its
function and method bodies, and those the traced steps ran, sent to the driver as plain data
after each case (the lines no earlier case of this worker ran: the driver merges every worker's).

coverage.py's C tracer records them, restricted to those files and switched on only while a
step's ranks run: what the release's modules execute as they load is not the path's functions.
Ranks are greenlets that switch inside the gather's collectives: `concurrency=["greenlet"]` keeps
the tracer's call stack per greenlet, so a line is credited to the frame that ran it. A tracer
lives one step (each start makes a fresh one): its per-greenlet stacks only grow, and a worker
runs thousands of steps.

Not every step is traced. On Python 3.11 any trace function puts the interpreter in its tracing
mode for every frame, whichever files are measured: a traced step costs 2 to 3 times its CPU
(most of it in triton's interpreter running the slot kernel), however little is recorded. So
every step is traced while the steps keep running new lines; after a traced step that ran none,
the next `gap` steps are not (1, 2, 4, ... up to LINES_MAX_GAP), and a step that runs a new line
has every step traced again. What is reported is what the traced steps ran, and on how many of
the steps: a line shown not run ran on no traced step. The lines a change touched (`watch`,
`pcpcheck vllm --changed-against`) keep every step traced while the statement of one of them has
not run: a changed line reported not exercised ran on no step at all, and a change whose lines
all run costs little more than the rest.

The lines counted (`functions`) are coverage's statements (each the first line of its statement,
no `# pragma` excluded) inside a function's body, nested ones and methods included; a `def` line
at module or class level is not (it runs at import).
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

import coverage
from coverage.parser import PythonParser

from pcpcheck.shared.protocol import LINES_MAX_GAP
from pcpcheck.shared.source import Source


def function_lines(text: str, filename: str) -> tuple[PythonParser, frozenset[int]]:
    """The file's statement parser, and its executable lines inside function bodies."""
    parser = PythonParser(text=text, filename=filename)
    parser.parse_source()
    bodies: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bodies.update(range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1))
    return parser, frozenset(parser.statements & bodies)


def _include_pattern(filename: str) -> str:
    """coverage's include glob matching exactly `filename` (where a glob character stands in the
    name, any one character there: coverage's globs cannot escape `]`)."""
    return re.sub(r"[][*?]", "?", filename)


class LineRecorder:
    """The lines of `relpaths` (files of `source`) that the steps run under `step()` ran, where
    they were traced; `take()` after each step."""

    def __init__(self, source: Source, relpaths: Iterable[str],
                 watch: Mapping[str, Iterable[Sequence[int]]] | None = None) -> None:
        self._parsers: dict[str, PythonParser] = {}
        self.functions: dict[str, frozenset[int]] = {}
        self._relpath: dict[str, str] = {}  # the traced file name (as coverage keeps it) -> relpath
        for relpath in dict.fromkeys(relpaths):
            filename = source.filename(relpath)
            self._parsers[relpath], self.functions[relpath] = function_lines(
                source.read(relpath), filename)
            self._relpath[os.path.realpath(filename)] = relpath
        self._coverage = coverage.Coverage(
            data_file=None, config_file=False, concurrency=["greenlet"],
            include=[_include_pattern(filename) for filename in self._relpath])
        # a step that ran no line of them yet is no problem to warn about (in the capture file)
        self._coverage.set_option("run:disable_warnings", ["no-data-collected"])
        self._seen: dict[str, set[int]] = {relpath: set() for relpath in self.functions}
        self._sent: dict[str, set[int]] = {relpath: set() for relpath in self.functions}
        # the statements of the path's functions a change touched ([first, last] runs of lines),
        # every step traced until each ran
        self._watch = {relpath: {self._parsers[relpath].first_line(line)
                                 for first, last in (watch or {}).get(relpath, ())
                                 for line in range(first, last + 1)} & self.functions[relpath]
                       for relpath in self.functions}
        self._gap = 0  # steps left untraced after the last traced step that ran no new line
        self._skip = 0  # of which still to come
        self.traced = False  # whether the last step was traced

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One step within: traced if it is due (`traced` says)."""
        self.traced = not self._skip
        if not self.traced:
            self._skip -= 1
            yield
            return
        self._coverage.start()
        try:
            yield
        finally:
            self._coverage.stop()

    def take(self) -> dict[str, list[int]]:
        """relpath -> the lines of its functions that the last step ran and no step before it
        (files with none left out); when the next step is traced follows from it."""
        if not self.traced:
            return {}
        data = self._coverage.get_data()
        new: dict[str, list[int]] = {}
        for filename in data.measured_files():
            relpath = self._relpath.get(os.path.realpath(filename))
            if relpath is None:
                continue
            raw = set(data.lines(filename) or ()) - self._seen[relpath]
            self._seen[relpath] |= raw
            lines = (self._parsers[relpath].translate_lines(raw) & self.functions[relpath]
                     ) - self._sent[relpath]
            if lines:
                self._sent[relpath] |= lines
                new[relpath] = sorted(lines)
        watching = any(lines - self._sent[relpath] for relpath, lines in self._watch.items())
        self._gap = 0 if new or watching else min(LINES_MAX_GAP, max(1, 2 * self._gap))
        self._skip = self._gap
        return new


__all__ = ["LineRecorder", "function_lines"]
