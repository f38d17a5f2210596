"""One executable predicate per invariant ID of SPEC.md.

Pure Python over the index-level observation (ints, lists, tuples, dicts), so CrossHair can run
each symbolically. Rows are labels: a real token's id (>= 0), or a negative label for a padding
row (`spec.names.pad_label`) or a row that is no input row at all (`NO_ROW`). A rank's output is its rows
(one label list per tensor) and its slots; its cache is a dict slot -> label, one per tensor.
Each predicate returns True when the invariant holds.
"""

from __future__ import annotations

from . import streams
from .names import INCOMPLETE as INCOMPLETE  # re-exported: the registry reads inv.INCOMPLETE
from .names import NO_ROW


def returns(errors: list[str | None]) -> bool:
    """RETURNS: on a well-formed step every rank's call returns well-typed outputs."""
    return all(error is None for error in errors)


def collective_agreement(traces: list[list[tuple[object, ...]]]) -> bool:
    """COLLECTIVE: every rank issues the same collectives, same count, same shapes and dtypes,
    and each one completes (a real run would hang or crash otherwise)."""
    if any(entry[0] == INCOMPLETE for trace in traces for entry in trace):
        return False
    return all(trace == traces[0] for trace in traces)


def no_input_mutation(before: list[bytes], after: list[bytes]) -> bool:
    """NO_MUTATION: each input's content (a digest per input) is unchanged by the call."""
    return before == after


def length_agreement(rows: list[list[int]], slots: list[int]) -> bool:
    """LENGTH: every tensor has at least as many rows as slots (rows past them are never written),
    and the tensors of one call stay row-aligned over the written prefix."""
    num_slots = len(slots)
    if any(len(tensor_rows) < num_slots for tensor_rows in rows):
        return False
    return all(tensor_rows[:num_slots] == rows[0][:num_slots] for tensor_rows in rows)


def uniqueness(slots: list[int]) -> bool:
    """UNIQUE: no non-negative slot appears twice in one rank's launch (a write race)."""
    written = [slot for slot in slots if slot >= 0]
    return len(set(written)) == len(written)


def pad_hygiene(rows: list[int], slots: list[int]) -> bool:
    """PAD_HYGIENE: a row that is not a real token (padding, unknown, missing) is never paired
    with a non-negative slot; slot 0 is a real slot."""
    for k, slot in enumerate(slots):
        label = rows[k] if k < len(rows) else NO_ROW
        if slot >= 0 and label < 0:
            return False
    return True


def pairing(owner: dict[int, int], rows: list[int], slots: list[int]) -> bool:
    """PAIRING: every non-negative slot paired with a real token's row is that token's slot
    in this rank's cache (owner: slot -> token for the slots this rank must hold)."""
    for k, slot in enumerate(slots):
        if slot >= 0 and k < len(rows) and rows[k] >= 0 and owner.get(slot) != rows[k]:
            return False
    return True


def replica(expected: dict[int, int], caches: list[dict[int, int]]) -> bool:
    """REPLICA (D = 1): every rank's cache equals the whole batch's cache: each real token at its
    slot, nothing else written."""
    return all(cache == expected for cache in caches)


def shard(owned: list[dict[int, int]], caches: list[dict[int, int]], tokens: list[int]) -> bool:
    """SHARD (D > 1): rank r's cache holds exactly the tokens DCP rank r owns, and the owned sets
    cover every real token exactly once."""
    if len(caches) != len(owned) or any(caches[r] != owned[r] for r in range(len(owned))):
        return False
    covered = [token for cache in owned for token in cache.values()]
    return sorted(covered) == sorted(tokens)


def layout_conformance(expected: dict[str, object], actual: dict[str, object]) -> bool:
    """LAYOUT: a manager's layout of a step equals the reference's, field by field (plain lists:
    per-rank rows in order, decode counts, width, padded gather index, KV write mask, hidden
    restore index, replicated requests, expanded slot maps). A field the manager does not have
    is absent from `actual` and is not compared."""
    return all(actual[key] == expected.get(key) for key in actual)


# Asynchronous replication: predicates over one rank's stream trace (spec/streams.py).


def async_reads_ordered(trace: list[streams.Entry], readers: dict[int, list[int]]) -> bool:
    """ASYNC_READ: every slot a reader of the cache reads is ordered after its latest write
    (what attention reads before finish, the complete replica after it)."""
    return streams.unseen_write(trace, readers) is None


def async_inputs_ordered(trace: list[streams.Entry]) -> bool:
    """ASYNC_INPUT: every access of an input, on any stream, is ordered after its producer."""
    return streams.unordered_input_read(trace) is None


def async_inputs_kept(trace: list[streams.Entry]) -> bool:
    """ASYNC_LIFETIME: no input is released while a stream whose access is not ordered before
    the release still needs it, unless record_stream kept it for that stream."""
    return streams.unkept_release(trace) is None


def async_fallback(trace: list[streams.Entry]) -> bool:
    """ASYNC_FALLBACK: start falls back while a CUDA graph is captured, and a start that falls
    back has written nothing (the caller's synchronous gather then writes the replica)."""
    return streams.fallback_fault(trace) is None
