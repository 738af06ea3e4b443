"""FrameBuffer: frames cut from a byte stream however it arrives."""

import pytest

from tiered.protocol.errors import ProtocolError
from tiered.protocol.frame import FRAME_HEADER, MAX_FRAME_BYTES, FrameBuffer, encode_frame

FRAMES = [(3, b""), (1, b"x" * 300), (2, bytes(range(256)) * 3), (10, b"\x07\x00\x00\x00")]
STREAM = b"".join(encode_frame(m, p) for m, p in FRAMES)


@pytest.mark.parametrize("step", [1, 2, 5, 7, 64, len(STREAM)])
def test_frames_come_out_whole_whatever_the_read_sizes(step):
    buf = FrameBuffer()
    got = []
    for i in range(0, len(STREAM), step):
        buf.feed(STREAM[i:i + step])
        while (frame := buf.next_frame()) is not None:
            got.append(frame)
    assert got == FRAMES and len(buf) == 0


def test_payloads_stay_valid_after_more_bytes_arrive():
    buf = FrameBuffer()
    buf.feed(STREAM[:400])
    first, second = buf.next_frame(), buf.next_frame()
    buf.feed(STREAM[400:])
    assert (first, second) == (FRAMES[0], FRAMES[1])


def test_an_oversized_header_is_refused_before_its_payload_arrives():
    buf = FrameBuffer()
    buf.feed(FRAME_HEADER.pack(1, MAX_FRAME_BYTES + 1))
    with pytest.raises(ProtocolError):
        buf.next_frame()
