"""The whole report of a CheckResult as the commands print it (`result_text`): the verdict
table, the coverage table, each shown counterexample (its text, written by the API from the
judge's words: pcpcheck.judge.explain), the summary lines; a release's header, and the rates
printed as a regime ends. It renders a result and computes no verdict of its own."""

from __future__ import annotations

from pcpcheck.judge.explain import LEGEND
from pcpcheck.search.scope import parse_scope
from pcpcheck.shared.protocol import STAGES
from pcpcheck_spec.names import HAZARD_REGIMES
from pcpcheck_spec.registry import GATHER_IDS, RELEASE_IDS


def folded_line(names: list[str]) -> str | None:
    """One line naming the counterexamples ("ID in regime") folded into a shown one."""
    if not names:
        return None
    return (f"  folded: {len(names)} more counterexample(s) this case also shows "
            f"({'; '.join(names)}), most likely the same bug; --json lists each")


def cell(checked: int, violated: int) -> str:
    """One regime x invariant of the verdict table (and of the HTML index)."""
    if not checked:
        return "n/a"
    return f"{violated}/{checked} FAIL" if violated else f"{checked} ok"


def verdict_table(results, ids=GATHER_IDS) -> list[str]:
    """Per regime and invariant (`ids`: those of the checker): cases the predicate ran on, and
    on how many it failed."""
    regimes = [r.regime + (" [hazard]" if r.regime in HAZARD_REGIMES else "") for r in results]
    width = max(12, *(len(r) + 2 for r in regimes))
    lines = ["invariant".ljust(14) + "".join(r.rjust(width) for r in regimes)]
    for invariant in ids:
        cells = [cell(result.checked.get(invariant, 0), result.violated.get(invariant, 0)).rjust(width)
                 for result in results]
        lines.append(invariant.ljust(14) + "".join(cells))
    return lines


def coverage_table(results) -> list[str]:
    """Per regime, the cases whose ranks took each gather branch and the cases that exercised
    each layout feature (results.RegimeSummary.branches, .features): 0 is what was never
    exercised."""
    results = [r for r in results if r.branches or r.features]
    if not results:
        return []
    rows = [(f"branch {b}", [dict(r.branches).get(b, 0) for r in results])
            for b, _ in results[0].branches]
    rows += [(f, [dict(r.features).get(f, 0) for r in results]) for f, _ in results[0].features]
    head = max(len(name) for name, _ in rows) + 2
    width = max(12, *(len(r.regime) + 2 for r in results))
    lines = ["coverage (cases)".ljust(head) + "".join(r.regime.rjust(width) for r in results)]
    lines += [name.ljust(head) + "".join(str(n).rjust(width) for n in counts)
              for name, counts in rows]
    return lines


def result_text(result) -> str:
    """The whole report of a CheckResult as `pcpcheck check` and `pcpcheck vllm` print it: the
    verdict table, each shown counterexample, and the summary lines."""
    ids = RELEASE_IDS if result.release is not None else GATHER_IDS
    lines = ["", *verdict_table(result.regimes, ids)]
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
        folded = folded_line([f"{c.invariant} in {c.regime}"
                              for c in result.counterexamples if c.folded_into == index])
        if folded:
            lines.append(folded)
    new, known = len(result.new_violations), len(result.counterexamples) - len(result.new_violations)
    summary = (f"{new} violation(s), {len(shown)} shown" if new
               else "no violation outside the baseline" if known else "every invariant holds")
    hazards = sum(c.hazard for c in result.new_violations)
    if hazards:
        summary += f", {hazards} in hazard regimes"
    if known:
        summary += f", {known} known violation(s) from the baseline"
    slowest = max(result.regimes, key=lambda s: s.slowest_call)
    timeout = result.options.timeout
    if slowest.slowest_call >= 0.1 * timeout:  # a slow target: where its time goes, what to do
        lines += ["", f"calls: the slowest took {slowest.slowest_call:.2f} s ({slowest.regime}; mean "
                  f"{slowest.mean_call:.2f} s per case) of the {timeout:g} s a rank may take per "
                  "case: raise --timeout if a correct call can take longer, lower --max-examples "
                  "to finish sooner"]
    if result.release is not None:
        lines += ["", "steps run by the release's own code, per stage of the path table:"]
        for s in result.regimes:
            if s.not_applicable is None:
                counts = dict(s.real_stages)
                lines.append(f"  {s.regime:<12} {s.cases} steps: " + ", ".join(
                    f"{stage} {counts[stage]}" for stage in STAGES if stage in counts))
    lines += ["", f"all regimes: {rates(*result.regimes, wall=result.seconds)}: {summary}"]
    if result.options.scope is not None:
        lines.append(exhaustive_line(result, summary))
    if any(s.budget_reached for s in result.regimes):
        lines.append(f"budget of {result.options.budget_s:g} s reached; cases per regime: "
                     + ", ".join(f"{s.regime} {s.cases}" for s in result.regimes))
    if result.baseline and result.baseline.fixed:
        lines.append(f"no longer found, remove from {result.baseline.path}: " + "; ".join(
            f"{regime} {invariant}" for regime, invariant in result.baseline.fixed))
    return "\n".join(lines)


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


def release_header(record, name: str, stand_ins) -> list[str]:
    """What `pcpcheck vllm` checked (a results.ReleaseRecord): files, layout model,
    capabilities, stand-ins, adaptations."""
    caps = record.capabilities
    lines = [f"pcpcheck: checking {name} ({record.kind} {record.location})",
             f"  files read: {len(record.files)} (the path's below; every sha256 in --json)"]
    lines.append(f"  layout model: reference era {record.layout_model} "
                 f"({'0.26-0.29 manager' if record.layout_model == '0.26' else 'section 2, 0.30 on'})")
    lines.append(f"  capabilities: decode sharding {'yes' if caps['manager_shards'] else 'no'}, "
                 f"gather shard flag {'yes' if caps['gather_shard'] else 'no'}, wrapper keyword "
                 f"{caps['wrapper_shard_keyword'] or '-'}, graph padding "
                 f"{'yes' if caps['graph_padding'] else 'no'}")
    if record.paths:
        lines.append("  path (real: the release's own code runs; modeled: pcpcheck's restatement):")
    for stage in record.paths:
        where = (f"{stage.file}  {stage.sha256}" if stage.status == "real" else stage.reason)
        lines.append(f"    {stage.stage:<27} {stage.status:<8} {where}")
        if stage.status == "real" and stage.reason:
            lines.append(f"    {'':<27} {'':<8} ({stage.reason})")
    lines += [f"  stood in for (cannot run here): {line}" for line in stand_ins]
    lines += [f"  adapted: {note}" for note in record.adapted]
    return lines


def rates(*results, wall: float = 0.0) -> str:
    """Cases, and cases per second end to end and for running and judging alone (the rank
    runner's hot loop; the rest is drawing and shrinking). `wall`: the seconds the results took
    together, when they ran at once (--jobs); else the sum of theirs."""
    cases = sum(r.cases for r in results)
    if wall:  # the regimes' own run+judge times overlapped: only the end-to-end rate is meaningful
        return f"{cases:>6} cases in {wall:5.1f} s wall, worker start included: {cases / wall:5.0f} cases/s"
    seconds = sum(r.seconds for r in results)
    checking = sum(r.check_seconds for r in results)
    return (f"{cases:>6} cases in {seconds:5.1f} s: {cases / seconds if seconds else 0:5.0f} cases/s, "
            f"{cases / checking if checking else 0:5.0f} cases/s run+judge")
