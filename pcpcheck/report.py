"""Human-readable reports: the verdict table and counterexamples a reviewer reads in a minute."""

from __future__ import annotations

import shlex

from pcpcheck.cases import describe
from pcpcheck.check import Observation
from pcpcheck_spec.names import DCP, HAZARD_REGIMES, NO_ROW
from pcpcheck_spec.registry import GATHER_IDS


def label(value: int) -> str:
    if value >= 0:
        return f"t{value}"
    return "??" if value == NO_ROW else "pad"


def rows_text(rows: list[int]) -> str:
    return "[" + " ".join(label(v) for v in rows) + "]"


def slots_text(slots) -> str:
    return "[" + " ".join(str(int(s)) for s in slots) + "]"


def replay_command(source: str, observation: Observation, function: str | None = None) -> str:
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


def token_table(observation: Observation) -> list[str]:
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


def cache_diff(observation: Observation, rank: int, tensor: int = 0) -> list[str]:
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


def call_text(observation: Observation, target=None) -> str:
    """What the target (a loader.Target) was called with on every rank (inputs listed below)."""
    name = getattr(target, "function_name", "") or "gather"
    shard = observation.prepared.shard
    if target is None or target.accepts_shard:
        return f"{name}(tensors, slot_mapping, nd, shard_decode_requests={shard})"
    note = "; the layout deals decodes round-robin, the flag could not be passed" if shard else ""
    return f"{name}(tensors, slot_mapping, nd) (no shard_decode_requests parameter{note})"


def counterexample(observation: Observation, regime: str, source: str,
                   function: str | None = None, target=None, replays=None) -> str:
    """`target`: the loaded target's metadata (what it was called with); `replays`
    (engine.Replays): how often the case showed the violation again, if replayed."""
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


def verdict_table(results, ids=GATHER_IDS) -> list[str]:
    """Per regime and invariant (`ids`: those of the checker): cases the predicate ran on, and
    on how many it failed."""
    regimes = [r.regime + (" [hazard]" if r.regime in HAZARD_REGIMES else "") for r in results]
    width = max(12, *(len(r) + 2 for r in regimes))
    lines = ["invariant".ljust(14) + "".join(r.rjust(width) for r in regimes)]
    for invariant in ids:
        cells = []
        for result in results:
            count = result.checked.get(invariant, 0)
            if not count:
                cells.append("n/a".rjust(width))
            else:
                failed = result.violated.get(invariant, 0)
                cells.append((f"{failed}/{count} FAIL" if failed else f"{count} ok").rjust(width))
        lines.append(invariant.ljust(14) + "".join(cells))
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
