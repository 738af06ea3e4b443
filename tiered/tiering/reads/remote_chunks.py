"""Chunks from streamed range GETs (tiered.tiering.reads.range_reads), shared by the reads of remote segments
(tiered.tiering.reads.remote_fetch) and of block runs (tiered.tiering.reads.run_reads).

A chunk starts at the whole bundle holding the asked seq (`find_first_bundle`, which waits for that bundle to arrive
whole) and ends at a bundle boundary; where an index does not tell the end, the records are walked (`walked_end`).
`RangeChunk` hands the chunk to the connection piece by piece as the GET brings it in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from tiered.protocol.bundle import bundle_seq_range, maybe_record, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.protocol.varint import maybe_varint
from tiered.tiering.reads.range_reads import Pace, RangeRead

SEND_PIECE_BYTES = 1 << 20  # the most of a remote answer written to a connection at once


@dataclass(frozen=True, slots=True)
class FirstBundle:
    start: int  # position of its length prefix
    end: int
    first_seq: int
    last_seq: int
    sparse: bool


async def walked_end(read: RangeRead, first: FirstBundle, ceiling: int) -> tuple[int, int]:
    """(end, last seq) of the whole records from `first` that end by `ceiling`, once they have arrived."""
    arrived = await read.until(ceiling)
    view = read.view(read.start, arrived)
    end, last = first.end, first.last_seq
    while end < ceiling:
        got = maybe_record(view, end - read.start)
        if got is None or got[1] + read.start > ceiling:
            break
        bundle_start, bundle_end = got
        last = bundle_seq_range(read_bundle_header(view[bundle_start:bundle_end]), last + 1)[1]
        end = bundle_end + read.start
    return end, last


async def find_first_bundle(read: RangeRead, floor: int, floor_seq: int, seq: int) -> FirstBundle | None:
    """The first bundle of `read` from `floor` whose last seq is >= `seq`, once it has arrived whole; None if the
    read holds none. Raises ProtocolError on bytes that are not whole records, and what the GET failed with."""
    position, next_seq = floor, floor_seq
    while position < read.end:
        arrived = await read.until(position + 5)  # a varint is at most 5 bytes
        got = maybe_varint(read.view(position, arrived), 0)
        if got is None:
            raise ProtocolError("a remote segment ends inside a record length", position)
        size, skip = got
        if size == 0:
            raise ProtocolError("zero-length bundle in a remote segment", position)
        bundle_start, bundle_end = position + skip, position + skip + size
        if bundle_end > read.end or await read.until(bundle_end) < bundle_end:
            raise ProtocolError("a remote segment ends inside a record", position)
        header = read_bundle_header(read.view(bundle_start, bundle_end))
        first, last = bundle_seq_range(header, next_seq)
        if last >= seq:
            return FirstBundle(position, bundle_end, first, last, header.sparse)
        position, next_seq = bundle_end, last + 1
    return None


class RangeChunk:
    """A chunk [start, end) of a streamed range GET (tier_interface.ChunkStream); closing it closes the GET.

    Pieces are at most SEND_PIECE_BYTES (a larger write would be copied into the transport's buffer at once, holding
    the loop) and each waits for `pace` first: an answer being sent gives way to the hot path as its GET does."""

    def __init__(self, read: RangeRead, start: int, end: int, pace: Pace | None = None):
        self.read = read
        self.start = start
        self.end = end
        self.size = end - start
        self.pace = pace

    async def pieces(self) -> AsyncIterator[memoryview]:
        position = self.start
        while position < self.end:
            arrived = min(await self.read.until(position + 1), self.end, position + SEND_PIECE_BYTES)
            if arrived <= position:
                raise EOFError(f"object {self.read.object_key} ended at {arrived}, inside a chunk ending at {self.end}")
            if self.pace is not None:
                await self.pace()
            yield self.read.view(position, arrived)
            position = arrived

    def close(self) -> None:
        self.read.close()
