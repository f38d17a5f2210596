"""Happens-before over one rank's stream trace: the CUDA ordering rules the asynchronous
invariants (SPEC.md "Asynchronous replication") assume, in pure Python.

A trace lists what a rank issued, in host order: entries (op, stream, object, index, phase) of
spec/names.py. CUDA's rules, and only these, order the work of two streams:

- the work of one stream runs in the order it was issued;
- a `wait` for an event orders the waiting stream's later work after everything its stream had
  issued before the event's latest `record` (waiting for an event never recorded orders
  nothing, as in CUDA);
- a host `sync` (on a stream, an event or the device) orders every entry issued after it, on any
  stream, after what the host waited for.

Host order alone orders nothing across streams: a kernel may start late or run long. So each
entry gets a vector clock (stream -> the number of that stream's entries ordered at or before
it), and an entry i is ordered before an entry j iff j's clock counts i on i's stream.
"""

from __future__ import annotations

from .names import (
    CAPTURING,
    EVENT,
    HOST,
    INPUT,
    KEEP,
    ORDER_START,
    READ,
    READER,
    RECORD,
    RELEASE,
    SLOT,
    STARTED,
    STREAM,
    SYNC,
    WAIT,
    WRITE,
)

# One entry of a trace: (op, stream, object, index, phase) (spec/names.py).
Entry = tuple[str, int, str, int, str]


def clocks(trace: list[Entry]) -> list[dict[int, int]]:
    """Per entry, its vector clock (a host entry: what the host has waited for)."""
    streams: dict[int, dict[int, int]] = {}
    events: dict[int, dict[int, int]] = {}
    host: dict[int, int] = {}
    out: list[dict[int, int]] = []
    for op, stream, obj, index, _phase in trace:
        if stream == HOST:
            if op == SYNC:
                for clock in ([streams.get(index, {})] if obj == STREAM else
                              [events.get(index, {})] if obj == EVENT else list(streams.values())):
                    _join(host, clock)
            out.append(dict(host))
            continue
        clock = streams.setdefault(stream, {})
        _join(clock, host)
        clock[stream] = clock.get(stream, 0) + 1
        if op == WAIT:
            _join(clock, events.get(index, {}))
        elif op == RECORD:
            events[index] = dict(clock)
        out.append(dict(clock))
    return out


def _join(into: dict[int, int], other: dict[int, int]) -> None:
    for stream, count in other.items():
        if into.get(stream, 0) < count:
            into[stream] = count


def ordered(trace: list[Entry], stamps: list[dict[int, int]], before: int, after: int) -> bool:
    """Whether entry `before` is ordered before entry `after` (both on streams, not the host)."""
    stream = trace[before][1]
    return stamps[after].get(stream, 0) >= stamps[before][stream]


def unseen_write(trace: list[Entry], readers: dict[int, list[int]]) -> tuple[int | None, int, int] | None:
    """The first slot a reader reads that is not ordered after its latest write: (that write's
    entry, None where no write of the slot came before; the reader's entry; the slot), else None.
    `readers`: reader index -> the slots it reads."""
    stamps = clocks(trace)
    written: dict[int, int] = {}
    for i, (op, _stream, obj, index, _phase) in enumerate(trace):
        if op == WRITE and obj == SLOT:
            written[index] = i
        elif op == READ and obj == READER:
            for slot in readers.get(index, []):
                write = written.get(slot)
                if write is None or not ordered(trace, stamps, write, i):
                    return write, i, slot
    return None


def unordered_input_read(trace: list[Entry]) -> tuple[int, int, int] | None:
    """The first access of an input not ordered after the input's latest write before it (its
    producer): (the write's entry, the access's entry, the input), else None."""
    stamps = clocks(trace)
    produced: dict[int, int] = {}
    for i, (op, _stream, obj, index, _phase) in enumerate(trace):
        if obj != INPUT or op not in (READ, WRITE):
            continue
        producer = produced.get(index)
        if producer is not None and not ordered(trace, stamps, producer, i):
            return producer, i, index
        if op == WRITE:
            produced[index] = i
    return None


def unkept_release(trace: list[Entry]) -> tuple[int, int, int] | None:
    """The first release of an input whose memory another stream still needs: an access of it by
    another stream that is neither ordered before the release nor kept by record_stream
    (KEEP for that stream before the release): (the access's entry, the release's, the input)."""
    stamps = clocks(trace)
    accesses: dict[int, list[int]] = {}
    kept: set[tuple[int, int]] = set()
    for i, (op, stream, obj, index, _phase) in enumerate(trace):
        if obj != INPUT:
            continue
        if op in (READ, WRITE):
            accesses.setdefault(index, []).append(i)
        elif op == KEEP:
            kept.add((stream, index))
        elif op == RELEASE:
            for access in accesses.get(index, []):
                other = trace[access][1]
                if other != stream and (other, index) not in kept \
                        and not ordered(trace, stamps, access, i):
                    return access, i, index
    return None


def fallback_fault(trace: list[Entry]) -> tuple[int, str] | None:
    """Where start's answer breaks the fallback rule: (the entry, why), else None. Start must
    answer False while a CUDA graph is being captured, and having answered False it must have
    written no slot (the caller's synchronous gather writes them all)."""
    capturing = any(op == CAPTURING and index for op, _s, _o, index, _p in trace)
    for i, (op, _stream, _obj, index, _phase) in enumerate(trace):
        if op != STARTED:
            continue
        if index and capturing:
            return i, "start began an asynchronous update while a CUDA graph was being captured"
        if not index:
            for op2, _s2, obj2, slot, phase2 in trace[:i]:
                if op2 == WRITE and obj2 == SLOT and phase2 == ORDER_START:
                    return i, f"start answered False after writing slot {slot}"
    return None
