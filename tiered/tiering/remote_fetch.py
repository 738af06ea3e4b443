"""Serving seqs the local disk no longer holds, from the bucket (DESIGN.md, data path step 6).

A remote segment is tried first: its catalog row (cached per partition) and its index object (fetched once and
cached) give the byte position of the bundle holding the seq, and one range GET reads whole bundles from there.
Seqs not in a remote segment come from the block run that answers for them (one index scan, one range GET). A
location answers for [from_seq, last_seq]: a seq in a jump before its first record reads from that record, as in
TANK, but a seq that no location answers for is reported (Unreadable), never served from a later location. The
chunk handed to the consumer starts at the whole bundle holding the seq and stops at a bundle boundary near
`fetch_size`, so a TANK client cannot tell it from a local read. Remote reads run under their own concurrency limit, apart from the
produce path and local reads, so that a replaying consumer cannot stall producers or tail consumers.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from typing import Callable

from tiered import metrics as m
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import segments as catalog_segments
from tiered.catalog.blocks import RunLocation
from tiered.catalog.segments import SegmentRow
from tiered.metrics import Metrics
from tiered.protocol.bundle import bundle_seq_range, maybe_record, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.storage.index import SparseIndex
from tiered.tier_interface import RemoteChunk, Unreadable
from tiered.tiering.caches import RangeCache, SizedLru
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.store import ObjectNotFound, ObjectStore

log = logging.getLogger("tiered.tiering")


def trim_chunk(data: bytes, first_seq: int, seq: int, fetch_size: int) -> tuple[bytes, int, bool] | None:
    """Whole records of `data` (starting at `first_seq`) from the one holding `seq`, up to about `fetch_size`.

    Returns (chunk, seq of its first bundle, whether that bundle is sparse), or None if no record holds `seq` or
    a later one. The first bundle is always whole even when it exceeds `fetch_size`, as TANK's broker does.
    """
    position = 0
    next_seq = first_seq
    start = None
    end = 0
    head_seq, head_sparse = 0, False
    view = memoryview(data)
    while position < len(view):
        got = maybe_record(view, position)
        if got is None:
            raise ProtocolError("a remote run ends inside a record", position)
        bundle_start, bundle_end = got
        header = read_bundle_header(view[bundle_start:bundle_end])
        first, last = bundle_seq_range(header, next_seq)
        next_seq = last + 1
        if start is None:
            if last >= seq:
                start, head_seq, head_sparse = position, first, header.sparse
        elif bundle_end - start > fetch_size:
            break
        end = bundle_end
        position = bundle_end
    if start is None:
        return None
    return bytes(view[start:end]), head_seq, head_sparse


class RemoteReader:
    """Remote segments first (cached segment rows and index objects, one range GET of whole bundles), then block
    runs (one catalog query, one range GET). A seq that neither answers for is Unreadable, never skipped."""

    def __init__(self, store: ObjectStore, catalog: AsyncCatalog, metrics: Metrics, *, max_concurrency: int = 8,
                 highest_copied: Callable[[str, int], int | None] = lambda topic, partition: None):
        self.store = store
        self.catalog = catalog
        self.metrics = metrics
        self.segments: RangeCache[SegmentRow] = RangeCache()
        self.indexes: SizedLru[str, SparseIndex] = SizedLru(64 << 20, lambda index: index.size_bytes)
        self.runs: RangeCache[RunLocation] = RangeCache()  # same grace-period argument as segment rows
        # A run is read whole (the catalog does not know where its bundles start), so a consumer reading a run in
        # fetches smaller than the run would otherwise GET the whole run once per fetch. Runs never change.
        self.run_bytes: SizedLru[tuple[str, int], bytes] = SizedLru(64 << 20, len)
        # The highest seq in a copied remote segment, when the caller knows it (None: unknown): a seq above it can
        # only be in a block run, so the segment lookup is skipped.
        self.highest_copied = highest_copied
        self._slots = asyncio.Semaphore(max_concurrency)

    async def fetch(self, topic: str, partition: int, seq: int, fetch_size: int) -> RemoteChunk | Unreadable:
        async with self._slots:
            copied = self.highest_copied(topic, partition)
            got: RemoteChunk | Unreadable | int | None = None
            while copied is None or seq <= copied:
                got = await self._from_segment(topic, partition, seq, fetch_size)
                if not isinstance(got, int):
                    break
                seq, got = got, None  # compaction removed the segment's messages from seq on: the next one answers
            if got is None:
                got = await self._from_run(topic, partition, seq, fetch_size)
            if got is None:
                self.metrics.inc(m.UNLOCATED_READS)
                log.error("%s/%d: no remote segment or block run answers for seq %d, below the high-water mark: "
                          "the catalog has a hole (run `tiered catalog check`)", topic, partition, seq)
                return Unreadable(f"no location holds seq {seq}")
            if isinstance(got, RemoteChunk):
                self.metrics.inc(m.REMOTE_BYTES, len(got.data))
            return got

    async def _query(self, fn, *args):
        self.metrics.inc(m.REMOTE_CATALOG_QUERIES)
        return await self.catalog.read(fn, *args)

    async def _get(self, object_key: str, start: int, end: int) -> bytes | None:
        self.metrics.inc(m.REMOTE_GETS)
        try:
            return await self.store.get_range(object_key, start, end)
        except ObjectNotFound:
            log.error("object %s named by the catalog is missing from the bucket", object_key)
            self.metrics.inc(m.REMOTE_MISSING_OBJECTS)
            return None

    async def _from_segment(self, topic: str, partition: int, seq: int,
                            fetch_size: int) -> RemoteChunk | Unreadable | int | None:
        """The chunk from the segment holding `seq`; None when no segment answers for it; the seq after the
        segment when it answers for `seq` but holds no message at or after it (compaction removed them)."""
        row = self.segments.get(topic, partition, seq)
        if row is None:
            self.metrics.inc(m.REMOTE_CACHE_MISSES)
            row = await self._query(catalog_segments.find_remote_segment, topic, partition, seq)
            if row is None or not row.holds(seq):
                return None  # no remote segment answers for it (a block run may)
            self.segments.put(row)
        else:
            self.metrics.inc(m.REMOTE_CACHE_HITS)
        index = self.indexes.get(row.index_object_key)
        if index is None:
            data = await self._get(row.index_object_key, 0, max(row.index_size_bytes, 1))
            if data is None:
                return Unreadable(f"index object {row.index_object_key} is missing")
            index, _ = SparseIndex.from_bytes(data)
            self.indexes.put(row.index_object_key, index)
        floor = index.floor(seq - row.base_seq) if seq >= row.base_seq else None
        rel_seq, start = floor if floor is not None else (0, 0)
        # End at an index entry past start + fetch_size (bundle boundaries), or the end of the segment.
        i = bisect_right(index.positions, start + fetch_size)
        end = index.positions[i] if i < len(index.positions) else row.size_bytes
        data = await self._get(row.object_key, start, end)
        if data is None:
            return Unreadable(f"segment object {row.object_key} is missing")
        trimmed = trim_chunk(data, row.base_seq + rel_seq, seq, fetch_size)
        if trimmed is None:
            return row.last_seq + 1 if end >= row.size_bytes else None
        return RemoteChunk(*trimmed)

    async def _from_run(self, topic: str, partition: int, seq: int, fetch_size: int) -> RemoteChunk | Unreadable | None:
        run = self.runs.get(topic, partition, seq)
        if run is None:
            run = await self._query(catalog_blocks.find_run, topic, partition, seq)
            if run is None or not run.holds(seq):
                return None
            self.runs.put(run)
        key = (run.object_key, run.position)
        data = self.run_bytes.get(key)
        if data is None:
            data = await self._get(run.object_key, run.position, run.position + run.length_bytes)
            if data is None:
                return Unreadable(f"block object {run.object_key} is missing")
            self.run_bytes.put(key, data)
        else:
            self.metrics.inc(m.REMOTE_RUN_CACHE_HITS)
        trimmed = trim_chunk(data, run.first_seq, seq, fetch_size)
        return RemoteChunk(*trimmed) if trimmed is not None else None
