"""spec/streams.py against a second statement of CUDA's ordering rules: on random stream traces,
vector clocks (the spec's) and reachability in the happens-before graph drawn edge by edge
(here) order the same pairs, and the spec's findings are the graph's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pcpcheck_spec import streams
from pcpcheck_spec.names import (
    DEVICE,
    EVENT,
    HOST,
    INPUT,
    KEEP,
    READ,
    READER,
    RECORD,
    RELEASE,
    SLOT,
    STREAM,
    SYNC,
    WAIT,
    WRITE,
)

_stream = st.integers(0, 2)
_entry = st.one_of(
    st.tuples(st.sampled_from([WRITE, READ]), _stream, st.just(SLOT), st.integers(0, 1)),
    st.tuples(st.sampled_from([WRITE, READ]), _stream, st.just(INPUT), st.integers(0, 1)),
    st.tuples(st.sampled_from([RECORD, WAIT]), _stream, st.just(EVENT), st.integers(0, 1)),
    st.tuples(st.just(READ), _stream, st.just(READER), st.integers(0, 1)),
    st.tuples(st.sampled_from([KEEP, RELEASE]), _stream, st.just(INPUT), st.integers(0, 1)),
    st.tuples(st.just(SYNC), st.just(HOST), st.sampled_from([STREAM, EVENT]), st.integers(0, 2)),
    st.tuples(st.just(SYNC), st.just(HOST), st.just(DEVICE), st.just(0)),
)
traces = st.lists(_entry.map(lambda entry: (*entry, "p")), max_size=14)


def edges(trace) -> dict[int, set[int]]:
    """The happens-before graph: each stream's entries in issue order; a record to the waits
    that find it the event's latest record; what a host sync waits for (a stream's last entry,
    an event's latest record, every stream's last entry) to the sync, and the sync to every
    later entry."""
    graph: dict[int, set[int]] = {i: set() for i in range(len(trace))}
    last: dict[int, int] = {}
    recorded: dict[int, int] = {}
    syncs: list[int] = []
    for i, (op, stream, obj, index, _) in enumerate(trace):
        if stream == HOST:
            if op == SYNC:
                waited = ([last[index]] if obj == STREAM and index in last else
                          [recorded[index]] if obj == EVENT and index in recorded else
                          list(last.values()) if obj == DEVICE else [])
                for before in waited:
                    graph[before].add(i)
                syncs.append(i)
            continue
        for sync in syncs:
            graph[sync].add(i)
        if stream in last:
            graph[last[stream]].add(i)
        last[stream] = i
        if op == RECORD:
            recorded[index] = i
        elif op == WAIT and index in recorded:
            graph[recorded[index]].add(i)
    return graph


def reaches(graph, start: int, goal: int) -> bool:
    seen, stack = {start}, [start]
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        for nxt in graph[node] - seen:
            seen.add(nxt)
            stack.append(nxt)
    return False


@settings(max_examples=200, deadline=None)
@given(traces)
def test_vector_clocks_order_what_the_graph_reaches(trace):
    stamps, graph = streams.clocks(trace), edges(trace)
    on_streams = [i for i, entry in enumerate(trace) if entry[1] != HOST]
    for a in on_streams:
        for b in on_streams:
            if a != b:
                assert streams.ordered(trace, stamps, a, b) == reaches(graph, a, b), (a, b)


@settings(max_examples=200, deadline=None)
@given(traces)
def test_the_findings_are_the_graphs(trace):
    graph = edges(trace)
    readers = {0: [0], 1: [0, 1]}
    expected_read = None
    written: dict[int, int] = {}
    for i, (op, _s, obj, index, _) in enumerate(trace):
        if op == WRITE and obj == SLOT:
            written[index] = i
        elif op == READ and obj == READER and expected_read is None:
            for slot in readers[index]:
                write = written.get(slot)
                if write is None or not reaches(graph, write, i):
                    expected_read = (write, i, slot)
                    break
    assert streams.unseen_write(trace, readers) == expected_read

    expected_release = None
    for i, (op, stream, _obj, index, _) in enumerate(trace):
        if op != RELEASE or expected_release is not None:
            continue
        for j, (op2, other, obj2, index2, _) in enumerate(trace[:i]):
            kept = any(e[0] == KEEP and e[1] == other and e[3] == index for e in trace[:i])
            if obj2 == INPUT and op2 in (READ, WRITE) and index2 == index and other != stream \
                    and not kept and not reaches(graph, j, i):
                expected_release = (j, i, index)
                break
    assert streams.unkept_release(trace) == expected_release
