"""Range reads of block runs by their bundle index (block format version 3; docs/architecture.md, data path step 6).

A run's bundle index lives in its block's footer, at the end of the object, and nowhere else: the catalog locates a
run (tiered.catalog.locate, which also gives the object's size) and the footer locates its bundles, so
`tiered catalog rebuild` still restores everything from the bucket alone and no migration is needed. A reader GETs a
block's footer once (`read_footer`: the object's last TAIL_GUESS_BYTES, and a second GET only for a bigger footer)
and keeps the indexes of all its runs (`BlockIndexes`, in the remote reader's cache within the read budget); a block
of version 1 or 2 is remembered as having none, and its runs are read whole as before.

With the index, a fetch GETs `run_window`: from the entry at or before the seq to where any answer starting in the
bundle holding the seq must end. That bundle starts by the next entry, so the window reads at most one index interval
(INDEX_EVERY_BYTES) plus one bundle more than the answer, which ends as a whole-run read's does (trim_chunk's rule:
the last bundle ending within the fetch size of the answer's start, the first bundle whole). A fetch smaller than an
index interval reads the run's pages between index entries instead, GET once and cached. A run of a block of version
1 or 2 is GET whole once, cached, and trimmed per fetch (`trim_chunk`).

`RunReads` is the block-run half of the remote reader (tiered.tiering.reads.remote_fetch.RemoteReader, which asks it for a
seq a block run answers for): it owns the caches of run locations, footers and run bytes.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left, bisect_right
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tiered import metrics as m
from tiered.catalog.blocks import RunLocation
from tiered.clock import Clock
from tiered.metrics import Metrics
from tiered.protocol.bundle import bundle_seq_range, maybe_record, read_bundle_header
from tiered.protocol.errors import ProtocolError
from tiered.tier_interface import RemoteChunk, Unreadable
from tiered.tiering.blocks.block_format import (FOOTER_TRAILER_BYTES, INDEX_EVERY_BYTES, RunIndex, block_tail_bytes,
                                         read_block_indexes)
from tiered.tiering.reads.caches import RangeCache, SizedLru
from tiered.tiering.reads.range_reads import Pace, RangeRead, ReadBudget
from tiered.tiering.reads.remote_chunks import RangeChunk, find_first_bundle, walked_end
from tiered.tiering.objects.store import ObjectStore
from tiered.tiering.objects.meter import Attribution
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.tiering")

# One GET reads the footer of a block of up to ~40 runs with full indexes (8 MiB of records has ~128 entries of
# 3 to 5 bytes); a bigger footer takes a second GET of exactly its size.
TAIL_GUESS_BYTES = 4096
_HELD_BYTES_PER_ENTRY = 64  # what a cached index entry or run costs in memory, about: counted against the budget


@dataclass(frozen=True, slots=True)
class BlockIndexes:
    """The bundle index of each run of one block object, by the run's position (None: a block of version 1 or 2)."""

    by_position: dict[int, RunIndex | None]
    size_bytes: int  # memory held, roughly

    @classmethod
    def of(cls, indexes: dict[int, RunIndex | None]) -> BlockIndexes:
        entries = sum(len(index.seqs) for index in indexes.values() if index is not None)
        return cls(indexes, _HELD_BYTES_PER_ENTRY * (entries + len(indexes)))


async def read_footer(get: Callable[[str, int, int], Awaitable[bytes | None]], run: RunLocation) -> BlockIndexes | None:
    """The indexes of the runs of `run`'s block, from the object's tail (`get(key, start, end)` is a range GET that
    answers None for a missing object, then so does this). Raises ProtocolError for a footer that is not one."""
    size = run.block_size_bytes
    if size < FOOTER_TRAILER_BYTES:
        return BlockIndexes.of({})  # not a size a block can have: read the run whole, which checks its records
    tail = await get(run.object_key, size - min(size, TAIL_GUESS_BYTES), size)
    if tail is None:
        return None
    needed = block_tail_bytes(tail)
    if needed > len(tail) and needed <= size:
        tail = await get(run.object_key, size - needed, size)
        if tail is None:
            return None
    return BlockIndexes.of({row.position: index for row, index in read_block_indexes(tail, size)})


@dataclass(frozen=True, slots=True)
class RunWindow:
    """The range GET for a seq of a run, in positions relative to the run's start: [floor, end), floor an index entry
    whose bundle starts at floor_seq."""

    floor_seq: int
    floor: int
    end: int


def run_window(index: RunIndex, seq: int, fetch_size: int) -> RunWindow:
    """The GET window of `seq` in the run `index` describes.

    Entry i is the last whose seq is <= `seq` (entry 0, the run's start, for a seq in a jump before the run's first
    record). The bundle holding the seq (the first whose last seq is >= seq) starts at or after entry i and no later
    than entry i + 1, whose first seq is past the seq; so it ends by entry i + 2, and an answer starting there ends
    within `fetch_size` of entry i + 1 or with that bundle. When the seq is at or before entry i's seq, the bundle
    at entry i holds it: the answer starts at the floor and its first bundle ends by entry i + 1."""
    seqs, positions, size = index.seqs, index.positions, index.length_bytes
    i = max(bisect_right(seqs, seq) - 1, 0)
    floor, floor_seq = positions[i], seqs[i]
    next_entry = positions[i + 1] if i + 1 < len(positions) else size
    if seq <= floor_seq:
        return RunWindow(floor_seq, floor, min(size, max(floor + fetch_size, next_entry)))
    hold_end = positions[i + 2] if i + 2 < len(positions) else size
    return RunWindow(floor_seq, floor, min(size, max(next_entry + fetch_size, hold_end)))


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


class RunReads:
    """Reads of block runs, for RemoteReader, which inherits them and provides what is declared below: the store,
    the read budget, the GET slots and pace it shares with segment reads, and its `_query` (a counted catalog read),
    `_get` (a counted range GET, None for a missing object) and `_failed` (a failed read as Unreadable)."""

    store: ObjectStore
    metrics: Metrics
    budget: ReadBudget
    pace: Pace | None
    _slots: asyncio.Semaphore
    _query: Callable[..., Awaitable[Any]]
    _get: Callable[[str, int, int, str], Awaitable[bytes | None]]
    _failed: Callable[..., Unreadable]

    def __init__(self, cache_bytes: int, clock: Clock):
        self.runs: RangeCache[RunLocation] = RangeCache(clock.monotonic)  # safe to cache, as segment rows are (tiered.tiering.reads.caches)
        # The bundle indexes of each block's runs, from its footer (read once per block; version 3).
        self.footers: SizedLru[str, BlockIndexes] = SizedLru(cache_bytes // 4, lambda footer: footer.size_bytes)
        # A run of a block without indexes is read whole, so a consumer reading such a run in fetches smaller than the
        # run would otherwise GET the whole run once per fetch; for the same reason small fetches of an indexed run
        # read and keep its pages (by ("page", object key, position)). Runs never change.
        self.run_bytes: SizedLru[tuple, bytes] = SizedLru(cache_bytes // 4, len)

    async def _from_run(self, tp: TopicPartition, run: RunLocation, seq: int,
                        fetch_size: int) -> RemoteChunk | Unreadable | None:
        """The chunk for `seq` from `run`, the run answering for it; None when it holds no record from `seq` on."""
        footer = self.footers.get(run.object_key)
        if footer is None:
            try:
                # The footer is the block's, read for this run's topic (which then pays for it).
                footer = await read_footer(lambda key, start, end: self._get(key, start, end, run.topic), run)
            except ProtocolError as exc:
                # Read the run whole, as from a block without indexes: its records are checked as they are trimmed.
                log.error("block %s: unreadable footer (%s); reading the run whole", run.object_key, exc)
                footer = BlockIndexes.of({})
            if footer is None:
                return Unreadable(f"block object {run.object_key} is missing")
            self.footers.put(run.object_key, footer)
        index = footer.by_position.get(run.position)
        if index is None or index.length_bytes != run.length_bytes:
            return await self._whole_run(run, seq, fetch_size)
        window = run_window(index, seq, fetch_size)
        if fetch_size < INDEX_EVERY_BYTES:
            return await self._from_pages(run, index, window, seq, fetch_size)
        base, run_end = run.position, run.position + run.length_bytes
        self.metrics.inc(m.REMOTE_GETS)
        read = await RangeRead.open(self.store, run.object_key, base + window.floor, base + window.end, self.budget,
                                    self._slots, Attribution.topic(run.topic), self.pace)
        try:
            first = await find_first_bundle(read, base + window.floor, window.floor_seq, seq)
            if first is None:
                read.close()
                return None
            end, _ = await walked_end(read, first, min(run_end, first.start + fetch_size))
        except BaseException as exc:
            read.close()
            if not isinstance(exc, Exception):
                raise
            return self._failed(topic, partition, seq, run.object_key, exc, "block")
        read.stop_at(end)  # the answer is whole once `end` is in: nothing after it is wanted
        return RemoteChunk(RangeChunk(read, first.start, end, self.pace), first.first_seq, first.sparse)

    async def _from_pages(self, run: RunLocation, index: RunIndex, window: RunWindow, seq: int,
                          fetch_size: int) -> RemoteChunk | Unreadable | None:
        """A fetch smaller than an index interval, from the run's pages (the bytes between two index entries), GET
        once and cached: a window would GET up to two intervals for each small answer, while a consumer reading a
        run in order in small fetches GETs each page once. Missing pages of the window are read in one GET."""
        bounds = (*index.positions, index.length_bytes)
        first = bisect_right(bounds, window.floor) - 1
        last = bisect_left(bounds, window.end) - 1  # the page holding byte window.end - 1
        keys = [("page", run.object_key, run.position + bounds[p]) for p in range(first, last + 1)]
        pages = [self.run_bytes.get(key) for key in keys]
        missing = [i for i, page in enumerate(pages) if page is None]
        if missing:
            low, high = bounds[first + missing[0]], bounds[first + missing[-1] + 1]
            data = await self._get(run.object_key, run.position + low, run.position + high, run.topic)
            if data is None:
                return Unreadable(f"block object {run.object_key} is missing")
            if len(data) != high - low:
                return self._failed(run.topic, run.partition, seq, run.object_key,
                                    EOFError(f"ends before position {run.position + high}"), "block")
            for i in range(missing[0], missing[-1] + 1):
                page = data[bounds[first + i] - low : bounds[first + i + 1] - low]
                pages[i] = pages[i] or page
                self.run_bytes.put(keys[i], page)
        else:
            self.metrics.inc(m.REMOTE_RUN_CACHE_HITS)
        trimmed = trim_chunk(b"".join(pages), window.floor_seq, seq, fetch_size)
        return RemoteChunk(*trimmed) if trimmed is not None else None

    async def _whole_run(self, run: RunLocation, seq: int, fetch_size: int) -> RemoteChunk | Unreadable | None:
        """A run of a block without bundle indexes (version 1 or 2): GET whole once, cached, trimmed per fetch."""
        key = (run.object_key, run.position)
        data = self.run_bytes.get(key)
        if data is None:
            data = await self._get(run.object_key, run.position, run.position + run.length_bytes, run.topic)
            if data is None:
                return Unreadable(f"block object {run.object_key} is missing")
            self.run_bytes.put(key, data)
        else:
            self.metrics.inc(m.REMOTE_RUN_CACHE_HITS)
        trimmed = trim_chunk(data, run.first_seq, seq, fetch_size)
        return RemoteChunk(*trimmed) if trimmed is not None else None
