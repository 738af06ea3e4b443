"""Frames: every TANK message in both directions (docs/protocol.md §1, §2).

Frame layout:

    msg_id    u8        MsgType
    length    u32       payload bytes that follow (not counting these 5)
    payload   length bytes

A broker closes the connection when `length` exceeds 256 MiB, so such a header is refused as soon as its 5 bytes are
there, instead of waiting for (and buffering) a quarter gigabyte.

`cut_frames` is the one frame cutter: the broker's connections (tiered/server/connection.py) and the client's
(tiered/client/connection.py) both cut what they receive with it, and `maybe_frame` reads one frame with the same
header check. `cut_payloads` is the broker connection's pass: the same cut, with every payload copied out as bytes, in
one native call per read (`_bundlescan.cut_payloads`; `_cut_payloads_py`, built on `cut_frames`, is its reference).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from tiered.protocol.buffers import BytesLike
from tiered.protocol.errors import ProtocolError

# What cut_payloads returns: (frames, rest, payload_bytes, big, error). `frames`: every whole frame in order, as
# (msg_id, payload) with the payload copied out as bytes (read-only, so the produce path's record views need no
# conversion, and the receive buffer may be reused at once); `rest`, `big` and `error` as FrameCut's; `payload_bytes`
# the payloads' total length. A plain tuple: one per read, built in C.
PayloadCut = tuple[list[tuple[int, bytes]], int, int, "tuple[int, int] | None", "ProtocolError | None"]


_cut_payloads_native: Callable[[BytesLike, int, int, int], PayloadCut] | None
try:
    from tiered.protocol._bundlescan import cut_payloads as _cut_payloads_native
except ImportError:  # no C compiler at install: the reference below serves
    _cut_payloads_native = None

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


@dataclass(slots=True)
class FrameCut:
    """What `cut_frames` found in `buf[start:end]`."""

    frames: list[tuple[int, int, int]]  # every whole frame, in order: (msg_id, payload start, payload end) in buf
    rest: int  # the first byte not cut: the start of a frame not all here yet (== end when every byte was cut)
    # (msg_id, payload length) of the frame whose header is at `rest` when its payload is at least `big_bytes` long
    # and not all here: the caller receives the rest of it into a buffer of its own rather than growing its own.
    big: tuple[int, int] | None = None
    error: ProtocolError | None = None  # the header at `rest` announces more than MAX_FRAME_BYTES: nothing after it
    # is cut, and the connection is to be closed


def cut_frames(buf: BytesLike, start: int, end: int, big_bytes: int = MAX_FRAME_BYTES + 1) -> FrameCut:
    """Cuts the whole frames of `buf[start:end]`, received bytes that start at a frame boundary. Pure: no copy of a
    payload is made, the caller slices or views the ranges it is given (and keeps `buf[rest:end]` for later)."""
    frames: list[tuple[int, int, int]] = []
    header = FRAME_HEADER.size
    while end - start >= header:
        msg_id, length = FRAME_HEADER.unpack_from(buf, start)
        if length > MAX_FRAME_BYTES:
            return FrameCut(frames, start, None,
                            ProtocolError(f"frame length {length} exceeds {MAX_FRAME_BYTES} bytes", start + 1))
        stop = start + header + length
        if stop > end:
            return FrameCut(frames, start, (msg_id, length) if length >= big_bytes else None)
        frames.append((msg_id, start + header, stop))
        start = stop
    return FrameCut(frames, start)


def _cut_payloads_py(buf: BytesLike, start: int, end: int, big_bytes: int) -> PayloadCut:
    """The reference of the native `cut_payloads`: cut_frames, then each payload copied out."""
    if start < 0 or end < start or end > len(buf):
        raise ValueError("cut_payloads: start and end must lie within the buffer, start <= end")
    cut = cut_frames(buf, start, end, big_bytes)
    with memoryview(buf) as view:
        frames = [(msg_id, bytes(view[first:stop])) for msg_id, first, stop in cut.frames]
    return frames, cut.rest, sum(len(p) for _, p in frames), cut.big, cut.error


cut_payloads = _cut_payloads_py if _cut_payloads_native is None else _cut_payloads_native


def maybe_frame(buf: BytesLike, position: int = 0) -> tuple[int, memoryview, int] | None:
    """One frame at `position`: (msg_id, payload, position after the frame), or None while incomplete. Raises
    ProtocolError for a header announcing more than MAX_FRAME_BYTES, as soon as its 5 bytes are there.

    The payload is a view of `buf` (no copy); a bytearray cannot be resized while such a view is alive.
    """
    if len(buf) - position < FRAME_HEADER.size:
        return None
    # Cut up to the end of the first frame only.
    end = min(len(buf), position + FRAME_HEADER.size + FRAME_HEADER.unpack_from(buf, position)[1])
    cut = cut_frames(buf, position, end)
    if cut.error is not None:
        raise cut.error
    if not cut.frames:
        return None
    msg_id, start, stop = cut.frames[0]
    return msg_id, memoryview(buf)[start:stop], stop


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
