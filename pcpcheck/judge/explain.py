"""A judged case in words: the counterexample report a reviewer reads in a minute (the batch,
which token belongs at which slot, every rank's inputs, outputs, collectives and cache diff, the
replay line), a diff's two outcomes side by side, and a release case's (with both layouts side by
side for LAYOUT). Written from an observation by the API into its result; `LEGEND` says how to
read them."""

from __future__ import annotations

import shlex

from pcpcheck.judge import race
from pcpcheck.judge.release_case import ReleaseObservation, capabilities
from pcpcheck.shared.case import describe
from pcpcheck.shared.protocol import ReleaseInfo, split_function
from pcpcheck_spec.names import (
    ASYNC_ORDER,
    DCP,
    DRAFT_REGIMES,
    HAZARD_REGIMES,
    INCOMPLETE,
    LAYOUT,
    NO_ROW,
)


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
    gather, protocol, order = split_function(function)
    if gather:
        words += ["--function", gather]
    if protocol is not None:
        words += ["--async", protocol] if protocol else ["--async"]
        if order and order != ASYNC_ORDER:
            words += ["--async-order", ",".join(order)]
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
    owners: dict[int, list[str]] = {}
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
    protocol = getattr(target, "protocol", "")
    if protocol and shard:
        return (f"{protocol}.start(tensors, slot_mapping, nd, tokens_per_rank, "
                f"decode_tokens_per_rank, update_cache), the caller's steps "
                f"{' -> '.join(target.async_order)}; where start answers False, "
                f"{name}(tensors, slot_mapping, nd, shard_decode_requests=True)")
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
    if first.invariant in race.ASYNC_IDS:
        lines += race.report_lines(observation, first.invariant, first.ranks[0])
    lines.append("  replay: " + replay_command(source, observation, function))
    return "\n".join(lines)


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
    """A diff's finding (a pcpcheck.judge.compare.Pair): both outcomes side by side, rank by
    rank."""
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


def release_replay_command(release: ReleaseInfo, observation) -> str:
    return shlex.join(["pcpcheck", "vllm", release.release["source"]["location"], "--replay",
                       observation.prepared.case.to_json()])


def release_counterexample(release: ReleaseInfo, regime: str, observation: ReleaseObservation,
                   replays=None) -> str:
    """The gather's counterexample report, with both layouts side by side for LAYOUT."""
    location = release.release["source"]["location"]
    text = counterexample(observation, regime, location, None, release, replays)
    lines = [line for line in text.splitlines() if not line.startswith("  replay: ")]
    lines.insert(1, f"  entry: {observation.entry or '- (no rank reported)'}; layout model: era "
                    f"{capabilities(release).era}")
    if observation.kv_group:
        lines.insert(2, "  KV group 1, replicated under DCP (dcp_sharded False: every rank writes "
                        "every token, judged by REPLICA): the calls below are that group's")
    laid_out_by = ("draft path (its speculators' slot map)" if regime in DRAFT_REGIMES
                   else "PCPManager")
    for rank, diff in sorted(observation.layout_diffs.items()):
        lines.append(f"  {LAYOUT}: rank {rank}'s {laid_out_by} differs from the reference:")
        lines += ["    " + line.replace("\n", "\n    ") for line in diff]
    lines.append("  replay: " + release_replay_command(release, observation))
    return "\n".join(lines)
