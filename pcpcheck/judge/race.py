"""An asynchronous step's violation as a reviewer reads it: the two entries of the rank's stream
trace that are not ordered (the write and the read, the access and the release) and the edge
that would order them, with the trace drawn one column per stream (text here, HTML in
pcpcheck.render.html). The entries come from spec/streams.py, the functions the predicates
themselves call: what is drawn is what was judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcpcheck_spec import streams
from pcpcheck_spec.names import (
    ASYNC_FALLBACK,
    ASYNC_INPUT,
    ASYNC_LIFETIME,
    ASYNC_READ,
    CAPTURING,
    EVENT,
    HOST,
    INPUT,
    KEEP,
    MAIN_STREAM,
    READ,
    READER,
    READER_ATTENTION,
    RECORD,
    RELEASE,
    SLOT,
    STARTED,
    STREAM,
    SYNC,
    WAIT,
    WRITE,
)
from pcpcheck_spec.registry import ASYNC_IDS as ASYNC_IDS  # re-exported: explain and html ask it


@dataclass(frozen=True)
class Race:
    """Entries `first` (None: none came before) and `second` of a rank's trace, and why."""

    invariant: str
    first: int | None
    second: int
    why: str


def stream_name(stream: int) -> str:
    if stream == HOST:
        return "host"
    return "main stream" if stream == MAIN_STREAM else f"side stream {stream}"


def input_name(index: int, num_inputs: int) -> str:
    return "slot_mapping" if index == num_inputs - 1 else f"tensors[{index}]"


def entry_text(entry: tuple, num_inputs: int) -> str:
    """One entry in words."""
    op, stream, obj, index, _phase = entry
    if op == CAPTURING:
        return "a CUDA graph is being captured" if index else "no graph capture"
    if op == STARTED:
        return "start answered True" if index else "start answered False (fallback)"
    if obj == READER:
        return "attention reads the cache" if index == READER_ATTENTION else "the next reader reads the cache"
    if obj == INPUT:
        what = input_name(index, num_inputs)
        return {WRITE: f"write {what}", READ: f"read {what}", KEEP: f"record_stream({what})",
                RELEASE: f"release {what}"}.get(op, f"{op} {what}")
    if obj == SLOT:
        return f"{op} slot {index}"
    if op == SYNC:
        return ("host waits for " + (f"event {index}" if obj == EVENT else
                                     stream_name(index) if obj == STREAM else "the device"))
    if op in (RECORD, WAIT):
        return f"{op} event {index}"
    return f"{op} {obj} {index}"


def find(invariant: str, trace: list[tuple], readers: dict[int, list[int]],
         num_inputs: int) -> Race | None:
    """The entries behind a violation of `invariant` on this trace (None if it holds)."""
    if invariant == ASYNC_READ:
        found = streams.unseen_write(trace, readers)
        if found is None:
            return None
        write, read, slot = found
        if write is None:
            return Race(invariant, None, read, f"slot {slot} is read, and no write of it was "
                                               "issued before the read")
        return Race(invariant, write, read, f"slot {slot} is read by the {stream_name(trace[read][1])}, "
                    f"not ordered after its write on the {stream_name(trace[write][1])}")
    if invariant == ASYNC_INPUT:
        found = streams.unordered_input_read(trace)
        if found is None:
            return None
        write, access, index = found
        return Race(invariant, write, access,
                    f"{input_name(index, num_inputs)} is accessed by the "
                    f"{stream_name(trace[access][1])} before its producer on the "
                    f"{stream_name(trace[write][1])} is ordered before it")
    if invariant == ASYNC_LIFETIME:
        found = streams.unkept_release(trace)
        if found is None:
            return None
        access, release, index = found
        return Race(invariant, access, release,
                    f"{input_name(index, num_inputs)} is released on the "
                    f"{stream_name(trace[release][1])} while the "
                    f"{stream_name(trace[access][1])}'s access is neither ordered before the "
                    "release nor kept by record_stream")
    if invariant == ASYNC_FALLBACK:
        fault = streams.fallback_fault(trace)
        if fault is None:
            return None
        at, why = fault
        return Race(invariant, None, at, why)
    return None


def missing_edge(race: Race, trace: list[tuple]) -> str:
    """The edge whose absence is the violation, in words."""
    if race.first is None:
        return "" if race.invariant == ASYNC_FALLBACK else \
            f"missing: a write before #{race.second}"
    first_stream, second_stream = trace[race.first][1], trace[race.second][1]
    if race.invariant == ASYNC_LIFETIME:
        return (f"missing edge: #{race.first} ({stream_name(first_stream)}) -> #{race.second} "
                f"({stream_name(second_stream)}): an event recorded after #{race.first} and "
                f"waited for before #{race.second}, or record_stream for the "
                f"{stream_name(first_stream)}")
    return (f"missing edge: #{race.first} ({stream_name(first_stream)}) -> #{race.second} "
            f"({stream_name(second_stream)}): no event recorded on the "
            f"{stream_name(first_stream)} at or after #{race.first} is waited for by the "
            f"{stream_name(second_stream)} before #{race.second}")


@dataclass(frozen=True)
class Line:
    """Entries first..last of one stream, alike but for their index (a run of slot writes)."""

    first: int
    last: int
    stream: int
    text: str
    phase: str
    mark: str  # "first", "second" or ""

    @property
    def label(self) -> str:
        span = f"#{self.first}" if self.first == self.last else f"#{self.first}-{self.last}"
        return f"{span} {self.text} [{self.phase}]"


def lines(trace: list[tuple], race: Race | None, num_inputs: int) -> list[Line]:
    """The trace in display lines: consecutive slot writes of one stream and phase folded."""
    marks = {} if race is None else {race.second: "second"}
    if race is not None and race.first is not None:
        marks[race.first] = "first"
    out: list[Line] = []
    for i, entry in enumerate(trace):
        op, stream, obj, index, phase = entry
        previous = out[-1] if out else None
        if (obj == SLOT and previous is not None and previous.stream == stream
                and previous.phase == phase and previous.last == i - 1 and not previous.mark
                and i not in marks and trace[i - 1][0] == op and trace[i - 1][2] == SLOT):
            out[-1] = Line(previous.first, i, stream, f"{previous.text} {index}", phase, "")
            continue
        text = f"{op} slots {index}" if obj == SLOT else entry_text(entry, num_inputs)
        out.append(Line(i, i, stream, text, phase, marks.get(i, "")))
    return out


def columns_text(trace: list[tuple], race: Race | None, num_inputs: int, width: int = 44) -> list[str]:
    """The trace side by side, one column per stream (host entries across), the race marked."""
    order = sorted({entry[1] for entry in trace if entry[1] != HOST})
    head = " | ".join(f"{stream_name(stream):<{width}}" for stream in order)
    out = ["      " + head.rstrip(), "      " + "-+-".join("-" * width for _ in order)]
    for line in lines(trace, race, num_inputs):
        marker = {"first": "  <<", "second": "  >>"}.get(line.mark, "")
        cell = f"{line.label}{marker}"
        if line.stream == HOST:
            out.append(f"      host: {cell}")
            continue
        cells = [cell if stream == line.stream else "" for stream in order]
        out.append("      " + " | ".join(f"{c:<{width}}" for c in cells).rstrip())
    return out


def of(observation, invariant: str, rank: int) -> Race | None:
    """The race behind a rank's violation of an asynchronous invariant (None: it has none)."""
    view = observation.ranks[rank]
    if view.streams is None:
        return None
    from pcpcheck.judge.verdict import readers
    return find(invariant, view.streams, readers(observation.prepared)[rank],
                len(observation.prepared.case.tensors) + 1)


def report_lines(observation, invariant: str, rank: int) -> list[str]:
    """A rank's streams under a counterexample of an asynchronous invariant."""
    race = of(observation, invariant, rank)
    if race is None:
        return []
    trace = observation.ranks[rank].streams
    lines_out = [f"  streams of rank {rank} ({invariant}): {race.why}"]
    edge = missing_edge(race, trace)
    if edge:
        lines_out.append(f"    {edge}")
    lines_out.append("    << the access that must come first, >> the one not ordered after it")
    lines_out += columns_text(trace, race, len(observation.prepared.case.tensors) + 1)
    return lines_out
