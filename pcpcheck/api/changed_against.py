"""`--changed-against BASE`: the lines of a checked tree that differ from BASE
(pcpcheck.shared.changed holds them and says which ran).

BASE is, in this order: an existing path (a checkout directory or a wheel), a git revision of
the checkout being checked (`git rev-parse` there knows it), else anything else `pcpcheck vllm`
takes (a release version, `installed`). Only BASE's files are read, never executed. Both sides
are compared on their Python files under `vllm/` (what a wheel and a checkout both hold), line
by line with difflib: a git revision's files are read with `git show REV:./PATH` (the checked
tree is its working tree, uncommitted changes and untracked files included: what runs), a
tree's through pcpcheck.shared.source. A BASE that is neither raises UsageError (exit 2), one
line, before anything runs. Which statement and function each changed line belongs to is worked
out (`locate`) only for the path's files, once the release's load has named them.
"""

from __future__ import annotations

import ast
import difflib
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from pcpcheck.shared.changed import ChangedFile, ChangedLine, Changes
from pcpcheck.shared.errors import SourceError, UsageError
from pcpcheck.shared.source import Source, resolve

PACKAGE = "vllm/"  # the folder of both trees that is compared
_GIT_TIMEOUT = 120


def changes_against(tree: Source, base: str) -> Changes:
    """The changes of `tree` (the tree checked) against `base` (see the module docstring)."""
    text = str(base).strip()
    if not text:
        raise UsageError("--changed-against: empty BASE")
    if Path(text).expanduser().exists():
        try:
            return _against_tree(tree, text)
        except UsageError as exc:
            raise UsageError(f"--changed-against {text}: {exc}") from None
    revision = _git_revision(tree, text)
    if revision is not None:
        return _against_revision(tree, text, *revision)
    try:
        return _against_tree(tree, text)
    except UsageError as exc:
        where = (f"not a git revision of {tree.location}" if tree.kind != "wheel"
                 else f"{tree.location} is a wheel, not a git checkout")
        raise UsageError(f"--changed-against {text}: {where}, and {exc}") from None


def _against_tree(tree: Source, text: str) -> Changes:
    try:
        other = resolve(text)
    except SourceError as exc:
        raise UsageError(f"not a vLLM tree ({exc})") from None
    ours, theirs = set(_python_files(tree)), set(_python_files(other))
    files = [_changed(tree, relpath, other.read(relpath) if relpath in theirs else "")
             for relpath in sorted(ours)]
    return Changes(against=text, base=other.describe(),
                   files=tuple(entry for entry in files if entry.lines),
                   removed=tuple(sorted(theirs - ours)))


def _python_files(source: Source) -> list[str]:
    return [relpath for relpath in source.files_under(PACKAGE) if relpath.endswith(".py")]


def _git(root: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", root, *args], capture_output=True,
                              timeout=_GIT_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--changed-against: git failed in {root}: {exc}") from None


def _git_revision(tree: Source, text: str) -> tuple[str, str] | None:
    """(the commit `text` names, the repository's top folder), where the tree is a git checkout
    that knows it; else None."""
    if tree.kind == "wheel" or text.startswith("-"):  # no option smuggled in as a revision
        return None
    top = _git(tree.location, "rev-parse", "--show-toplevel")
    commit = _git(tree.location, "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}")
    if top.returncode or commit.returncode:
        return None
    return commit.stdout.decode().strip(), top.stdout.decode().strip()


def _against_revision(tree: Source, text: str, commit: str, top: str) -> Changes:
    """The working tree at `tree.location` against `commit`: the files git says differ (renames
    followed) and those it does not track, under PACKAGE."""
    root = tree.location

    def listed(*args: str) -> list[str]:
        done = _git(root, *args)
        if done.returncode:
            raise UsageError(f"--changed-against {text}: git {args[0]} failed in {root}: "
                             f"{done.stderr.decode(errors='replace').strip()[:300]}")
        return [word for word in done.stdout.decode(errors="surrogateescape").split("\0") if word]

    words = iter(listed("diff", "--name-status", "-z", "-M", "--relative", commit, "--", PACKAGE))
    pairs: list[tuple[str | None, str | None]] = []  # (path at the revision, path now)
    for status in words:
        old = next(words)
        new = next(words) if status[0] in "RC" else old
        pairs.append((None if status[0] == "A" else old, None if status[0] == "D" else new))
    untracked = listed("ls-files", "--others", "--exclude-standard", "-z", "--", PACKAGE)
    pairs += [(None, relpath) for relpath in untracked]

    def at_revision(relpath: str | None) -> str:
        if relpath is None:
            return ""
        done = _git(root, "show", f"{commit}:./{relpath}")
        return done.stdout.decode(errors="replace") if done.returncode == 0 else ""

    files = [_changed(tree, new, at_revision(old)) for old, new in pairs
             if new is not None and new.endswith(".py")]
    return Changes(against=text, base=f"git revision {commit[:12]} of {top}",
                   files=tuple(sorted((entry for entry in files if entry.lines),
                                      key=lambda entry: entry.file)),
                   removed=tuple(sorted(old for old, new in pairs if new is None and old
                                        and old.endswith(".py"))))


def _changed(tree: Source, relpath: str, before: str) -> ChangedFile:
    """A file of the tree against its text in BASE ("" where BASE lacks it)."""
    after = tree.read(relpath)
    if after == before:
        return ChangedFile(file=relpath, lines=())
    return ChangedFile(file=relpath, lines=tuple(
        ChangedLine(number, 0, None)
        for number in lines_changed(before.splitlines(), after.splitlines())))


def locate(changes: Changes, tree: Source, relpaths: Iterable[str]) -> Changes:
    """`changes` with the statement and function of each changed line of the files `relpaths`
    (the path's, whose lines the run records): parsing is the cost, so only theirs."""
    relpaths = set(relpaths)

    def located(entry: ChangedFile) -> ChangedFile:
        if entry.file not in relpaths:
            return entry
        statement, function = _statements(tree.read(entry.file), tree.filename(entry.file))
        return replace(entry, lines=tuple(ChangedLine(line.line, statement(line.line),
                                                      function(line.line))
                                          for line in entry.lines))

    return replace(changes, files=tuple(located(entry) for entry in changes.files))


def lines_changed(before: list[str], after: list[str]) -> list[int]:
    """The lines of `after` (1-based) that differ from `before`: those added or replaced, and
    where lines were only deleted, the line after the deletion (the last line where the deletion
    ends the file)."""
    found: set[int] = set()
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, _, _, first, last in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            found.update(range(first + 1, last + 1))
        elif tag == "delete" and after:
            found.add(min(first + 1, len(after)))
    return sorted(found)


def _statements(text: str, filename: str) -> tuple[Callable[[int], int],
                                                   Callable[[int], str | None]]:
    """For a line of the file: the first line of the statement holding it (0: none), counted
    as the line recorder counts them, and the innermost function whose text holds it."""
    from coverage.exceptions import CoverageException

    from pcpcheck.worker.release_lines import function_lines  # the recorder's own count
    try:
        parser, _ = function_lines(text, filename)
        tree = ast.parse(text)
    except (SyntaxError, ValueError, CoverageException):  # not Python: no statement claimed
        return (lambda line: 0), (lambda line: None)
    spans = sorted(_functions(tree, ""), key=lambda span: span[0])

    def statement(line: int) -> int:
        first = parser.first_line(line)
        return first if first in parser.statements else 0

    def function(line: int) -> str | None:
        inside = [name for start, end, name in spans if start <= line <= end]
        return inside[-1] if inside else None  # sorted by start: the last is the innermost

    return statement, function


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function under `node`, decorators
    included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                yield start, child.end_lineno or child.lineno, name
            yield from _functions(child, f"{name}.")
        else:
            yield from _functions(child, prefix)


__all__ = ["changes_against", "lines_changed", "locate"]
