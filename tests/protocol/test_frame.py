"""Frames, and every reader fed through maybe_frame: whole, one byte at a time, and split at every byte boundary."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.strategies import budget, framed_cases
from tests.protocol.test_examples import (
    BOUNDARY_RESPONSE_BYTES,
    CONSUME_BYTES,
    CONSUME_RESPONSE_BYTES,
    PRODUCE_WITH_SEQNUM_BYTES,
    UNKNOWN_RESPONSE_BYTES,
)
from tests.protocol.test_examples_admin import SMALL_CASES
from tiered.protocol import frame as frame_module
from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import FRAME_HEADER, MAX_FRAME_BYTES, FrameCut, MsgType, cut_frames, encode_frame, maybe_frame
from tiered.protocol.requests import read_consume_request, read_produce_request
from tiered.protocol.responses import read_consume_response


def feed(chunks):
    """Reads frames the way a connection does: append what arrived, take every whole frame, keep the rest."""
    frames = []
    buf = b""
    for chunk in chunks:
        buf += chunk
        position = 0
        while (got := maybe_frame(buf, position)) is not None:
            msg_id, payload, position = got
            frames.append((msg_id, bytes(payload)))
        buf = buf[position:]
    assert buf == b"", "bytes left over after the last frame"
    return frames


def test_maybe_frame_needs_the_whole_header_and_payload():
    frame = encode_frame(MsgType.STATUS, b"\x01\x02\x03\x04")
    for end in range(len(frame)):
        assert maybe_frame(frame[:end]) is None
    msg_id, payload, position = maybe_frame(frame + b"\x03")
    assert (msg_id, bytes(payload), position) == (MsgType.STATUS, b"\x01\x02\x03\x04", len(frame))
    assert maybe_frame(frame + b"\x03", position) is None


def test_maybe_frame_at_a_position_and_in_a_memoryview():
    stream = encode_frame(1, b"ab") + encode_frame(2, b"") + encode_frame(3, b"xyz")
    view = memoryview(bytearray(stream))
    got = []
    position = 0
    while (frame := maybe_frame(view, position)) is not None:
        got.append((frame[0], bytes(frame[1])))
        position = frame[2]
    assert got == [(1, b"ab"), (2, b""), (3, b"xyz")]
    assert position == len(stream)


def test_oversized_frame_fails_as_soon_as_the_header_is_there():
    assert maybe_frame(FRAME_HEADER.pack(MsgType.CONSUME, MAX_FRAME_BYTES)) is None  # the limit itself is fine
    header = FRAME_HEADER.pack(MsgType.PRODUCE, MAX_FRAME_BYTES + 1)
    assert maybe_frame(header[:4]) is None
    with pytest.raises(ProtocolError, match="exceeds"):
        maybe_frame(header)
    with pytest.raises(ProtocolError, match="exceeds"):
        maybe_frame(b"\x00" * 7 + FRAME_HEADER.pack(MsgType.PRODUCE, 0xFFFF_FFFF), 7)


def test_cut_frames_cuts_every_whole_frame_and_keeps_the_rest():
    stream = encode_frame(1, b"ab") + encode_frame(2, b"") + encode_frame(3, b"xyz")
    whole = cut_frames(stream, 0, len(stream))
    assert [(m, stream[a:b]) for m, a, b in whole.frames] == [(1, b"ab"), (2, b""), (3, b"xyz")]
    assert (whole.rest, whole.big, whole.error) == (len(stream), None, None)
    for end in range(len(stream) + 1):  # the stream split at every byte: the cut stops at the last whole frame
        cut = cut_frames(stream, 0, end)
        assert cut.frames == [f for f in whole.frames if f[2] <= end] and cut.error is None and cut.big is None
        assert cut.rest == max([0, *(f[2] for f in cut.frames)])
    padded = b"\xee" * 3 + stream  # from a position, within a larger buffer
    assert [(m, a - 3, b - 3) for m, a, b in cut_frames(padded, 3, len(padded)).frames] == whole.frames


def test_cut_frames_names_a_big_frame_not_all_here():
    small, big = encode_frame(1, b"x"), encode_frame(MsgType.CONSUME, bytes(1000))
    stream = small + big
    cut = cut_frames(stream, 0, len(stream) - 1, big_bytes=1000)
    assert cut == FrameCut([(1, FRAME_HEADER.size, len(small))], len(small), (MsgType.CONSUME, 1000))
    assert cut_frames(stream, 0, len(stream) - 1, big_bytes=1001).big is None  # below the size: waited for
    assert cut_frames(stream, 0, len(small) + 4, big_bytes=1000).big is None  # its header is not all here
    assert cut_frames(stream, 0, len(stream), big_bytes=1000).big is None  # all here: cut


def test_cut_frames_refuses_an_oversized_header_after_the_frames_before_it():
    stream = encode_frame(1, b"ok") + FRAME_HEADER.pack(MsgType.PRODUCE, MAX_FRAME_BYTES + 1) + b"more"
    cut = cut_frames(stream, 0, len(stream), big_bytes=64)
    assert [(m, stream[a:b]) for m, a, b in cut.frames] == [(1, b"ok")]
    assert cut.rest == len(encode_frame(1, b"ok")) and cut.big is None
    assert isinstance(cut.error, ProtocolError) and "exceeds" in str(cut.error)
    assert cut_frames(FRAME_HEADER.pack(MsgType.PRODUCE, MAX_FRAME_BYTES), 0, FRAME_HEADER.size).error is None


@given(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=40)), max_size=8), st.data())
def test_cut_frames_gives_back_what_was_framed_however_it_arrives(frames, data):
    stream = b"".join(encode_frame(m, p) for m, p in frames)
    splits = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    got, start = [], 0
    for end in [*splits, len(stream)]:
        cut = cut_frames(stream, start, max(start, end))
        got += [(m, stream[a:b]) for m, a, b in cut.frames]
        start = cut.rest
    assert got == frames and start == len(stream)


def test_encode_frame_refuses_what_a_broker_would_refuse():
    class Huge(bytes):
        def __len__(self):
            return MAX_FRAME_BYTES + 1

    with pytest.raises(ValueError):
        encode_frame(MsgType.PRODUCE, Huge())
    with pytest.raises(ValueError):
        encode_frame(256, b"")


def _example_stream():
    """The docs/protocol.md examples as frames, with the reader for each."""
    cases = [
        (MsgType.PING, b"", bytes),
        (MsgType.CONSUME, CONSUME_BYTES, read_consume_request),
        (MsgType.PRODUCE_WITH_SEQNUM, PRODUCE_WITH_SEQNUM_BYTES, lambda p: read_produce_request(p, True)),
        (MsgType.CONSUME, CONSUME_RESPONSE_BYTES, read_consume_response),
        (MsgType.CONSUME, UNKNOWN_RESPONSE_BYTES, read_consume_response),
        (MsgType.CONSUME, BOUNDARY_RESPONSE_BYTES, read_consume_response),
    ]
    cases += [(0x10, payload, read) for _, payload, _, read in SMALL_CASES]
    return cases


def test_example_stream_whole_byte_by_byte_and_split_everywhere():
    cases = _example_stream()
    stream = b"".join(encode_frame(msg_id, payload) for msg_id, payload, _ in cases)
    expected = [(msg_id, payload) for msg_id, payload, _ in cases]
    assert feed([stream]) == expected
    assert feed([stream[i : i + 1] for i in range(len(stream))]) == expected
    for split in range(len(stream) + 1):
        assert feed([stream[:split], stream[split:]]) == expected
    for (msg_id, payload), (_, original, read) in zip(feed([stream[i : i + 1] for i in range(len(stream))]), cases):
        assert read(payload) == read(original)


@budget(40)
@given(st.lists(framed_cases(), min_size=1, max_size=5))
def test_any_stream_of_frames_split_at_every_byte(cases):
    stream = b"".join(encode_frame(msg_id, payload) for msg_id, payload, _, _ in cases)
    expected = [(msg_id, payload) for msg_id, payload, _, _ in cases]
    for split in range(len(stream) + 1):
        assert feed([stream[:split], stream[split:]]) == expected
    frames = feed([stream[i : i + 1] for i in range(len(stream))])
    assert frames == expected
    for (_, payload), (_, _, read, value) in zip(frames, cases):
        assert read(payload) == value


# -- cut_payloads: the broker connection's pass, natively (_bundlescan.cut_payloads) against its reference ----------

native_cut_payloads = frame_module._cut_payloads_native
needs_native = pytest.mark.skipif(native_cut_payloads is None, reason="the native module is not built")


def _same_cut(got, want) -> None:
    """Equal PayloadCuts: the error compared by its text and position (a new exception each time)."""
    assert got[:4] == want[:4]
    assert type(got[4]) is type(want[4])
    if want[4] is not None:
        assert (got[4].what, got[4].position) == (want[4].what, want[4].position)


def test_cut_payloads_copies_each_payload_out_as_bytes():
    stream = bytearray(encode_frame(1, b"ab") + encode_frame(2, b"") + encode_frame(3, b"xyz") + b"\x04\x01")
    for cut in (frame_module._cut_payloads_py, *([native_cut_payloads] if native_cut_payloads else [])):
        frames, rest, payload_bytes, big, error = cut(stream, 0, len(stream), 64)
        assert frames == [(1, b"ab"), (2, b""), (3, b"xyz")] and all(type(p) is bytes for _, p in frames)
        assert (rest, payload_bytes, big, error) == (len(stream) - 2, 5, None, None)
        stream[5:7] = b"ZZ"  # the buffer is received into again: the payloads cut from it do not change
        assert frames[0] == (1, b"ab")
        stream[5:7] = b"ab"


@needs_native
def test_cut_payloads_refuses_positions_outside_the_buffer():
    for start, end in ((-1, 3), (4, 3), (0, 11)):
        for cut in (frame_module._cut_payloads_py, native_cut_payloads):
            with pytest.raises(ValueError, match="within the buffer"):
                cut(bytes(10), start, end, 64)
    with pytest.raises(TypeError):
        native_cut_payloads(bytes(10), 0, 10)


@needs_native
@budget(400)
@given(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=40)), max_size=8), st.binary(max_size=12),
       st.integers(0, 64), st.data())
def test_native_cut_payloads_is_its_reference_on_any_bytes(frames, tail, big_bytes, data):
    """Whole, truncated and random streams, an oversized header among them: the same cut, error for error."""
    stream = b"".join(encode_frame(m, p) for m, p in frames) + tail
    if data.draw(st.booleans()):  # an oversized header somewhere
        at = data.draw(st.integers(0, len(stream)))
        stream = stream[:at] + FRAME_HEADER.pack(1, data.draw(st.integers(MAX_FRAME_BYTES + 1, 0xFFFF_FFFF))) + \
            stream[at:]
    start = data.draw(st.integers(0, len(stream)))
    end = data.draw(st.integers(start, len(stream)))
    buf = bytearray(stream) if data.draw(st.booleans()) else stream
    _same_cut(native_cut_payloads(buf, start, end, big_bytes), frame_module._cut_payloads_py(buf, start, end, big_bytes))
