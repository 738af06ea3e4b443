"""The fetch resolver: where the bytes for (partition, seq) come from.

The local partition log answers first (whole bundles, streamed with sendfile). A seq the local log no longer holds
but a lower tier does is handed to `remote` (the tiering layer's RemoteReader); without one, or when it has
nothing, the answer is TANK's boundary fault with the partition's first available seq.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tiered.protocol.codes import UINT64_MAX
from tiered.storage.partition_log import Boundary as LocalBoundary
from tiered.storage.partition_log import Eof as LocalEof

from tiered.server.registry import Partition


@dataclass(frozen=True)
class FileChunk:
    """Bytes [start, end) of an open segment file, sent with sendfile."""

    file: object
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
class Found:
    chunk: FileChunk | BytesChunk
    first_bundle_seq: int
    first_bundle_sparse: bool
    hwmark: int


@dataclass(frozen=True)
class Boundary:
    first_available: int
    hwmark: int


@dataclass(frozen=True)
class Eof:
    first_available: int
    hwmark: int


class RemoteFetcher(Protocol):
    """Returns whole records from a lower tier (tiered.tiering.remote_fetch.RemoteReader), or None."""

    async def fetch(self, topic: str, partition: int, seq: int, fetch_size: int): ...


class FetchResolver:
    def __init__(self, remote: RemoteFetcher | None = None):
        self.remote = remote

    def local(self, part: Partition, seq: int, fetch_size: int) -> Found | Boundary | Eof | None:
        """The local answer, or None when the seq is below the local log but a lower tier may hold it."""
        got = part.log.locate(seq, fetch_size)
        if isinstance(got, LocalEof):
            return Eof(part.first_available, part.hwmark)
        if isinstance(got, LocalBoundary):
            # Below the local log, or in a hole the local log skipped (a disk behind the catalog): a lower tier.
            in_lower_tier = seq != UINT64_MAX and part.first_available <= seq <= part.hwmark
            if self.remote is not None and in_lower_tier:
                return None
            return Boundary(part.first_available, part.hwmark)
        if self.remote is not None and seq < got.first_bundle_seq and seq <= part.remote_hwmark:
            return None  # the local log skipped these seqs (a disk behind the catalog): the bucket has them
        return Found(
            FileChunk(got.file, got.start_position, got.end_position),
            got.first_bundle_seq,
            got.first_bundle_sparse,
            part.hwmark,
        )

    async def resolve(self, part: Partition, seq: int, fetch_size: int) -> Found | Boundary | Eof:
        if seq == 0 and self.remote is not None and part.remote_first_available:
            seq = part.first_available  # "from the beginning" may begin in the bucket
        got = self.local(part, seq, fetch_size)
        if got is not None:
            return got
        got = await self.remote.fetch(part.topic, part.partition, seq, fetch_size)
        if got is not None:
            return Found(BytesChunk(got.data), got.first_bundle_seq, got.first_bundle_sparse, part.hwmark)
        return Boundary(part.first_available, part.hwmark)
