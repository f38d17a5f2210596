"""The lines a change touched, against the lines a run executed (`pcpcheck vllm TREE
--changed-against BASE`; the diff itself is made by pcpcheck.api.changed_against).

A `Changes` holds, per Python file under `vllm/` that differs from BASE, its changed lines on the
checked tree's side (added or modified; where lines were only deleted, the line after the
deletion point, which the deleted code stood before), each, in the path's files, with the first
line of the statement that holds it (coverage's statement, as pcpcheck.worker.release_lines
counts them) and the function it sits in. Which of them ran is not stored: `reach` works it out from the release's
record (its `lines`: each path file's function lines and those run; its `files`: every file the
run read), so a merge of `--shard` parts, whose lines run are the union of theirs, reaches the
same answer.

A changed line of a path file is
- RAN: its statement is one a traced step ran;
- NOT_EXERCISED: its statement is an executable line inside the path's functions that no traced
  step ran;
- NOT_COUNTED: a blank line, a comment, a signature or other code outside every function's body
  (run at import, if at all): no claim either way.
A changed file that is no path file is READ (the run loaded or read it, its lines not recorded)
or OUTSIDE (the path pcpcheck runs does not read it): no claim either way.

The worker is told the path files' changed lines (`CHANGED_LINES`, in the release's load spec):
its line recorder traces every step while the statement of one of them has not run
(pcpcheck.worker.release_lines), so a line reported NOT_EXERCISED ran on none of the steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# the load spec's key for the changed lines the worker's line recorder watches
CHANGED_LINES = "changed_lines"
RAN, NOT_EXERCISED, NOT_COUNTED = "ran", "not exercised", "not counted"
PATH, READ, OUTSIDE = "path", "read", "outside"


@dataclass(frozen=True)
class ChangedLine:
    line: int  # in the checked tree's file
    # in a path file (pcpcheck.api.changed_against.locate), else 0 and None: the first line of
    # the statement holding it (0: none, a blank or a comment), and the innermost function
    # (Class.method, outer.inner) whose text holds it
    statement: int
    function: str | None


@dataclass(frozen=True, kw_only=True)
class ChangedFile:
    file: str  # its path in the checked tree
    lines: tuple[ChangedLine, ...]  # ascending


@dataclass(frozen=True, kw_only=True)
class Changes:
    against: str  # BASE as given
    base: str  # what it was read as: a git revision of the checkout, or a tree
    files: tuple[ChangedFile, ...]  # every changed file, by path
    removed: tuple[str, ...] = ()  # files of BASE the checked tree no longer has

    def watch(self, relpaths: Iterable[str]) -> dict[str, list[list[int]]]:
        """The changed lines of the files `relpaths` (the path's) as [first, last] runs
        (CHANGED_LINES): every case's request names the load spec, so it is kept to the path's
        files and to their diff's hunks."""
        relpaths = set(relpaths)
        return {entry.file: runs(line.line for line in entry.lines) for entry in self.files
                if entry.file in relpaths}

    def to_json(self, reached: Sequence[FileReach]) -> dict[str, Any]:
        """The JSON of docs/json-schema.md (`release.changes`), each line with its reach."""
        return {"against": self.against, "base": self.base, "removed": list(self.removed),
                "files": {entry.file: {"where": entry.where, "lines": [
                    {"line": line.line, "statement": line.statement, "function": line.function,
                     "reach": reach} for line, reach in entry.lines]} for entry in reached}}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Changes:
        return Changes(against=data["against"], base=data["base"],
                       removed=tuple(data["removed"]),
                       files=tuple(ChangedFile(file=relpath, lines=tuple(
                           ChangedLine(line["line"], line["statement"], line["function"])
                           for line in entry["lines"]))
                           for relpath, entry in data["files"].items()))


class FileLinesRun(Protocol):
    """What `reach` reads of a path file's lines (pcpcheck.shared.results.FileLines)."""

    @property
    def file(self) -> str: ...

    @property
    def functions(self) -> tuple[int, ...]: ...

    @property
    def run(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class FileReach:
    """A changed file: where it stands (PATH, READ, OUTSIDE) and each changed line with its reach
    (RAN, NOT_EXERCISED, NOT_COUNTED; None outside the path files)."""

    file: str
    where: str
    lines: tuple[tuple[ChangedLine, str | None], ...]

    def having(self, reach: str) -> tuple[ChangedLine, ...]:
        return tuple(line for line, its in self.lines if its == reach)


def reach(changes: Changes, lines: Iterable[FileLinesRun], read: Iterable[str]
          ) -> tuple[FileReach, ...]:
    """Each changed file of `changes` against a run: `lines`, each path file's lines in its
    functions and those run; `read`, every file the run read."""
    recorded = {entry.file: entry for entry in lines}
    read = set(read)
    out = []
    for changed in changes.files:
        entry = recorded.get(changed.file)
        if entry is None:
            out.append(FileReach(changed.file, READ if changed.file in read else OUTSIDE,
                                 tuple((line, None) for line in changed.lines)))
            continue
        functions, run = set(entry.functions), set(entry.run)
        out.append(FileReach(changed.file, PATH, tuple(
            (line, RAN if line.statement in run else
             NOT_EXERCISED if line.statement in functions else NOT_COUNTED)
            for line in changed.lines)))
    return tuple(out)


def runs(numbers: Iterable[int]) -> list[list[int]]:
    """Line numbers as [first, last] runs of consecutive ones, ascending."""
    found: list[list[int]] = []
    for number in sorted(set(numbers)):
        if found and number == found[-1][1] + 1:
            found[-1][1] = number
        else:
            found.append([number, number])
    return found


def spans(numbers: Iterable[int]) -> str:
    """Line numbers as runs: 12, 15-17."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs(numbers))


__all__ = ["CHANGED_LINES", "NOT_COUNTED", "NOT_EXERCISED", "OUTSIDE", "PATH", "RAN", "READ",
           "ChangedFile", "ChangedLine", "Changes", "FileReach", "reach", "runs", "spans"]
