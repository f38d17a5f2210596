"""`--summary FILE`: the verdict as Markdown, for a CI job's summary page (the GitHub Action
appends it to `$GITHUB_STEP_SUMMARY`): a headline, the verdict table with the report's cells
(each regime x invariant marked with its outcome, as JUnit and the pytest items give it), the
regimes not applicable and why, what an exhaustive run covered, whether the budget cut the run
short, and the first line of each shown counterexample."""

from __future__ import annotations

from pcpcheck.render.report import cell, checked_ids, exhaustive_line, verdict_words
from pcpcheck.shared.results import unreached
from pcpcheck_spec.names import HAZARD_REGIMES

_MARK = {"failed": " **new**", "known": " (known)", "passed": "", "n/a": ""}


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def summary_markdown(result) -> str:
    ids = checked_ids(result)
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
            cells.append(cell(count.checked, count.violated) + _MARK[state])
        lines.append(f"| {invariant} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("cases per regime: " + ", ".join(f"{s.regime} {s.cases}" for s in result.regimes))
    if result.options.scope is not None:  # the bounded claim, or how much of it was checked
        lines += ["", _escape(exhaustive_line(result, verdict))]
    if any(s.budget_reached for s in result.regimes):
        lines += ["", f"The budget of {result.options.budget_s:g} s was reached: the counts are "
                  "of the cases checked before it."]
    for summary in result.regimes:
        if summary.not_applicable:
            lines.append(f"- {summary.regime}: {_escape(unreached(summary.not_applicable, 'not applicable: '))}")
    shown = [c for c in result.counterexamples if c.folded_into is None]
    if shown:
        lines += ["", "Counterexamples (the whole report, JSON and pages are in the artifacts):", ""]
        lines += [f"- {'known: ' if c.known else ''}`{c.report.splitlines()[0].strip()}`"
                  for c in shown]
    if result.baseline and result.baseline.fixed:
        lines += ["", f"No longer found, remove from `{result.baseline.path}`: " + "; ".join(
            f"{regime} {invariant}" for regime, invariant in result.baseline.fixed)]
    return "\n".join(lines) + "\n"
