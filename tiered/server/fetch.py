"""The fetch resolver: carries out the choice tiered.bounds.locate makes for (partition, seq).

Local: whole bundles of one segment file, streamed with sendfile. The local log may turn the choice down when the
seq falls between two local segments (seqs a disk behind the catalog never held): then the tier below answers.
Remote: the tier reads the bucket; a seq it cannot read (no location, or a missing object) is answered as a system
error for that partition, never skipped. A remote chunk may still be arriving (StreamChunk): its length is known, and
its bytes are written as they come.
A partition led elsewhere serves its history here; at or past the catalog's high-water mark the leader answers
(tiered.server.leaders).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered.bounds import Boundary, Eof, Local, PartitionBounds, Remote, local_miss, locate
from tiered.server.leaders import LedElsewhere
from tiered.server.registry import Partition, Role
from tiered.storage.segment import SegmentReader
from tiered.tier_interface import ChunkStream, Expired, RemoteChunk, Tier, Unreadable


@dataclass(frozen=True)
class FileChunk:
    """Bytes [start, end) of an open segment file, sent with sendfile."""

    file: SegmentReader
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class BytesChunk:
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class StreamChunk:
    stream: ChunkStream

    @property
    def size(self) -> int:
        return self.stream.size


Chunk = FileChunk | BytesChunk | StreamChunk


def release(chunks: list[Chunk]) -> None:
    """Gives back what unsent chunks hold (the streams' read buffers)."""
    for chunk in chunks:
        if isinstance(chunk, StreamChunk):
            chunk.stream.close()


@dataclass(frozen=True)
class Found:
    chunk: Chunk
    first_bundle_seq: int
    first_bundle_sparse: bool
    hwmark: int


Resolved = Found | Boundary | Eof | Unreadable | LedElsewhere


class FetchResolver:
    def __init__(self, tier: Tier):
        self.tier = tier

    async def resolve(self, part: Partition, seq: int, fetch_size: int) -> Resolved:
        bounds = part.bounds()
        where = locate(seq, bounds)
        if part.role is not Role.LEADER and _past_known(seq, where, bounds):
            # A follower learns the catalog's bounds when a read needs them (no broker polls every partition's):
            # what was committed since may be served here; the tail still goes to the leader.
            if part.role is Role.FOLLOWER and await self.tier.refresh_follower(part.tp):
                bounds = part.bounds()
                where = locate(seq, bounds)
            if not _led_here(part) and _past_known(seq, where, bounds):  # the role may have changed while awaiting
                return LedElsewhere(part.leader)  # the tail, or past what this broker knows is committed
        if isinstance(where, Local):
            # Never past the local records this broker may serve (a follower's may end before its disk does).
            limit = min(bounds.hwmark, bounds.local_last)
            got = part.log.read(where.seq, fetch_size, limit, across_gaps=not bounds.lower_tier)
            if got is not None:
                return Found(FileChunk(got.file, got.start_position, got.end_position), got.first_bundle_seq,
                             got.first_bundle_sparse, bounds.hwmark)
            where = local_miss(where.seq, bounds)
        if isinstance(where, Remote):
            return await self._remote(part, where.seq, fetch_size, bounds)
        return where

    async def _remote(self, part: Partition, seq: int, fetch_size: int, bounds: PartitionBounds) -> Resolved:
        got = await self.tier.read(part.tp, seq, fetch_size, bounds)
        if isinstance(got, RemoteChunk):
            chunk = BytesChunk(got.data) if isinstance(got.data, bytes) else StreamChunk(got.data)
            return Found(chunk, got.first_bundle_seq, got.first_bundle_sparse, bounds.hwmark)
        if isinstance(got, Unreadable):
            return got
        if isinstance(got, Expired):  # retention took it since `bounds` were read: below the start, as TANK says
            part.catalog_first_moved(got.first_available)  # the catalog's, read just now: later answers agree
            return Boundary(part.bounds().first_available, bounds.hwmark)
        return Boundary(bounds.first_available, bounds.hwmark)


def _led_here(part: Partition) -> bool:
    return part.role is Role.LEADER


def _past_known(seq: int, where: object, bounds: PartitionBounds) -> bool:
    """Whether `seq` is past what is known committed (the tail), for a partition not led here."""
    return isinstance(where, Eof) or isinstance(where, Boundary) and seq > 0 and seq >= bounds.first_available
