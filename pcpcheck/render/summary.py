"""`--summary FILE`: the verdict as Markdown, for a CI job's summary page (the GitHub Action
appends it to `$GITHUB_STEP_SUMMARY`): a headline, the verdict table with the report's cells
(each regime x invariant marked with its outcome, as JUnit and the pytest items give it, each
n/a with its reason's footnote), what an exhaustive run covered, whether the budget cut the run
short, and the first line of each shown counterexample, with where the rest of it is."""

from __future__ import annotations

import os

from pcpcheck.render.changed_lines import changed_markdown
from pcpcheck.render.report import (
    cell,
    checked_ids,
    exhaustive_line,
    not_applicable_notes,
    verdict_words,
)
from pcpcheck_spec.names import HAZARD_REGIMES

_MARK = {"failed": " **new**", "known": " (known)", "passed": "", "n/a": ""}


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _where_the_rest_is(written: dict[str, str]) -> str:
    """Where a reader of the summary finds each counterexample in full: in GitHub Actions, the
    artifacts (the Action uploads them; GitHub sets GITHUB_ACTIONS); elsewhere the files this
    run wrote (`written`: "json", "html" -> path), else the command's own output."""
    if os.environ.get("GITHUB_ACTIONS") == "true":
        return "the whole report, JSON and pages are in the artifacts"
    files = [f"{what}`{written[name]}`" for name, what in (("json", ""), ("html", "the pages from "))
             if name in written]
    return "each in full in " + " and ".join(files) if files else \
        "the whole report is the command's output"


def summary_markdown(result, written: dict[str, str] | None = None) -> str:
    """The summary; `written`: the outputs this run wrote that hold every counterexample in full
    ("json": its file, "html": the index page), which it names outside GitHub Actions."""
    ids = checked_ids(result)
    marks, notes = not_applicable_notes(result, ids)
    record = result.release
    checked = (f"vLLM {record.release} ({record.kind} {record.location})" if record is not None
               else result.target_name)
    verdict = verdict_words(result)  # the text report's words
    lines = [f"### pcpcheck {result.version}: {_escape(checked)}: {verdict}", ""]
    regimes = [s.regime + (" (hazard)" if s.regime in HAZARD_REGIMES else "")
               for s in result.regimes]
    lines.append("| invariant | " + " | ".join(regimes) + " |")
    lines.append("|---|" + "---:|" * len(regimes))
    for invariant in ids:
        cells = []
        for summary in result.regimes:
            count = summary.count(invariant)
            state, _ = result.outcome(summary.regime, invariant)
            cells.append(cell(count.checked, count.violated, marks.get((summary.regime, invariant)))
                         + _MARK[state])
        lines.append(f"| {invariant} | " + " | ".join(cells) + " |")
    lines.append("")
    if notes:
        lines += [f"- {_escape(note)}" for note in notes] + [""]
    lines.append("cases per regime: " + ", ".join(f"{s.regime} {s.cases}" for s in result.regimes))
    if result.options.scope is not None:  # the bounded claim, or how much of it was checked
        lines += ["", _escape(exhaustive_line(result, verdict))]
    if any(s.budget_reached for s in result.regimes):
        lines += ["", f"The budget of {result.options.budget_s:g} s was reached: the counts are "
                  "of the cases checked before it."]
    shown = [c for c in result.counterexamples if c.folded_into is None]
    if shown:
        lines += ["", f"Counterexamples ({_where_the_rest_is(written or {})}):", ""]
        lines += [f"- {'known: ' if c.known else ''}`{c.report.splitlines()[0].strip()}`"
                  for c in shown]
    if result.baseline and result.baseline.fixed:
        lines += ["", f"No longer found, remove from `{result.baseline.path}`: " + "; ".join(
            f"{regime} {invariant}" for regime, invariant in result.baseline.fixed)]
    lines += changed_markdown(result)  # --changed-against: which changed lines ran
    return "\n".join(lines) + "\n"
