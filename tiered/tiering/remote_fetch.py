"""Serving seqs the local disk no longer holds, from the bucket (DESIGN.md, data path step 6).

A remote segment is tried first: its catalog row (cached per partition) and its index object (fetched once and
cached) give the byte position of the bundle holding the seq, and one range GET reads whole bundles from there.
Seqs not yet in a remote segment come from the block run that holds them (one index scan, one range GET). The
chunk handed to the consumer starts at the whole bundle holding the seq and stops at a bundle boundary near
`fetch_size`, so a TANK client cannot tell it from a local read. Remote reads run under their own concurrency limit, apart from the
produce path and local reads, so that a replaying consumer cannot stall producers or tail consumers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass

from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import segments as catalog_segments
from tiered.storage.index import SparseIndex
from tiered.protocol.bundle import bundle_seq_range, maybe_record, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.tiering.catalog_thread import CatalogThread
from tiered.tiering.store import ObjectNotFound, ObjectStore

log = logging.getLogger("tiered.tiering")


@dataclass(frozen=True, slots=True)
class RemoteChunk:
    data: bytes  # whole {varint len, bundle} records
    first_bundle_seq: int
    first_bundle_sparse: bool


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


class SegmentCache:
    """Recently used remote segments per partition, so a warm fetch needs no catalog query.

    Entries can only go stale by remote retention, whose deletion waits a grace period longer than an entry's
    life here (`ttl_s`), so a cached segment's objects still exist when it is read.
    """

    def __init__(self, per_partition: int = 64, ttl_s: float = 60.0, clock=time.monotonic):
        self.per_partition = per_partition
        self.ttl_s = ttl_s
        self.clock = clock
        self._rows: dict[tuple[str, int], OrderedDict[int, tuple[float, object]]] = {}

    def get(self, topic: str, partition: int, seq: int):
        rows = self._rows.get((topic, partition))
        if not rows:
            return None
        now = self.clock()
        for base, (born, row) in list(rows.items()):
            if now - born > self.ttl_s:
                del rows[base]
            elif row.base_seq <= seq <= row.last_seq:
                rows.move_to_end(base)
                return row
        return None

    def put(self, row) -> None:
        rows = self._rows.setdefault((row.topic, row.partition), OrderedDict())
        rows[row.base_seq] = (self.clock(), row)
        rows.move_to_end(row.base_seq)
        while len(rows) > self.per_partition:
            rows.popitem(last=False)


class IndexCache:
    """Index objects of remote segments, fetched once each and kept by least recent use up to `max_bytes`."""

    def __init__(self, max_bytes: int = 64 << 20):
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[str, SparseIndex] = OrderedDict()

    def get(self, object_key: str) -> SparseIndex | None:
        index = self._entries.get(object_key)
        if index is not None:
            self._entries.move_to_end(object_key)
        return index

    def put(self, object_key: str, index: SparseIndex) -> None:
        if object_key in self._entries:
            return
        self._entries[object_key] = index
        self.size_bytes += index.size_bytes
        while self.size_bytes > self.max_bytes and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self.size_bytes -= old.size_bytes


class _RunKey:
    """A run location under the names SegmentCache looks up (base_seq, last_seq)."""

    __slots__ = ("topic", "partition", "base_seq", "last_seq", "run")

    def __init__(self, run):
        self.topic, self.partition, self.base_seq, self.last_seq = run.topic, run.partition, run.first_seq, run.last_seq
        self.run = run


class BytesCache:
    """Recently read block runs, least recently used first out, up to `max_bytes`.

    A run is read whole (the catalog does not know where its bundles start), so a consumer reading a run in fetches
    smaller than the run would otherwise GET the whole run once per fetch. Runs never change once committed.
    """

    def __init__(self, max_bytes: int = 64 << 20):
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def get(self, key: tuple[str, int]) -> bytes | None:
        data = self._entries.get(key)
        if data is not None:
            self._entries.move_to_end(key)
        return data

    def put(self, key: tuple[str, int], data: bytes) -> None:
        if key in self._entries or len(data) > self.max_bytes:
            return
        self._entries[key] = data
        self.size_bytes += len(data)
        while self.size_bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.size_bytes -= len(old)


class RemoteReader:
    """Remote segments first (cached segment rows and index objects, one range GET of whole bundles), then block
    runs (one catalog query, one range GET)."""

    def __init__(self, store: ObjectStore, catalog: CatalogThread, metrics, *, max_concurrency: int = 8,
                 segments: SegmentCache | None = None, indexes: IndexCache | None = None,
                 runs: SegmentCache | None = None, highest_copied=lambda topic, partition: None):
        self.store = store
        self.catalog = catalog
        self.metrics = metrics
        self.segments = segments or SegmentCache()
        self.indexes = indexes or IndexCache()
        self.runs = runs or SegmentCache()  # run locations, kept like segment rows (same grace-period argument)
        self.run_bytes = BytesCache()
        # The highest seq in a copied remote segment, when the caller knows it (None: unknown): a seq above it can
        # only be in a block run, so the segment lookup is skipped.
        self.highest_copied = highest_copied
        self._slots = asyncio.Semaphore(max_concurrency)

    async def fetch(self, topic: str, partition: int, seq: int, fetch_size: int) -> RemoteChunk | None:
        async with self._slots:
            copied = self.highest_copied(topic, partition)
            got = None
            if copied is None or seq <= copied:
                got = await self._from_segment(topic, partition, seq, fetch_size)
            if got is None:
                got = await self._from_run(topic, partition, seq, fetch_size)
            if got is not None:
                self.metrics.inc("tiered_remote_bytes_total", len(got.data), help="bytes served from the bucket")
            return got

    async def _query(self, fn, *args):
        self.metrics.inc("tiered_remote_catalog_queries_total", help="catalog lookups by remote reads")
        return await self.catalog.call(fn, *args)

    async def _get(self, object_key: str, start: int, end: int) -> bytes | None:
        self.metrics.inc("tiered_remote_gets_total", help="range GETs by remote reads")
        try:
            return await self.store.get_range(object_key, start, end)
        except ObjectNotFound:
            log.error("object %s named by the catalog is missing from the bucket", object_key)
            self.metrics.inc("tiered_remote_missing_objects_total", help="objects the catalog names but the bucket lacks")
            return None

    async def _from_segment(self, topic: str, partition: int, seq: int, fetch_size: int) -> RemoteChunk | None:
        row = self.segments.get(topic, partition, seq)
        if row is None:
            self.metrics.inc("tiered_remote_cache_misses_total", help="remote reads that needed a catalog lookup")
            row = await self._query(catalog_segments.find_remote_segment, topic, partition, seq)
            if row is None:
                return None  # not in a remote segment (a block run may hold it)
            # A seq in the gap before a segment (sparse produces jump) is served from the segment's first bundle:
            # no block run can hold it, since the runs a segment covers are pruned once it is copied.
            self.segments.put(row)
        else:
            self.metrics.inc("tiered_remote_cache_hits_total", help="remote reads served without a catalog lookup")
        index = self.indexes.get(row.index_object_key)
        if index is None:
            data = await self._get(row.index_object_key, 0, max(row.index_size_bytes, 1))
            if data is None:
                return None
            index, _ = SparseIndex.from_bytes(data)
            self.indexes.put(row.index_object_key, index)
        floor = index.floor(seq - row.base_seq)
        rel_seq, start = floor if floor is not None else (0, 0)
        # End at an index entry past start + fetch_size (bundle boundaries), or the end of the segment.
        i = bisect_right(index.positions, start + fetch_size)
        end = index.positions[i] if i < len(index.positions) else row.size_bytes
        data = await self._get(row.object_key, start, end)
        if data is None:
            return None
        trimmed = trim_chunk(data, row.base_seq + rel_seq, seq, fetch_size)
        return RemoteChunk(*trimmed) if trimmed is not None else None

    async def _from_run(self, topic: str, partition: int, seq: int, fetch_size: int) -> RemoteChunk | None:
        cached = self.runs.get(topic, partition, seq)
        run = cached.run if cached is not None else None
        if run is None:
            run = await self._query(catalog_blocks.find_run, topic, partition, seq)
            if run is None:
                return None
            if run.first_seq <= seq:
                self.runs.put(_RunKey(run))
        key = (run.object_key, run.position)
        data = self.run_bytes.get(key)
        if data is None:
            data = await self._get(run.object_key, run.position, run.position + run.length_bytes)
            if data is None:
                return None
            self.run_bytes.put(key, data)
        else:
            self.metrics.inc("tiered_remote_run_cache_hits_total", help="remote reads served from a cached block run")
        trimmed = trim_chunk(data, run.first_seq, seq, fetch_size)
        return RemoteChunk(*trimmed) if trimmed is not None else None
