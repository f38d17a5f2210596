"""Human-readable reports: the verdict table and counterexamples a reviewer reads in a minute,
the whole report of a CheckResult (`result_text`), a diff's side-by-side text, and a release's
header. The counterexample texts are written by the API into its result; the rest renders one."""

from __future__ import annotations

import shlex

from pcpcheck.cases import describe
from pcpcheck.shared.messages import STAGES
from pcpcheck_spec.names import DCP, HAZARD_REGIMES, INCOMPLETE, NO_ROW
from pcpcheck_spec.registry import GATHER_IDS, RELEASE_IDS


def label(value: int) -> str:
    if value >= 0:
        return f"t{value}"
    return "??" if value == NO_ROW else "pad"


def rows_text(rows: list[int]) -> str:
    return "[" + " ".join(label(v) for v in rows) + "]"


def slots_text(slots) -> str:
    return "[" + " ".join(str(int(s)) for s in slots) + "]"


def replay_command(source: str, observation, function: str | None = None) -> str:
    words = ["pcpcheck", "check", source]
    if function:
        words += ["--function", function]
    words += ["--replay", observation.prepared.case.to_json()]
    return shlex.join(words)


LEGEND = """\
How to read this report:
  verdict table: "40 ok": the predicate ran on 40 cases (shrinking included) and held on each;
    "3/40 FAIL": it failed on 3 of the 40 cases it ran on; "n/a": it does not apply there
  batch: regime, P = PCP ranks, B = block size (slots per KV block); decode(q) / prefill(q, ctx c):
    a request scheduling q tokens after c cached ones; draft(q): a speculative block of q tokens
  t3->17: token 3 (tokens numbered in batch order) belongs at cache slot 17 on every rank;
    t3->17@r1 (dcp): at slot 17 on rank 1, the one rank that owns it
  rows [t0 t3 pad ??]: a tensor's rows by the token each carries: pad = a padding row,
    ?? = a row that is no input row; slots [5 -1]: the slot mapping (-1: not written)
  nd: the num_decode_tokens passed on that rank
  collectives: all_gather 0 (6, 4) torch.float32 = an all_gather along dim 0 of a (6, 4) tensor
  [hazard]: a violation in a hazard regime (latent in vLLM, checked on request)"""


def token_table(observation) -> list[str]:
    """Which token belongs to which request and slot(s), one line per request."""
    batch = observation.prepared.case.batch
    lines, token = [], 0
    owners = {}
    for rank, expected in enumerate(observation.prepared.expected):
        for slot, tok in expected.items():
            owners.setdefault(tok, []).append(f"{slot}" + (f"@r{rank}" if batch.regime == DCP else ""))
    for index, request in enumerate(batch.requests):
        kind = "prefill" if request.prefilling else "decode"
        if batch.num_decode_tokens is not None:  # draft-mixed: how the kernel classifies it
            kind = f"draft block, kernel: {'decode' if token < batch.num_decode_tokens else 'prefill'}"
        ids = range(token, token + request.num_tokens)
        placed = ", ".join(f"t{t}->{'/'.join(sorted(set(owners.get(t, ['-']))))}" for t in ids)
        lines.append(f"    req {index} {kind}, {request.num_tokens} token(s): {placed or 'no rows'}")
        token += request.num_tokens
    return lines


def cache_diff(observation, rank: int, tensor: int = 0) -> list[str]:
    expected = observation.prepared.expected[rank]
    actual = observation.ranks[rank].caches[tensor] if observation.ranks[rank].caches else {}
    diffs = []
    for slot in sorted(set(expected) | set(actual)):
        want, got = expected.get(slot), actual.get(slot)
        if want != got:
            if got is None:
                diffs.append(f"slot {slot}: expected {label(want)}, not written")
            elif want is None:
                diffs.append(f"slot {slot}: expected nothing, written with {label(got)}")
            else:
                diffs.append(f"slot {slot}: expected {label(want)}, holds {label(got)}")
    return diffs


def call_text(observation, target=None) -> str:
    """What the target (its TargetInfo) was called with on every rank (inputs listed below)."""
    name = getattr(target, "function_name", "") or "gather"
    shard = observation.prepared.shard
    if target is None or target.accepts_shard:
        return f"{name}(tensors, slot_mapping, nd, shard_decode_requests={shard})"
    note = "; the layout deals decodes round-robin, the flag could not be passed" if shard else ""
    return f"{name}(tensors, slot_mapping, nd) (no shard_decode_requests parameter{note})"


def counterexample(observation, regime: str, source: str,
                   function: str | None = None, target=None, replays=None) -> str:
    """`target`: the loaded target's metadata (what it was called with); `replays`
    (minimize.Replays): how often the case showed the violation again, if replayed."""
    first = observation.violations[0]
    prepared = observation.prepared
    hazard = " [hazard]" if regime in HAZARD_REGIMES else ""
    flaky = replays is not None and replays.flaky
    lines = [f"{first.invariant} violated{hazard} on rank(s) {first.ranks} (regime {regime})"
             + (", FLAKY" if flaky else "")]
    if flaky:
        lines.append(f"  flaky: {replays.reproduced} of {replays.runs} replays of this case showed "
                     "it again: the target does not behave the same on the same case, so this "
                     "case may not be the smallest")
    if getattr(observation, "note", ""):  # how its shrinking ended, when it ended early
        lines.append(f"  shrinking: {observation.note}")
    others = [f"{v.invariant} on {v.ranks}" for v in observation.violations[1:]]
    if others:
        lines.append("  also violated: " + "; ".join(others))
    lines.append(f"  batch: {describe(prepared.case)}")
    lines.append("  tensors: " + ", ".join(f"{s.dtype}{list(s.trailing)}" for s in prepared.case.tensors))
    lines += token_table(observation)
    lines.append(f"  call: {call_text(observation, target)}")
    for rank, view in enumerate(observation.ranks):
        lines.append(f"  rank {rank}: in  rows {rows_text(prepared.tokens[rank].tolist())} "
                     f"slots {slots_text(prepared.slot_maps[rank])} nd={prepared.nds[rank]}")
        if view.error:
            lines.append(f"          error: {view.error}")
        elif not view.returned:
            lines.append("          no output: the call did not complete")
        else:
            lines.append(f"          out rows {rows_text(view.rows[0]) if view.rows else '-'} "
                         f"slots {slots_text(view.slots)}")
        for k in range(1, len(view.rows)):
            if view.rows[k] != view.rows[0]:
                lines.append(f"          out rows of tensor {k} {rows_text(view.rows[k])}")
        if view.trace:
            lines.append("          collectives: " + "; ".join(" ".join(map(str, e)) for e in view.trace))
        if view.output.strip():
            printed = view.output.strip().splitlines()
            lines.append(f"          printed: {printed[0][:120]}"
                         + (f" (+{len(printed) - 1} more lines)" if len(printed) > 1 else ""))
        if view.mutated:
            lines.append("          mutated inputs: " + ", ".join(view.mutated))
        diffs = cache_diff(observation, rank)
        if diffs:
            lines.append("          cache diff: " + "; ".join(diffs))
    lines.append("  replay: " + replay_command(source, observation, function))
    return "\n".join(lines)


def fold(counterexamples) -> list[int | None]:
    """Per counterexample (regime, observation), in report order: None when it is shown, else
    the index of the shown one it folds into: the shown case also violates the invariant this
    one is reported under, so both are most likely the same bug (hypothesis shrinks each first
    violated invariant on its own)."""
    shown: list[int] = []
    into: list[int | None] = []
    for index, (_, observation) in enumerate(counterexamples):
        first = observation.violations[0].invariant
        host = next((k for k in shown if first in
                     {v.invariant for v in counterexamples[k][1].violations}), None)
        into.append(host)
        if host is None:
            shown.append(index)
    return into


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
        known = " (known: in the baseline)" if counterexample.known else ""
        lines += ["", f"Counterexample {number}{known}: {counterexample.report}"]
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
    from pcpcheck.scope import parse_scope
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
    lines = [f"pcpcheck: checking {name} ({record.kind} {record.location})", "  files read (sha256):"]
    lines += [f"    {path}  {digest}" for path, digest in record.files]
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
    if stand_ins:
        lines.append("  stood in for (inert): " + ", ".join(stand_ins))
    lines += [f"  adapted: {note}" for note in record.adapted]
    return lines


def _side(observation, rank: int) -> str:
    """One rank's outcome in a diff."""
    view = observation.ranks[rank]
    if view.error:
        return f"error: {view.error}"
    reasons = [entry[1] for entry in view.trace if entry[0] == INCOMPLETE]
    if reasons:
        return f"collective failed: {reasons[0]}"
    diffs = cache_diff(observation, rank)
    return "cache as expected" if not diffs else "cache: " + "; ".join(diffs)


def _spec_verdict(observation) -> str:
    if not observation.violations:
        return "satisfies the spec"
    return "violates " + ", ".join(f"{v.invariant} (ranks {v.ranks})" for v in observation.violations)


def difference(pair, regime: str, old_name: str, new_name: str) -> str:
    """A diff's finding (a pcpcheck.compare.Pair): both outcomes side by side, rank by rank."""
    case = pair.old.prepared.case
    lines = [f"Outcomes differ (regime {regime}): {describe(case)}",
             f"  old = {old_name}: {_spec_verdict(pair.old)}",
             f"  new = {new_name}: {_spec_verdict(pair.new)}"]
    lines += token_table(pair.old)
    for rank in pair.violations[0].ranks:
        lines.append(f"  rank {rank}: old {_side(pair.old, rank)}")
        lines.append(f"  {' ' * len(str(rank))}       new {_side(pair.new, rank)}")
    lines.append(f"  case: {case.to_json()}")
    return "\n".join(lines)


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
