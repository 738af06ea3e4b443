"""Serving seqs the local disk no longer holds, from the bucket (DESIGN.md, data path step 6).

The catalog names the block run that holds the seq (one index scan); one range GET fetches it; the chunk handed
to the consumer starts at the whole bundle holding the seq and stops at a bundle boundary near `fetch_size`, so a
TANK client cannot tell it from a local read. Remote reads run under their own concurrency limit, apart from the
produce path and local reads, so that a replaying consumer cannot stall producers or tail consumers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from tiered.catalog import blocks as catalog_blocks
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


class RemoteReader:
    def __init__(self, store: ObjectStore, catalog: CatalogThread, metrics, *, max_concurrency: int = 8):
        self.store = store
        self.catalog = catalog
        self.metrics = metrics
        self._slots = asyncio.Semaphore(max_concurrency)

    async def fetch(self, topic: str, partition: int, seq: int, fetch_size: int) -> RemoteChunk | None:
        async with self._slots:
            run = await self.catalog.call(catalog_blocks.find_run, topic, partition, seq)
            self.metrics.inc("tiered_remote_catalog_queries_total", help="catalog lookups by remote reads")
            if run is None:
                return None
            try:
                data = await self.store.get_range(run.object_key, run.position, run.position + run.length_bytes)
            except ObjectNotFound:
                log.error("block %s named by the catalog is missing from the bucket", run.object_key)
                self.metrics.inc("tiered_remote_missing_objects_total", help="objects the catalog names but the bucket lacks")
                return None
            self.metrics.inc("tiered_remote_gets_total", help="range GETs by remote reads")
            trimmed = trim_chunk(data, run.first_seq, seq, fetch_size)
            if trimmed is None:
                return None
            self.metrics.inc("tiered_remote_bytes_total", len(trimmed[0]), help="bytes served from the bucket")
            return RemoteChunk(*trimmed)
