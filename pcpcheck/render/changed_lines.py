"""`--changed-against BASE` rendered: which changed lines of the path's files the run's steps
ran, which none did (not exercised, with the regimes and the scope that were tried) and which no
claim is made about, as the text report's section (after the path table), the Markdown summary's
and the pytest plugin's terminal summary. The reach of each line is the record's
(pcpcheck.shared.changed.reach); nothing here is a verdict, and no line changes the exit code."""

from __future__ import annotations

from pcpcheck.search.scope import parse_scope
from pcpcheck.shared.changed import NOT_COUNTED, NOT_EXERCISED, OUTSIDE, PATH, RAN, READ, spans
from pcpcheck.shared.defaults import MIN_RANKS

LISTED = 20  # changed files outside the path named before "N more"
LISTED_LINES = 50  # runs of lines not exercised listed before "N more" (--json has every line)
NOT_COUNTED_WORDS = ("not counted (a blank line, a comment, a signature, or code outside every "
                     "function's body: no claim)")
OUTSIDE_WORDS = "outside the path pcpcheck runs (no claim either way)"
READ_WORDS = "read by the run, its lines not recorded (no claim either way)"
EXIT_WORDS = "information only: lines not exercised leave the exit code the verdict's"


def tried(result) -> str:
    """The regimes and the scope the run tried: what a line not exercised was not run on."""
    options = result.options
    ran = [f"{s.regime} {s.cases} steps" for s in result.regimes if not s.not_applicable]
    unreached = [s.regime for s in result.regimes if s.not_applicable]
    words = "regimes " + (", ".join(ran) or "none")
    if unreached:
        words += f" ({', '.join(unreached)} not applicable)"
    if options.scope is not None:
        words += f"; exhaustive, within {parse_scope(options.scope).describe()}"
    else:
        seed = "derandomized" if options.seed is None else f"seed {options.seed}"
        words += (f"; random, --max-examples {options.max_examples}, P {MIN_RANKS}.."
                  f"{options.max_ranks}, {seed}")
    if any(s.budget_reached for s in result.regimes):
        words += f"; cut short by the budget of {options.budget_s:g} s"
    return words


def no_step_ran(record) -> str:
    """"no step ran", and on which steps it rests (pcpcheck.worker.release_lines: with changed
    lines, every step is traced while one of them has not run)."""
    if not record.lines_steps:
        return "no step ran (the run ran none)"
    if record.lines_traced == record.lines_steps:
        return f"no step ran (all {record.lines_steps} traced)"
    return (f"no traced step ran ({record.lines_traced} of the {record.lines_steps} steps "
            "traced)")


def not_exercised(entries) -> list[tuple[str, str | None]]:
    """The changed lines of the path's files that no step ran, per file and function: (FILE:LINES,
    the function), consecutive lines as one run; past LISTED_LINES of them, how many more."""
    found: list[tuple[str, str | None]] = []
    for entry in entries:
        by_function: dict[str | None, list[int]] = {}
        for line in entry.having(NOT_EXERCISED):
            by_function.setdefault(line.function, []).append(line.line)
        found += [(f"{entry.file}:{spans(numbers)}", function)
                  for function, numbers in by_function.items()]
    if len(found) > LISTED_LINES:
        found = [*found[:LISTED_LINES], (f"{len(found) - LISTED_LINES} more (--json lists each)",
                                         None)]
    return found


def _count(entry, reach: str) -> str:
    lines = entry.having(reach)
    label = reach.upper() if reach == NOT_EXERCISED else reach
    return f"{len(lines)} {label} ({spans(line.line for line in lines)})" if lines else ""


def _named(names: list[str]) -> str:
    if len(names) > LISTED:
        names = [*names[:LISTED], f"{len(names) - LISTED} more (--json lists each)"]
    return ", ".join(names)


def elsewhere(record) -> list[str]:
    """The changed files outside the path's recorded files, and those BASE had, one line each
    (no claim either way)."""
    entries, found = record.changed(), []
    for where, words in ((READ, READ_WORDS), (OUTSIDE, OUTSIDE_WORDS)):
        names = [f"{entry.file} ({_lines(len(entry.lines))})" for entry in entries
                 if entry.where == where]
        if names:
            found.append(f"{words}: {_named(names)}")
    if record.changes.removed:
        found.append(f"removed since {record.changes.against}: "
                     f"{_named(list(record.changes.removed))}")
    return found


def _changed_path(result):
    """(the release record, its changed files' entries, those of the path's files), None
    without --changed-against."""
    record = result.release
    if record is None or record.changes is None:
        return None
    entries = record.changed()
    return record, entries, [entry for entry in entries if entry.where == PATH]


def changed_text(result) -> list[str]:
    """The text report's section (after the path table); [] without --changed-against."""
    found = _changed_path(result)
    if found is None:
        return []
    record, entries, path = found
    lines = ["", f"changed lines against {record.changes.against} ({record.changes.base}), "
                 "numbered as in the tree checked:"]
    if not path:
        lines.append("  no file of the path pcpcheck runs changed" if entries else
                     "  no Python file under vllm/ differs")
    width = max((len(entry.file) for entry in path), default=0)
    for entry in path:
        counts = [_count(entry, reach) for reach in (RAN, NOT_EXERCISED, NOT_COUNTED)]
        lines.append(f"  {entry.file:<{width}}  {len(entry.lines)} changed: "
                     + ", ".join(c for c in counts if c))
    missed = not_exercised(path)
    if missed:
        lines.append(f"  NOT EXERCISED, changed lines of the path's functions that "
                     f"{no_step_ran(record)}; tried: {tried(result)}:")
        lines += [f"    {where}" + (f" in {function}" if function else "")
                  for where, function in missed]
    if any(entry.having(NOT_COUNTED) for entry in path):
        lines.append(f"  {NOT_COUNTED_WORDS}")
    lines += [f"  {text}" for text in elsewhere(record)]
    if path:
        lines.append(f"  ({EXIT_WORDS})")
    return lines


def changed_markdown(result) -> list[str]:
    """The Markdown summary's section; [] without --changed-against."""
    found = _changed_path(result)
    if found is None:
        return []
    record, _, path = found
    lines = ["", f"#### Changed lines against `{record.changes.against}` "
                 f"({record.changes.base})", ""]
    if path:
        lines += ["| file of the path | changed | ran | not exercised | not counted |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| `{entry.file}` | {len(entry.lines)} | " + " | ".join(
            str(len(entry.having(reach))) for reach in (RAN, NOT_EXERCISED, NOT_COUNTED)) + " |"
            for entry in path]
        lines.append("")
    else:
        lines += ["No file of the path pcpcheck runs changed.", ""]
    missed = not_exercised(path)
    if missed:
        lines += [f"**Not exercised**: changed lines of the path's functions that "
                  f"{no_step_ran(record)}; tried: {tried(result)}:", ""]
        lines += [f"- `{where}`" + (f" in `{function}`" if function else "")
                  for where, function in missed]
        lines.append("")
    lines += [text for line in elsewhere(record) for text in (_capital(line), "")]
    if path:
        lines.append(f"{_capital(EXIT_WORDS)}.")
    return lines


def _lines(count: int) -> str:
    return f"{count} line" + ("" if count == 1 else "s")


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]
