"""Human-readable reports: the verdict table and counterexamples a reviewer reads in a minute."""

from __future__ import annotations

import shlex

from pcpcheck.cases import describe
from pcpcheck.check import Observation
from spec.names import INVARIANTS, NO_ROW


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


def token_table(observation: Observation) -> list[str]:
    """Which token belongs to which request and slot(s), one line per request."""
    batch = observation.prepared.case.batch
    lines, token = [], 0
    owners = {}
    for rank, expected in enumerate(observation.prepared.expected):
        for slot, tok in expected.items():
            owners.setdefault(tok, []).append(f"{slot}" + (f"@r{rank}" if batch.dcp_size > 1 else ""))
    for index, request in enumerate(batch.requests):
        kind = "prefill" if request.prefilling else "decode"
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


def counterexample(observation: Observation, regime: str, source: str,
                   function: str | None = None, replays=None) -> str:
    """`replays` (engine.Replays): how often the case showed the violation again, if replayed."""
    first = observation.violations[0]
    prepared = observation.prepared
    lines = [f"{first.invariant} violated on rank(s) {first.ranks} (regime {regime})"
             + (", FLAKY" if replays is not None and replays.flaky else "")]
    if replays is not None and replays.flaky:
        lines.append(f"  flaky: {replays.reproduced} of {replays.runs} replays of this case showed "
                     "it again: the target does not behave the same on the same case, so this "
                     "case may not be the smallest")
    others = [f"{v.invariant} on {v.ranks}" for v in observation.violations[1:]]
    if others:
        lines.append("  also violated: " + "; ".join(others))
    lines.append(f"  batch: {describe(prepared.case)}")
    lines.append("  tensors: " + ", ".join(f"{s.dtype}{list(s.trailing)}" for s in prepared.case.tensors))
    lines += token_table(observation)
    shard = "shard_decode_requests=True" if prepared.shard else "shard_decode_requests=False"
    lines.append(f"  call: {shard}")
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


def verdict_table(results) -> list[str]:
    """Per regime and invariant: cases checked, and whether it held."""
    regimes = [r.regime for r in results]
    width = max(12, *(len(r) + 2 for r in regimes))
    lines = ["invariant".ljust(14) + "".join(r.rjust(width) for r in regimes)]
    for invariant in INVARIANTS:
        cells = []
        for result in results:
            count = result.checked.get(invariant, 0)
            if not count:
                cells.append("n/a".rjust(width))
            else:
                state = "FAIL" if result.violated.get(invariant) else "ok"
                cells.append(f"{count} {state}".rjust(width))
        lines.append(invariant.ljust(14) + "".join(cells))
    return lines


def rates(*results) -> str:
    """Cases, and cases per second end to end and for running and judging alone (the rank
    runner's hot loop; the rest is hypothesis drawing and shrinking)."""
    cases = sum(r.cases for r in results)
    seconds = sum(r.seconds for r in results)
    checking = sum(r.check_seconds for r in results)
    return (f"{cases:>6} cases in {seconds:5.1f} s: {cases / seconds if seconds else 0:5.0f} cases/s, "
            f"{cases / checking if checking else 0:5.0f} cases/s run+judge")
