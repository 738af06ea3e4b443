"""Frames: every TANK message in both directions (docs/protocol.md §1, §2).

Frame layout:

    msg_id    u8        MsgType
    length    u32       payload bytes that follow (not counting these 5)
    payload   length bytes

A broker closes the connection when `length` exceeds 256 MiB, so `maybe_frame` refuses such a header as soon as its
5 bytes are there, instead of waiting for (and buffering) a quarter gigabyte.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from tiered.protocol.buffers import BytesLike
from tiered.protocol.errors import ProtocolError

FRAME_HEADER = struct.Struct("<BI")  # msg_id, payload length
MAX_FRAME_BYTES = 256 * 1024 * 1024


class MsgType(IntEnum):
    PRODUCE = 1  # also the response id of PRODUCE_WITH_SEQNUM
    CONSUME = 2
    PING = 3  # empty payload; a broker sends one right after accept
    REG_REPLICA = 4  # obsolete; a broker closes the connection
    PRODUCE_WITH_SEQNUM = 5
    DISCOVER_PARTITIONS = 6
    CREATE_TOPIC = 7
    RELOAD_CONF = 8
    CONSUME_PEER = 9  # broker-to-broker replication (cluster mode)
    STATUS = 10
    DISCOVER_TOPICS = 11
    DISCOVER_TOPOLOGY = 12


def encode_frame(msg_id: int, payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"frame payload of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
    if not 0 <= msg_id <= 0xFF:
        raise ValueError(f"msg_id out of range: {msg_id}")
    return FRAME_HEADER.pack(msg_id, len(payload)) + payload


def maybe_frame(buf: BytesLike, position: int = 0) -> tuple[int, memoryview, int] | None:
    """One frame at `position`: (msg_id, payload, position after the frame), or None while incomplete.

    The payload is a view of `buf` (no copy); a bytearray cannot be resized while such a view is alive.
    """
    if len(buf) - position < FRAME_HEADER.size:
        return None
    msg_id, length = FRAME_HEADER.unpack_from(buf, position)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame length {length} exceeds {MAX_FRAME_BYTES} bytes", position + 1)
    start = position + FRAME_HEADER.size
    end = start + length
    if end > len(buf):
        return None
    return msg_id, memoryview(buf)[start:end], end


class FrameBuffer:
    """Bytes received so far on a connection, cut into whole frames as they complete.

    Each payload is copied out of the buffer, so frames can be kept while more bytes arrive (a bytearray cannot be
    resized while a view of it is alive). Raises ProtocolError as soon as a frame header announces more than
    MAX_FRAME_BYTES.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_frame(self) -> tuple[int, bytes] | None:
        got = maybe_frame(self._buf)
        if got is None:
            return None
        msg_id, view, consumed = got
        payload = bytes(view)
        view.release()
        del got, view
        del self._buf[:consumed]
        return msg_id, payload

    def __len__(self) -> int:
        return len(self._buf)
