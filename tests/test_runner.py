"""The in-process rank scheduler (pcpcheck.worker.runner) and the wire format (pcpcheck.shared.wire):
real data movement between greenlet ranks, deadlocks detected at once, and tensors read as plain
bytes whatever the object returned claims about itself."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

import pcpcheck_spec.invariants as inv
from pcpcheck.shared import protocol, wire
from pcpcheck.shared.protocol import FINISHED, RUNNING, WAITING
from pcpcheck.worker.rankctx import current_group
from pcpcheck.worker.runner import ThreadRunner


def _incomplete(outcome) -> list[str]:
    return [entry[1] for entry in outcome.trace if entry[0] == inv.INCOMPLETE]


def test_all_gather_is_rank_major_and_every_rank_gets_its_own_copy():
    def gather(rank):
        result = current_group().all_gather(torch.full((2,), rank), 0)
        result.add_(100 * rank)  # a rank scribbling on its result must not reach its peers
        return result

    outcomes = ThreadRunner().run(3, gather)
    assert [o.value.tolist() for o in outcomes] == [[0, 0, 1, 1, 2, 2], [100, 100, 101, 101, 102, 102],
                                                    [200, 200, 201, 201, 202, 202]]
    assert all(o.trace == [("all_gather", 0, (2,), "torch.int64")] for o in outcomes)


def test_on_switch_tells_which_rank_runs_and_waits():
    seen = []
    ThreadRunner().run(2, lambda rank: current_group().all_gather(torch.zeros(1), 0),
                       on_switch=lambda rank, state: seen.append((rank, state)))
    assert seen == [(0, RUNNING), (0, WAITING), (1, RUNNING), (1, WAITING),
                    (0, RUNNING), (0, FINISHED), (1, RUNNING), (1, FINISHED)]


def test_a_rank_that_skips_the_collective_releases_its_peers_at_once():
    def skip(rank):
        if rank == 1:
            return "skipped"
        return current_group().all_gather(torch.zeros(1), 0)

    started = time.monotonic()
    outcomes = ThreadRunner().run(3, skip)
    assert time.monotonic() - started < 5  # deadlock detected, not timed out
    assert outcomes[1].value == "skipped" and not _incomplete(outcomes[1])
    for rank in (0, 2):
        assert "a peer never joined it (ranks that returned or raised instead: [1])" in _incomplete(outcomes[rank])[0]


def test_unequal_shapes_fail_the_collective_on_every_rank():
    outcomes = ThreadRunner().run(2, lambda rank: current_group().all_gather(torch.zeros(rank + 1), 0))
    assert all("shapes disagree" in _incomplete(o)[0] for o in outcomes)


def test_a_swallowed_abort_stays_in_the_trace():
    def swallow(rank):
        try:
            return current_group().all_gather(torch.zeros(1), 0) if rank else "left"
        except Exception:  # noqa: BLE001 - what a careless target does
            return "swallowed"

    outcomes = ThreadRunner().run(2, swallow)
    assert outcomes[1].value == "swallowed" and _incomplete(outcomes[1])


def test_errors_and_exits_are_caught_per_rank():
    def hostile(rank):
        if rank == 0:
            raise SystemExit(3)
        raise ValueError("bad input")

    outcomes = ThreadRunner().run(2, hostile)
    assert [o.error for o in outcomes] == ["SystemExit: 3", "ValueError: bad input"]


class _Liar(torch.Tensor):
    """Claims other content through every method a reader might call."""

    def tolist(self):
        return [0, 1, 2, 3]

    def numpy(self):
        return torch.zeros(4, dtype=torch.int64).numpy()

    def contiguous(self, *args, **kwargs):
        return torch.zeros(4, dtype=torch.int64)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            return [0, 1, 2, 3]
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_cannot_lie_about_its_bytes():
    real = torch.tensor([7, 8, 9, 10], dtype=torch.int64)
    liar = real.as_subclass(_Liar)
    assert liar.tolist() == [0, 1, 2, 3]  # the lie works on whoever asks the object
    dtype, shape, content = wire.tensor_bytes(liar)
    assert (dtype, shape) == ("torch.int64", [4])
    assert wire.tensor_from_bytes(dtype, shape, content).tolist() == [7, 8, 9, 10]


def _plain_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's logical content, read the slow, obvious way (for comparison): copied into a
    fresh tensor of canonical strides."""
    fresh = torch.empty(tensor.shape, dtype=tensor.dtype)
    fresh.copy_(tensor.resolve_neg())
    return fresh.reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("make", [
    lambda: torch.arange(6.0).reshape(2, 3),
    lambda: torch.arange(6.0).reshape(2, 3)[:, 1:],  # not contiguous
    lambda: torch.tensor([5.0]).as_strided((1,), (7,)),  # one element, an odd stride
    lambda: torch.arange(12, dtype=torch.bfloat16).reshape(3, 1, 4).as_strided((3, 1, 4), (4, 99, 1)),
    lambda: torch.arange(3.0)._neg_view(),  # a negative view: its bytes are not its values
    lambda: torch.arange(4.0).expand(2, 4),
    lambda: torch.zeros(0, 1, 64),
    lambda: torch.tensor(3),
    lambda: torch.arange(8.0)[2:6],  # a storage offset
], ids=["dense", "sliced", "one-element-odd-stride", "size-one-dim-odd-stride", "neg-view",
        "expanded", "empty", "scalar", "offset"])
def test_tensor_bytes_reads_the_logical_content_of_any_layout(make):
    tensor = make()
    dtype, shape, content = wire.tensor_bytes(tensor)
    assert (dtype, shape) == (str(tensor.dtype), list(tensor.shape))
    assert content == _plain_bytes(tensor)


@pytest.mark.parametrize("change, changed", [
    (lambda t: None, False),
    (lambda t: t[1].fill_(9), True),
    (lambda t: t.numpy()[0].fill(9), True),  # past torch: only the buffer shows it
    (lambda t: t.set_(t.clone()), False),  # another storage, the same content
    (lambda t: t.set_(t.clone().fill_(7)), True),
    (lambda t: t.as_strided_((2, 3), (1, 2)), True),  # the same buffer read in another order
    (lambda t: t.resize_(1, 3), True),
    (lambda t: t.data.mul_(1), False),
], ids=["untouched", "in-place", "through-numpy", "set-same", "set-other", "restrided",
        "resized", "rewritten-same"])
def test_a_sent_input_reads_back_none_only_when_its_content_is_unchanged(change, changed):
    """What the worker reports of an input after the call (NO_MUTATION's evidence): None for
    unchanged, else exactly tensor_bytes' reading, whatever the call did to the tensor."""
    original = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    sent = wire.SentTensor("torch.float32", [3, 2], _plain_bytes(original))
    change(sent.tensor)
    after = sent.read_back()
    assert (after is not None) == changed
    if changed:
        assert after == wire.tensor_bytes(sent.tensor)[2] != _plain_bytes(original)


@pytest.mark.parametrize("shape", [[3, 1, 64], [0, 1, 64], [1], [0]])
def test_a_sent_input_untouched_takes_the_cheap_reading(shape):
    """The geometry recorded when the input was built is what _geometry reads of it (else
    every read_back would copy the tensor: right, but the cost this avoids)."""
    sent = wire.SentTensor("torch.bfloat16", shape, bytes(2 * math.prod(shape)))
    with wire._no_overrides():
        assert wire._geometry(sent.tensor) == sent._geometry
    assert sent.read_back() is None


def test_values_cross_as_plain_data():
    blobs: list = []
    value = ([torch.arange(6, dtype=torch.float32).reshape(2, 3)[:, 1:]], torch.tensor([3, -1]))
    tree = wire.encode_value(value, blobs)
    header, blobs_back = wire.unpack(wire.pack({"op": "x", "value": tree}, blobs))
    decoded = wire.decode_value(header["value"], blobs_back)
    assert isinstance(decoded, tuple) and isinstance(decoded[0], list)
    assert type(decoded[0][0]) is wire.Received  # plain data: the driver never runs torch on it
    assert decoded[0][0].tensor().tolist() == [[1.0, 2.0], [4.0, 5.0]]
    assert decoded[1].ints() == [3, -1] and decoded[1].device == "cpu"
    other = wire.decode_value(wire.encode_value({"a": 1}, []), [])
    assert type(other).__name__ == "dict" and not isinstance(other, dict)  # named, never rebuilt


@pytest.mark.parametrize("tree, blobs", [
    ([wire.TENSOR, "torch.float32", [2], 0, "cpu"], [b"\0" * 7]),
    ([wire.TENSOR, "os.system", [1], 0, "cpu"], [b"\0" * 4]),
    ([wire.TENSOR, "torch.int8", [-1], 0, "cpu"], [b""]),
    ([wire.TENSOR, "torch.int8", [1], 3, "cpu"], [b"\0"]),
    ([wire.TENSOR, "torch.int8", [1], 0], [b"\0"]),
])
def test_a_forged_tensor_description_is_refused(tree, blobs):
    with pytest.raises(ValueError):
        wire.decode_value(tree, blobs)


def test_reader_never_blocks_past_its_deadline():
    import os
    read_end, write_end = os.pipe()
    try:
        reader = wire.Reader(read_end)
        os.write(write_end, wire.pack({"op": "a"})[:5])  # half a message
        started = time.monotonic()
        assert reader.recv(time.monotonic() + 0.2) is None
        assert time.monotonic() - started < 2
        os.write(write_end, wire.pack({"op": "a"})[5:])
        assert reader.recv(time.monotonic() + 1)[0]["op"] == "a"
        os.close(write_end)
        write_end = None
        with pytest.raises(wire.ChannelClosed):
            reader.recv(time.monotonic() + 1)
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)


@pytest.mark.parametrize("header", [
    {"op": "x", "blobs": [2.5, 2.5]},  # lengths that sum right but are not ints
    {"op": "x", "blobs": [6, -1]},
    {"op": "x", "blobs": 5},
    ["op", "blobs"],
])
def test_a_forged_frame_closes_the_channel_and_the_next_message_still_reads(header):
    text = json.dumps(header).encode()
    reader = wire.Reader(-1)
    reader._buffer += wire._FRAME.pack(len(text), 5) + text + b"abcde" + wire.pack({"op": "a"}, [b"z"])
    with pytest.raises(wire.ChannelClosed, match="not a message"):
        reader.recv()
    assert reader.recv() == ({"op": "a", "blobs": [1]}, [b"z"])


@pytest.mark.parametrize("header, hosted", [
    ({"op": "result", "ranks": [[1, 2]]}, None),  # a rank that is no report
    ({"op": "result", "ranks": 5}, None),
    ({"op": "result"}, None),
    ({"op": "loaded", "ranks": []}, None),  # another operation's reply where a result is due
    ({"op": "result", "ranks": []}, 2),  # fewer ranks than the worker hosts
    ({"op": "result", "ranks": [{"rank": 0, "trace": 5}]}, 1),
    ({"op": "result", "ranks": [{"rank": 0, "trace": [5]}]}, 1),
])
def test_a_forged_result_is_refused(header, hosted):
    with pytest.raises(ValueError):
        protocol.read_result(header, [b"\0"], hosted)
