"""Walking the records of a segment file.

Segment file layout (docs/protocol.md §7), nothing else in the file:

    { bundle_len varint, bundle }   repeated; the bundle header is read with read_bundle_header()

Non-sparse bundles take consecutive seqs from the previous bundle's end (the walk starts from a seq known from
the segment base or an index entry); sparse bundles carry their own first and last seq.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from tiered.protocol.bundle import bundle_seq_range, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import maybe_varint

# Enough bytes for a 5-byte length prefix and the longest bundle header (flags, 5-byte count, u64, 5-byte gap).
RECORD_HEAD_BYTES = 5 + 1 + 5 + 8 + 5
BUNDLE_HEAD_BYTES = RECORD_HEAD_BYTES - 5
WINDOW_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class RecordInfo:
    position: int  # of the varint length prefix
    end: int  # position just after the bundle
    first_seq: int
    last_seq: int
    sparse: bool

    @property
    def length(self) -> int:
        return self.end - self.position


class TornRecord(ProtocolError):
    """The bytes at `position` are not one whole, decodable record."""

    def __init__(self, position: int, reason: str):
        self.reason = reason
        super().__init__(reason, position)


def pread_exact(fd: int, length: int, position: int) -> bytes:
    """`length` bytes at `position`; raises OSError if the file ends first."""
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, position)
        if not chunk:
            raise OSError(f"file ends at {position}, {length} bytes short")
        chunks.append(chunk)
        length -= len(chunk)
        position += len(chunk)
    return b"".join(chunks) if len(chunks) != 1 else chunks[0]


class ReadAhead:
    """Read-ahead over [0, end) of a file, so that walking many small records costs few preads."""

    __slots__ = ("fd", "end", "start", "buf")

    def __init__(self, fd: int, end: int):
        self.fd = fd
        self.end = end
        self.start = 0
        self.buf = b""

    def get(self, position: int, length: int) -> bytes:
        length = min(length, self.end - position)
        offset = position - self.start
        if offset < 0 or offset + length > len(self.buf):
            self.buf = os.pread(self.fd, min(max(WINDOW_BYTES, length), self.end - position), position)
            self.start = position
            offset = 0
        return self.buf[offset : offset + length]


def read_record_info(window: ReadAhead, position: int, next_seq: int) -> RecordInfo:
    head = window.get(position, RECORD_HEAD_BYTES)
    try:
        got = maybe_varint(head, 0)
    except ProtocolError:
        raise TornRecord(position, "bad bundle length varint") from None
    if got is None:
        raise TornRecord(position, "truncated bundle length varint")
    size, prefix = got
    if size == 0:
        raise TornRecord(position, "zero bundle length")
    end = position + prefix + size
    if end > window.end:
        raise TornRecord(position, f"truncated bundle ({window.end - position - prefix} of {size} bytes)")
    try:
        header = read_bundle_header(head[prefix : prefix + min(size, BUNDLE_HEAD_BYTES)])
    except ProtocolError as exc:
        raise TornRecord(position, f"undecodable bundle header: {exc}") from None
    first, last = bundle_seq_range(header, next_seq)
    if first < next_seq:
        raise TornRecord(position, f"sparse bundle seq {first} goes back below {next_seq}")
    return RecordInfo(position, end, first, last, header.sparse)


def iter_records(fd: int, start: int, end: int, next_seq: int) -> Iterator[RecordInfo]:
    """Records from `start` up to `end`; raises TornRecord at the first one that is not whole and decodable.

    `next_seq` is the seq the record at `start` takes if it is not sparse.
    """
    window = ReadAhead(fd, end)
    position = start
    while position < end:
        info = read_record_info(window, position, next_seq)
        yield info
        position = info.end
        next_seq = info.last_seq + 1
