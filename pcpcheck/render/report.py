"""The whole report of a CheckResult as the commands print it (`result_text`): the verdict
table, the coverage table, each shown counterexample (its text, written by the API from the
judge's words: pcpcheck.judge.explain), the summary lines, then a release's provenance (files,
path table, stand-ins, adaptations: the verdict first, what it rests on after it); the line
naming a release as its check starts, and the rates printed as a regime ends. It renders a
result and computes no verdict of its own."""

from __future__ import annotations

from pcpcheck.api.assemble import SAME_CHECK
from pcpcheck.judge import coverage
from pcpcheck.judge.explain import LEGEND
from pcpcheck.judge.verdict import PROTOCOL_ONLY
from pcpcheck.render.changed_lines import changed_text
from pcpcheck.search.scope import parse_scope
from pcpcheck.shared.protocol import LINES_MAX_GAP, SLOT_MAPPING, split_function
from pcpcheck.shared.results import NOT_EVALUATED
from pcpcheck_spec.names import DCP, DRAFT_REGIMES, HAZARD_REGIMES, LAYOUT, REPLICA, SHARD
from pcpcheck_spec.registry import ASYNC_IDS, BY_ID, GATHER_IDS, RELEASE_IDS


def folded_line(names: list[str]) -> str | None:
    """One line naming the counterexamples ("ID in regime") folded into a shown one."""
    if not names:
        return None
    return (f"  folded: {len(names)} more counterexample(s) whose first violated ID this case "
            f"violates too ({'; '.join(names)}), most likely the same bug; --json lists each")


def folded_name(folded, host) -> str:
    """A folded counterexample as folded_line names it: "ID in regime", and where the shown case
    violates its ID under the other name of the same check (REPLICA where D = 1, SHARD where
    D > 1: SAME_CHECK), which."""
    name = f"{folded.invariant} in {folded.regime}"
    check = SAME_CHECK.get(folded.invariant, folded.invariant)
    if any(v.invariant == folded.invariant for v in host.violations):
        return name
    other = next((v.invariant for v in host.violations
                  if SAME_CHECK.get(v.invariant, v.invariant) == check), None)
    if other is None:
        return name
    return f"{name}, {other}'s check where D {'>' if folded.regime == DCP else '='} 1"


def cell(checked: int, violated: int, note: int | None = None) -> str:
    """One regime x invariant of the verdict table (and of the HTML index); `note`: the number
    of the footnote that gives an n/a its reason (not_applicable_notes)."""
    if not checked:
        return "n/a" if note is None else f"n/a [{note}]"
    return f"{violated}/{checked} FAIL" if violated else f"{checked} ok"


# Where the two cache checks apply, and which covers the rest (spec/registry.py's regimes)
_CACHE_CHECKS = {SHARD: "checked only with DCP (D > 1); REPLICA covers D = 1",
                 REPLICA: "checked only where every rank holds the whole cache (D = 1); SHARD "
                          "covers DCP (D > 1)"}


def not_applicable_reason(result, summary, invariant: str) -> str:
    """Why a regime x invariant is n/a (checked on no case), in one line naming what it is
    about: the verdict tables' footnotes, JUnit's skipped case and the pytest item all give it
    (pcpcheck.render.junit.skip_reason)."""
    regime, why = summary.regime, summary.not_applicable
    if why:
        return (f"regime {regime} was {why}" if why.startswith(NOT_EVALUATED)
                else f"regime {regime} is not applicable to this target: {why}")
    entry = BY_ID.get(invariant)
    if entry is not None and regime not in entry.regimes:
        if invariant in _CACHE_CHECKS:
            return f"{invariant}: {_CACHE_CHECKS[invariant]}"
        if invariant in ASYNC_IDS:
            return (f"{invariant}: only an asynchronous protocol can break it, and it runs only "
                    f"where decodes are sharded (regime {', '.join(entry.regimes)})")
        return f"{invariant}: checked only in {', '.join(entry.regimes)}"
    if not summary.cases:
        return f"regime {regime}: no case ran" + (
            f" within the budget of {result.options.budget_s:g} s" if summary.budget_reached else "")
    if invariant == LAYOUT and regime in DRAFT_REGIMES and result.release is not None:
        slots = next((stage for stage in result.release.paths if stage.stage == SLOT_MAPPING),
                     None)
        if slots is not None:  # the path table says which draft steps the release lays out
            return (f"{LAYOUT} under {regime}: no manager lays a draft step out, and none of its "
                    f"maps was the release's own (path table, {SLOT_MAPPING}: "
                    f"{slots.status}{', ' if slots.reason else ''}{slots.reason})")
    features = dict(summary.features)
    if invariant in ASYNC_IDS and not features.get(coverage.ASYNC_STARTED) and any(
            features.get(f) for f in coverage.ASYNC_FEATURES):
        return (f"{invariant} under {regime}: the asynchronous protocol started on no step (it "
                f"fell back on {features.get(coverage.ASYNC_CAPTURED, 0)} under a graph capture "
                f"and on {features.get(coverage.ASYNC_DECLINED, 0)} where start answered False)")
    if invariant in ASYNC_IDS and any(features.get(f) for f in coverage.STREAM_FEATURES):
        return (f"{invariant} under {regime}: " + (
            "only an asynchronous protocol can break it (none runs: no --async); the gather's "
            "streams are judged" if invariant in PROTOCOL_ONLY else
            "the gather's file uses the stream API, and no step's gather used a stream but the "
            "main one"))
    if invariant in ASYNC_IDS:  # one reason, whatever the regime
        return ("ASYNC_*: no step's streams were judged here (the protocol runs only where "
                "decodes are sharded, and the gather's file uses no stream API)")
    if entry is not None and entry.needs_output:
        return (f"{invariant} under {regime}: it judges what a call returned, and no rank's call "
                "returned well-formed outputs (RETURNS)")
    return f"{invariant} under {regime}: evaluated on no case"


def not_applicable_notes(result, ids) -> tuple[dict[tuple[str, str], int], list[str]]:
    """The verdict table's n/a cells, (regime, invariant) -> the number of their reason's
    footnote (one per distinct not_applicable_reason, numbered in reading order), and the
    footnotes to print below the table: "[1] SHARD: checked only with DCP ..."."""
    numbers: dict[str, int] = {}
    marks = {}
    for invariant in ids:
        for summary in result.regimes:
            if not summary.count(invariant).checked:
                reason = not_applicable_reason(result, summary, invariant)
                marks[summary.regime, invariant] = numbers.setdefault(reason, len(numbers) + 1)
    return marks, [f"[{number}] {reason}" for reason, number in numbers.items()]


def verdict_table(results, ids=GATHER_IDS, notes=None) -> list[str]:
    """Per regime and invariant (`ids`: those of the checker): cases the predicate ran on, and
    on how many it failed; `notes`: (regime, invariant) -> the footnote of an n/a's reason."""
    regimes = [r.regime + (" [hazard]" if r.regime in HAZARD_REGIMES else "") for r in results]
    width = max(12, *(len(r) + 2 for r in regimes))
    lines = ["invariant".ljust(14) + "".join(r.rjust(width) for r in regimes)]
    for invariant in ids:
        cells = [cell(result.checked.get(invariant, 0), result.violated.get(invariant, 0),
                      (notes or {}).get((result.regime, invariant))).rjust(width)
                 for result in results]
        lines.append(invariant.ljust(14) + "".join(cells))
    return lines


def coverage_rows(results) -> tuple[list, list[tuple[str, list[str]]]]:
    """The regimes that counted coverage (results.RegimeSummary.branches, .features) and a row
    per gather branch and layout feature: per regime, its cases that took or exercised it (0:
    none did), or n/a where the regime's counts leave the feature out (no case of that kind of
    run can reach it: pcpcheck.judge.coverage.unreachable)."""
    results = [r for r in results if r.branches or r.features]
    if not results:
        return [], []
    rows = [(f"branch {b}", [str(dict(r.branches).get(b, 0)) for r in results])
            for b, _ in results[0].branches]
    names = list(dict.fromkeys([*coverage.FEATURES, *(f for r in results for f, _ in r.features)]))
    counts = [dict(r.features) for r in results]
    rows += [(f, [str(c[f]) if f in c else "n/a" for c in counts]) for f in names]
    return results, rows


def coverage_table(results) -> list[str]:
    """Per regime, the cases whose ranks took each gather branch and the cases that exercised
    each layout feature: 0 is what was never exercised, n/a what no case of the run could reach
    (coverage_rows)."""
    results, rows = coverage_rows(results)
    if not results:
        return []
    head = max(len(name) for name, _ in rows) + 2
    width = max(12, *(len(r.regime) + 2 for r in results))
    lines = ["coverage (cases)".ljust(head) + "".join(r.regime.rjust(width) for r in results)]
    lines += [name.ljust(head) + "".join(text.rjust(width) for text in cells)
              for name, cells in rows]
    return lines


def verdict_words(result) -> str:
    """The verdict in words, the same in the text report and the Markdown summary: violations
    counted as the verdict table's FAIL cells (a regime x invariant) outside the baseline, those
    in hazard regimes and those the baseline knows; then the counterexamples (one per invariant
    a regime violated, --json lists each), how many are shown and how many folded into them."""
    failures = result.failures
    known = len(result.baseline.known) if result.baseline else 0
    if failures:
        words = f"{len(failures)} violation(s) (regime x invariant)"
        hazards = sum(regime in HAZARD_REGIMES for regime, _ in failures)
        if hazards:
            words += f", {hazards} in hazard regimes"
        if known:
            words += f", {known} more known from the baseline"
    elif known:
        words = f"no violation outside the baseline ({known} known from it)"
    else:
        words = "every invariant holds"
    if result.incomplete:  # a merge lacking parts: what the parts present say, and no more
        missing = ", ".join(f"{k}/{result.shards}" for k in result.missing_shards)
        words = f"incomplete: shard {missing} missing (in the shards merged: {words})"
    if result.counterexamples:
        total = len(result.counterexamples)
        shown = sum(c.folded_into is None for c in result.counterexamples)
        words += f"; {total} counterexample(s), {shown} shown"
        if total > shown:
            words += f", {total - shown} folded into them"
    return words


def checked_ids(result) -> tuple[str, ...]:
    """The invariants a result's checker evaluates: a release's, else a gather's (and the
    streams': with `--async`, or where a gather's file uses the stream API)."""
    if result.release is not None:
        return RELEASE_IDS
    streams = split_function(result.options.function)[1] is not None or any(
        dict(summary.features).get(feature) for summary in result.regimes
        for feature in coverage.STREAM_FEATURES)
    return GATHER_IDS + ASYNC_IDS if streams else GATHER_IDS


def result_text(result) -> str:
    """The whole report of a CheckResult as `pcpcheck check` and `pcpcheck vllm` print it: the
    verdict table, each shown counterexample, and the summary lines."""
    ids = checked_ids(result)
    marks, notes = not_applicable_notes(result, ids)
    lines = ["", *verdict_table(result.regimes, ids, marks), *notes]
    covered = coverage_table(result.regimes)
    if covered:
        lines += ["", *covered]
    shown = [k for k, c in enumerate(result.counterexamples) if c.folded_into is None]
    if shown:
        lines += ["", LEGEND]
    for number, index in enumerate(shown, 1):
        counterexample = result.counterexamples[index]
        baselined = " (known: in the baseline)" if counterexample.known else ""
        lines += ["", f"Counterexample {number}{baselined}: {counterexample.report}"]
        folded = folded_line([folded_name(c, counterexample)
                              for c in result.counterexamples if c.folded_into == index])
        if folded:
            lines.append(folded)
    summary = verdict_words(result)
    slowest = max(result.regimes, key=lambda s: s.slowest_call)
    timeout = result.options.timeout
    if slowest.slowest_call >= 0.1 * timeout:  # a slow target: where its time goes, what to do
        lines += ["", f"calls: the slowest took {slowest.slowest_call:.2f} s ({slowest.regime}; mean "
                  f"{slowest.mean_call:.2f} s per case) of the {timeout:g} s a rank may take per "
                  "case: raise --timeout if a correct call can take longer, lower --max-examples "
                  "to finish sooner"]
    lines += ["", f"all regimes: {rates(*result.regimes, wall=result.seconds)}: {summary}"]
    if result.options.scope is not None:
        lines.append(exhaustive_line(result, summary))
    if any(s.budget_reached for s in result.regimes):
        lines.append(f"budget of {result.options.budget_s:g} s reached; cases per regime: "
                     + ", ".join(f"{s.regime} {s.cases}" for s in result.regimes))
    if result.baseline and result.baseline.fixed:
        lines.append(f"no longer found, remove from {result.baseline.path}: " + "; ".join(
            f"{regime} {invariant}" for regime, invariant in result.baseline.fixed))
    if result.release is not None:  # the verdict first, then where it comes from
        lines += ["", *release_evidence(result), *changed_text(result)]
    return "\n".join(lines)


def release_evidence(result) -> list[str]:
    """A release's provenance (release_provenance), each real stage of its path table with the
    steps it ran."""
    record = result.release
    run = [s for s in result.regimes if s.not_applicable is None]
    return [f"what the verdict above rests on: {result.target_name} ({record.kind} "
            f"{record.location})", *release_provenance(record, result.stand_ins, run)]


def stage_steps(stage: str, regimes) -> str:
    """How many of the regimes' steps a real stage ran: "" where it ran on every one, else "on N
    of M steps (regime n/m, ...)"."""
    ran = [dict(s.real_stages).get(stage, 0) for s in regimes]
    total = sum(s.cases for s in regimes)
    if sum(ran) == total:
        return ""
    return (f"on {sum(ran)} of {total} steps ("
            + ", ".join(f"{s.regime} {n}/{s.cases}" for s, n in zip(regimes, ran)) + ")")


def exhaustive_line(result, summary: str) -> str:
    """What an exhaustive check covered: the steps its scope holds and how many ran."""
    searched = [s for s in result.regimes if s.scope_steps is not None]
    total, ran = sum(s.scope_steps for s in searched), sum(s.cases for s in searched)
    within = f"within {parse_scope(result.options.scope).describe()}"
    per_regime = " (" + ", ".join(f"{s.regime} {s.scope_steps:,}" for s in searched) + ")"
    if all(s.complete for s in searched):
        return f"exhaustive: {total:,} steps{per_regime} {within}: {summary}"
    why = ("the budget ran out" if any(s.budget_reached for s in searched) else
           "each regime stopped once the steps of its first violation's size were done: each "
           "counterexample is a smallest step of its regime, found without shrinking")
    return f"exhaustive: {ran:,} of {total:,} steps{per_regime} {within} checked: {why}"


def release_title(record, name: str) -> str:
    """The line that names what `pcpcheck vllm` checks (a results.ReleaseRecord)."""
    return f"pcpcheck: checking {name} ({record.kind} {record.location})"


def release_header(record, name: str, stand_ins) -> list[str]:
    """What `pcpcheck vllm` checked (a results.ReleaseRecord): its title, then its provenance
    (release_provenance)."""
    return [release_title(record, name), *release_provenance(record, stand_ins)]


def release_provenance(record, stand_ins, regimes=()) -> list[str]:
    """Where a release's verdict comes from (a results.ReleaseRecord): files, layout model,
    capabilities, the path table (with the `regimes`' steps each real stage ran on, where they are
    known, and the lines each real file's functions ran, where the record has them), stand-ins,
    adaptations. The report prints it after the verdict (result_text), a replay after the
    title."""
    caps = record.capabilities
    lines = [f"  files read: {len(record.files)} (the path's below; every sha256 in --json)"]
    lines.append(f"  layout model: reference era {record.layout_model} "
                 f"({'0.26-0.29 manager' if record.layout_model == '0.26' else 'section 2, 0.30 on'})")
    lines.append(f"  capabilities: decode sharding {'yes' if caps['manager_shards'] else 'no'}, "
                 f"gather shard flag {'yes' if caps['gather_shard'] else 'no'}, wrapper keyword "
                 f"{caps['wrapper_shard_keyword'] or '-'}, graph padding "
                 f"{'yes' if caps['graph_padding'] else 'no'}")
    if record.paths:
        lines.append("  path (real: the release's own code runs; modeled: pcpcheck's restatement):")
    counted: set[str] = set()  # files sharing a path say their lines run once
    for stage in record.paths:
        where = (f"{stage.file}  {lines_run(record, stage.file, counted)}{stage.sha256}"
                 if stage.status == "real" else stage.reason)
        lines.append(f"    {stage.stage:<27} {stage.status:<8} {where}")
        steps = stage_steps(stage.stage, regimes) if regimes and stage.status == "real" else ""
        if steps:  # a real stage that did not run on every step: how often, and why
            lines.append(f"    {'':<27} {'':<8} {steps}" + (f": {stage.reason}" if stage.reason else ""))
        elif stage.status == "real" and stage.reason:
            lines.append(f"    {'':<27} {'':<8} ({stage.reason})")
    if record.lines:
        lines.append(f"    lines run: {lines_traced(record)}; each in --json, marked in --html")
    lines += [f"  stood in for (cannot run here): {line}" for line in stand_ins]
    lines += [f"  adapted: {note}" for note in record.adapted]
    return lines


def lines_run(record, relpath: str, counted: set[str]) -> str:
    """"N/M lines run  ": of the executable lines in the functions of a real file of the path,
    those the run's steps ran; "" where the record has none, or `counted` holds the file."""
    entry = record.file_lines(relpath)
    if entry is None or relpath in counted:
        return ""
    counted.add(relpath)
    return f"{len(entry.run)}/{len(entry.functions)} lines run  "


def lines_traced(record) -> str:
    """What "N/M lines run" counts, and on which steps (pcpcheck.worker.release_lines)."""
    which = ("every step traced" if record.lines_traced == record.lines_steps > 0 else
             f"traced on {record.lines_traced} of {record.lines_steps} steps: every step while "
             f"steps ran new lines, then down to one in {LINES_MAX_GAP + 1}")
    return (f"of the executable lines in a real file's functions, those the traced steps ran "
            f"({which})")


def rates(*results, wall: float = 0.0) -> str:
    """Cases, the seconds they took and the one rate they make, end to end (drawing, shrinking,
    running and judging: `check_seconds`, running and judging alone, is in the JSON). `wall`:
    the seconds the results took together, when they ran at once (--jobs); else the sum of
    theirs."""
    cases = sum(r.cases for r in results)
    if wall:  # the regimes' own times overlapped: the wall clock is the end-to-end time
        return f"{cases:>6} cases in {wall:5.1f} s wall, worker start included: {cases / wall:5.0f} cases/s"
    seconds = sum(r.seconds for r in results)
    return (f"{cases:>6} cases in {seconds:5.1f} s: "
            f"{cases / seconds if seconds else 0:5.0f} cases/s end to end")
