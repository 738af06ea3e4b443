"""Serving seqs the local disk no longer holds, from the bucket (docs/architecture.md, data path step 6).

A remote segment is tried first: its catalog row (cached per partition) and its index object (fetched once and
cached) give the window to GET (`segment_window`): from the index entry at or before the seq to the last index entry
within `fetch_size`, so a GET reads little more than it answers. The GET streams (tiered.tiering.reads.range_reads): once
the whole bundle holding the seq is in, the chunk's extent is known from the index (`indexed_end`), the answer's head
can leave, and the rest of the chunk follows as it arrives. Each chunk ends at an index entry, so the next seq a
consumer asks for starts at one: once a consumer reads in order (it asks for the seq after an earlier answer), the
GETs of the AHEAD_DEPTH windows after each answer start as soon as the answer is known (read-ahead), while the
answer is sent and the consumer decodes it: a window ending at an index entry tells the seq the consumer asks for
next, so the window after it can be read ahead too, and the consumer has several GETs in flight. Read-aheads are
kept a few per partition for AHEAD_TTL_S, and only within the read budget.

Which location answers for a seq comes from the reader's caches, else from one catalog transaction
(tiered.catalog.locate: the remote segment, the block run, or nowhere), so that a swap committed between two lookups
cannot hide a seq; a cached location that fails to answer is dropped and the catalog asked again, and only a seq
that transaction places between the partition's first available seq and its committed seq is reported as a hole
(`tiered catalog check` would agree). Seqs in a block run are read by tiered.tiering.reads.run_reads (whose `RunReads`
this reader inherits: a run of a block of version 3 is range-read by its bundle
index, a run of an older block is GET whole and cached). A location answers for [from_seq, last_seq]: a seq in a jump
before its first record reads from that record, as in TANK, but a seq that no location answers for is reported
(Unreadable), never served from a later location. The chunk handed to the consumer (tiered.tiering.reads.remote_chunks)
starts at the whole bundle holding the seq and stops at a bundle boundary within `fetch_size` (or after that first
bundle when it alone is larger), as a local read does. GETs run under their own concurrency limit, apart from the
produce path and local reads, and give way to blocks in flight (tiered.tiering.blocks.hot_path), so that a replaying
consumer cannot stall producers or tail consumers.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

from tiered import metrics as m
from tiered.cancellation import cancel_requested
from tiered.catalog.locate import InRun, InSegment, Nowhere, locate
from tiered.catalog.segments import SegmentRow
from tiered.clock import Clock
from tiered.metrics import Metrics
from tiered.protocol.errors import ProtocolError
from tiered.storage.index import SparseIndex
from tiered.tier_interface import Expired, RemoteChunk, Unreadable
from tiered.tiering.reads.caches import RangeCache, SizedLru
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.reads.range_reads import Pace, RangeRead, ReadBudget
from tiered.tiering.reads.remote_chunks import FirstBundle, RangeChunk, find_first_bundle, walked_end
from tiered.tiering.reads.run_reads import RunReads
from tiered.tiering.objects.store import ObjectNotFound, ObjectStore, StoreError
from tiered.tiering.objects.meter import Attribution
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.tiering")

DEFAULT_READ_BUDGET_BYTES = 256 << 20
AHEAD_DEPTH = 2  # windows read ahead of a consumer reading in order: that many GETs in flight while it decodes
AHEAD_PER_PARTITION = 8  # read-aheads kept per partition (AHEAD_DEPTH per consumer reading it in order)
AHEAD_TTL_S = 30.0  # a read-ahead nobody took by then is dropped
_EVERY_REL_SEQ = 0xFFFF_FFFF  # every record of a remote segment is visible


@dataclass(frozen=True, slots=True)
class Window:
    """The range GET for a seq in a remote segment: [floor, end), floor the index entry at or before the seq (its
    bundle starts at floor_seq), end far enough for any answer a local read of the segment would give."""

    floor_seq: int
    floor: int
    end: int


def segment_window(index: SparseIndex, base_seq: int, size: int, seq: int, fetch_size: int) -> Window:
    """The GET window of `seq` in a segment of `size` bytes whose first seq is `base_seq`.

    Otherwise the bundle holding the seq (the first whose last seq is >= seq) starts at or after the floor entry i and no later
    than entry i + 1 (that entry's bundle starts past the seq), so it ends by entry i + 2; the answer ends within
    `fetch_size` of its start, so by entry i + 1 plus `fetch_size`."""
    positions = index.positions
    i = bisect_right(index.rel_seqs, seq - base_seq) - 1 if seq >= base_seq else -1
    floor, floor_seq = (positions[i], base_seq + index.rel_seqs[i]) if i >= 0 else (0, base_seq)
    if i >= 0 and floor_seq == seq:
        # The floor bundle starts at the seq, so the answer starts there (a consumer reading on asks for such seqs):
        # the window is the answer itself, unless the records up to fetch_size must be walked.
        if size - floor <= fetch_size:
            return Window(floor_seq, floor, size)
        last_entry = positions[bisect_right(positions, floor + fetch_size) - 1]
        if last_entry > floor:
            return Window(floor_seq, floor, last_entry)
        next_entry = positions[i + 1] if i + 1 < len(positions) else size
        return Window(floor_seq, floor, min(size, max(floor + fetch_size, next_entry)))
    latest_start = positions[i + 1] if i + 1 < len(positions) else size
    hold_end = positions[i + 2] if i + 2 < len(positions) else size
    return Window(floor_seq, floor, min(size, max(latest_start + fetch_size, hold_end)))


def indexed_end(index: SparseIndex, size: int, start: int, first_end: int, fetch_size: int) -> int | None:
    """Where the answer starting at `start` (its first bundle ending at `first_end`) ends, by the rule of local reads
    (tiered.storage.reads.range_end, every record of a remote segment being visible): the segment's end when it is
    within `fetch_size`, else the last index entry within it; None when no entry past the first bundle is, and the
    records up to `start + fetch_size` must be walked (`walked_end`)."""
    if size - start <= fetch_size:
        return size
    end = index.ceiling_position(start, min(size, start + fetch_size), _EVERY_REL_SEQ)
    return end if end is not None and end >= first_end else None


class _Ahead:
    """A read-ahead: the task that locates the next window and starts its GET, for the consumer asking `seq`; once
    located, `follow` is the seq the consumer asks for after this window (None: not known from the index), and
    `chain` how many windows after it to read ahead as well."""

    def __init__(self, seq: int, chain: int):
        self.seq = seq
        self.chain = chain
        self.follow: int | None = None
        self.task: asyncio.Task | None = None
        self.expiry: asyncio.Task | None = None  # drops it once AHEAD_TTL_S passed on the reader's clock

    def drop(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
        if not self.task.done():
            self.task.cancel()
        elif not self.task.cancelled() and self.task.exception() is None and self.task.result() is not None:
            self.task.result().close()


class RemoteReader(RunReads):
    """Remote segments first (cached segment rows and index objects, a streamed range GET of whole bundles, the
    next window read ahead), then block runs (one catalog query, one range GET). A seq that neither answers for is
    Unreadable, never skipped."""

    def __init__(self, store: ObjectStore, catalog: AsyncCatalog, metrics: Metrics, *, max_concurrency: int = 8,
                 budget: ReadBudget | None = None, read_ahead: bool = True, ahead_depth: int = AHEAD_DEPTH,
                 pace: Pace | None = None, clock: Clock):
        self.store = store
        self.clock = clock  # the location caches' ages and the read-aheads' time to live
        self.catalog = catalog
        self.metrics = metrics
        self.budget = budget if budget is not None else ReadBudget(DEFAULT_READ_BUDGET_BYTES)
        self.read_ahead = read_ahead
        self.ahead_depth = ahead_depth  # windows read ahead of a consumer reading in order
        self.pace = pace  # GETs of segment windows take in their bytes when it lets them (hot_path.HotPathGate)
        self.segments: RangeCache[SegmentRow] = RangeCache(clock.monotonic)
        self.indexes: SizedLru[str, SparseIndex] = SizedLru(self.budget.cache_bytes // 2,
                                                            lambda index: index.size_bytes)
        super().__init__(self.budget.cache_bytes, clock)  # the block-run caches: runs, footers, run_bytes
        self._slots = asyncio.Semaphore(max_concurrency)  # GETs in flight, read-aheads included
        self._ahead: dict[TopicPartition, list[_Ahead]] = {}
        # The seqs that would continue recent answers, per partition: a fetch asking one of them reads in order,
        # and only such fetches are read ahead (a random read would waste the GET).
        self._expected: dict[TopicPartition, deque[int]] = {}
        # The catalog lookup in flight per partition: a lookup that may be answered from the caches waits for it and
        # looks there first (a consumer and the read-ahead ahead of it ask for seqs of the same segment at once).
        self._locating: dict[TopicPartition, asyncio.Future[None]] = {}

    @property
    def buffered_bytes(self) -> int:
        """Bytes held by GET buffers and the caches, all within the read budget."""
        return self.budget.used + self.indexes.size_bytes + self.footers.size_bytes + self.run_bytes.size_bytes

    async def fetch(self, tp: TopicPartition, seq: int, fetch_size: int) -> RemoteChunk | Unreadable | Expired:
        got = await self._answer(tp, seq, fetch_size)
        if isinstance(got, Unreadable):
            # Remote retention may have taken the seq while it was read (the first available seq moves before the
            # objects go, in the catalog first): the catalog, asked again, tells it from a missing object.
            again = await self._query(locate, tp.topic, tp.partition, seq)
            if isinstance(again, Nowhere) and again.seq < again.first_available_seq:
                self.forget_locations(tp)
                return Expired(again.first_available_seq)
            return got
        if isinstance(got, Nowhere):
            if got.seq < got.first_available_seq:  # retention moved the start past it since the bounds were read
                return Expired(got.first_available_seq)
            if got.is_hole:  # the one transaction saw no location below the committed seq: the check agrees
                self.metrics.inc(m.UNLOCATED_READS)
                log.error("%s: no remote segment or block run answers for seq %d, below the high-water mark %d: "
                          "the catalog has a hole (run `tiered catalog check`)", tp, got.seq,
                          got.committed_seq)
            return Unreadable(f"no location holds seq {got.seq} (history is {got.first_available_seq}.."
                              f"{got.committed_seq})")
        if isinstance(got, RemoteChunk):
            self.metrics.inc(m.REMOTE_BYTES, len(got.data) if isinstance(got.data, bytes) else got.data.size)
        return got

    async def _answer(self, tp: TopicPartition, seq: int,
                      fetch_size: int) -> RemoteChunk | Unreadable | Nowhere:
        """The chunk for `seq` from the location answering for it: the cached one, else the one the catalog names
        (tiered.catalog.locate, one transaction). A cached location that fails to answer (its object gone, or
        holding nothing from the seq on) is not trusted: the catalog is asked again before anything is reported."""
        asked = False  # whether `location` comes from the catalog just now
        stale = False  # a location failed to answer: the catalog itself is asked, not a lookup already in flight
        while True:
            location = None if asked else self._cached(tp, seq)
            if location is None:
                location = await self._locate(tp, seq, fresh=stale)
                asked = True
                if isinstance(location, Nowhere):
                    return location
            if isinstance(location, InSegment):
                got = await self._from_segment(tp, location.row, seq, fetch_size)
                if isinstance(got, int):  # compaction removed the segment's messages from seq on: the next answers
                    seq, asked = got, False
                    continue
            else:
                got = await self._from_run(tp, location.run, seq, fetch_size)
            if isinstance(got, RemoteChunk):
                return got
            if not asked:
                self.forget_locations(tp)  # stale: the catalog names the locations now
                asked = stale = True
                continue
            if got is None:
                name = location.row.object_key if isinstance(location, InSegment) else location.run.object_key
                log.error("%s: %s, named for seq %d, holds no record at or after it", tp, name, seq)
                return Unreadable(f"{name} holds no record at or after seq {seq}")
            return got

    def _cached(self, tp: TopicPartition, seq: int) -> InSegment | InRun | None:
        row = self.segments.get(tp, seq)
        if row is not None:
            self.metrics.inc(m.REMOTE_CACHE_HITS)
            return InSegment(row)
        run = self.runs.get(tp, seq)
        if run is not None:
            return InRun(run)
        self.metrics.inc(m.REMOTE_CACHE_MISSES)
        return None

    def _remember(self, location: InSegment | InRun) -> None:
        if isinstance(location, InSegment):
            self.segments.put(location.row)
        else:
            self.runs.put(location.run)

    def forget_locations(self, tp: TopicPartition) -> None:
        """The partition's locations were replaced (a remote compaction swapped them): its cached locations and
        read-aheads go, so that the next fetch looks the new ones up. The old objects stay a grace period, so a read
        already under way still succeeds."""
        self.segments.forget(tp)
        self.runs.forget(tp)
        for entry in self._ahead.pop(tp, []):
            entry.drop()

    def close(self) -> None:
        """Drops every read-ahead (the broker stops)."""
        for entries in self._ahead.values():
            for entry in entries:
                entry.drop()
        self._ahead.clear()

    async def _query(self, fn, *args):
        self.metrics.inc(m.REMOTE_CATALOG_QUERIES)
        return await self.catalog.read(fn, *args)

    async def _locate(self, tp: TopicPartition, seq: int, *, fresh: bool = False) -> InSegment | InRun | Nowhere:
        """Where `seq` is, from the caches when a lookup of the partition that was in flight put it there, else
        from the catalog (one lookup per partition at a time; what it finds is remembered). `fresh`: from the
        catalog, never from a lookup that started before the caller found a location stale."""
        while not fresh and (pending := self._locating.get(tp)) is not None:
            await asyncio.shield(pending)
            row = self.segments.get(tp, seq)
            if row is not None:
                return InSegment(row)
            run = self.runs.get(tp, seq)
            if run is not None:
                return InRun(run)
        if fresh:
            return await self._ask_catalog(tp, seq)
        done = asyncio.get_running_loop().create_future()
        self._locating[tp] = done
        try:
            return await self._ask_catalog(tp, seq)
        finally:
            del self._locating[tp]
            done.set_result(None)

    async def _ask_catalog(self, tp: TopicPartition, seq: int) -> InSegment | InRun | Nowhere:
        found = await self._query(locate, tp.topic, tp.partition, seq)
        if not isinstance(found, Nowhere):
            self._remember(found)
        return found

    async def _get(self, object_key: str, start: int, end: int, topic: str) -> bytes | None:
        self.metrics.inc(m.REMOTE_GETS)
        try:
            async with self._slots:
                return await self.store.get_range(object_key, start, end, attribution=Attribution.topic(topic))
        except ObjectNotFound:
            self._missing(object_key)
            return None

    def _missing(self, object_key: str) -> None:
        log.error("object %s named by the catalog is missing from the bucket", object_key)
        self.metrics.inc(m.REMOTE_MISSING_OBJECTS)

    # -- remote segments --------------------------------------------------------------------------------------------

    async def _index_for(self, row: SegmentRow) -> SparseIndex | Unreadable:
        """The index of a remote segment (cached)."""
        index = self.indexes.get(row.index_object_key)
        if index is None:
            data = await self._get(row.index_object_key, 0, max(row.index_size_bytes, 1), row.topic)
            if data is None:
                return Unreadable(f"index object {row.index_object_key} is missing")
            index, _ = SparseIndex.from_bytes(data)
            self.indexes.put(row.index_object_key, index)
        return index

    async def _from_segment(self, tp: TopicPartition, row: SegmentRow, seq: int,
                            fetch_size: int) -> RemoteChunk | Unreadable | int | None:
        """The chunk from `row`, the segment answering for `seq`; the seq after the segment when it holds no message
        at or after `seq` (compaction removed them); None when its window holds none either."""
        ahead = await self._ahead_for(tp, seq)
        try:
            index = await self._index_for(row)
        except BaseException:
            if ahead is not None:
                ahead.close()
            raise
        if isinstance(index, Unreadable):
            if ahead is not None:
                ahead.close()
            return index
        window = segment_window(index, row.base_seq, row.size_bytes, seq, fetch_size)
        read = ahead
        if read is not None and (read.object_key != row.object_key or read.start != window.floor
                                 or read.end < window.end):
            read.close()  # made for another window: the consumer moved, or asks for more
            read = None
        if read is None:
            self.metrics.inc(m.REMOTE_GETS)
            read = await RangeRead.open(self.store, row.object_key, window.floor, window.end, self.budget,
                                        self._slots, Attribution.topic(row.topic), self.pace)
        else:
            self.metrics.inc(m.REMOTE_READ_AHEAD_HITS)
            read.adopt()
        try:
            first = await find_first_bundle(read, window.floor, window.floor_seq, seq)
        except BaseException as exc:
            read.close()
            if not isinstance(exc, Exception):
                raise
            return self._failed(tp, seq, row.object_key, exc)
        if first is None:
            read.close()
            # No bundle of the window reaches the seq: the window runs to the segment's end (an index entry past the
            # floor would have started such a bundle), so compaction removed every message from the seq on.
            return row.last_seq + 1 if window.end >= row.size_bytes else None
        end = indexed_end(index, row.size_bytes, first.start, first.end, fetch_size)
        if end is None:
            try:
                end, last = await walked_end(read, first, first.start + fetch_size)
            except BaseException as exc:
                read.close()
                if not isinstance(exc, Exception):
                    raise
                return self._failed(tp, seq, row.object_key, exc)
            next_seq = last + 1
        else:
            next_seq = self._next_seq(index, row, first, end)
        self._continue(tp, seq, next_seq, fetch_size, sequential=ahead is not None)
        return RemoteChunk(RangeChunk(read, first.start, end, self.pace), first.first_seq, first.sparse)

    @staticmethod
    def _next_seq(index: SparseIndex, row: SegmentRow, first: FirstBundle, end: int) -> int:
        """The seq a consumer asks for after a chunk ending at `end` (a bundle boundary)."""
        if end == first.end:
            return first.last_seq + 1
        if end >= row.size_bytes:
            return row.last_seq + 1
        i = bisect_right(index.positions, end) - 1
        return row.base_seq + index.rel_seqs[i]  # chunks end at index entries: the next bundle's first seq

    def _failed(self, tp: TopicPartition, seq: int, object_key: str, exc: Exception,
                what: str = "segment") -> Unreadable:
        if isinstance(exc, ObjectNotFound):
            self._missing(object_key)
            return Unreadable(f"{what} object {object_key} is missing")
        if not isinstance(exc, (StoreError, EOFError, ProtocolError)):
            raise exc
        log.error("%s: reading seq %d from %s failed: %s", tp, seq, object_key, exc)
        return Unreadable(f"{what} object {object_key}: {exc}")

    # -- read-ahead -------------------------------------------------------------------------------------------------

    async def _ahead_for(self, tp: TopicPartition, seq: int) -> RangeRead | None:
        """The read-ahead made for a consumer asking `seq` now (it is taken), or None."""
        entries = self._ahead.get(tp)
        if not entries:
            return None
        for i, entry in enumerate(entries):
            if entry.seq == seq:
                del entries[i]
                if entry.expiry is not None:
                    entry.expiry.cancel()
                try:
                    return await asyncio.shield(entry.task)
                except asyncio.CancelledError:
                    # The read-ahead ended cancelled: the fetch reads for itself, unless it was cancelled too.
                    if entry.task.cancelled() and not cancel_requested():
                        return None
                    entry.drop()  # this fetch is cancelled: nobody takes the read-ahead
                    raise
                except Exception:  # the read-ahead failed: the fetch reads for itself
                    return None
        return None

    def _continue(self, tp: TopicPartition, seq: int, next_seq: int, fetch_size: int,
                  sequential: bool) -> None:
        """Reads the window after this answer ahead when this fetch continued an earlier answer; otherwise only
        remembers where this answer ends."""
        expected = self._expected.setdefault(tp, deque(maxlen=AHEAD_PER_PARTITION))
        if seq in expected:
            expected.remove(seq)
            sequential = True
        if sequential and self.read_ahead:
            self._extend_ahead(tp, next_seq, fetch_size)
        else:
            expected.append(next_seq)

    def _extend_ahead(self, tp: TopicPartition, seq: int, fetch_size: int) -> None:
        """Makes sure the `ahead_depth` windows from `seq` on are read ahead: follows the read-aheads already made
        from window to window and starts the first one missing (which starts the rest once it is located)."""
        entries = self._ahead.setdefault(tp, [])
        for depth in range(self.ahead_depth):
            entry = next((e for e in entries if e.seq == seq), None)
            if entry is None:
                self._start_ahead(tp, seq, fetch_size, self.ahead_depth - 1 - depth)
                return
            if entry.follow is None:  # not located yet (it starts its chain then), or the end is not known
                entry.chain = max(entry.chain, self.ahead_depth - 1 - depth)
                return
            seq = entry.follow

    def _start_ahead(self, tp: TopicPartition, seq: int, fetch_size: int, chain: int) -> None:
        if self.runs.get(tp, seq) is not None:
            return  # in a block run, not a remote segment
        entries = self._ahead.setdefault(tp, [])
        if any(entry.seq == seq for entry in entries):
            return
        entry = _Ahead(seq, chain)
        entry.task = asyncio.get_running_loop().create_task(self._read_ahead(tp, entry, fetch_size))
        entry.expiry = asyncio.get_running_loop().create_task(self._expire_later(tp, entry))
        entries.append(entry)
        while len(entries) > AHEAD_PER_PARTITION:
            entries.pop(0).drop()

    async def _expire_later(self, tp: TopicPartition, entry: _Ahead) -> None:
        await self.clock.sleep(AHEAD_TTL_S)
        self._expire(tp, entry)

    def _expire(self, tp: TopicPartition, entry: _Ahead) -> None:
        entries = self._ahead.get(tp, [])
        if entry in entries:
            entries.remove(entry)
            entry.expiry = None
            entry.drop()
            self.metrics.inc(m.REMOTE_READ_AHEAD_DROPPED)

    async def _read_ahead(self, tp: TopicPartition, entry: _Ahead, fetch_size: int) -> RangeRead | None:
        seq = entry.seq
        location = self.segments.get(tp, seq)
        if location is None:
            found = await self._locate(tp, seq)
            if isinstance(found, Nowhere):
                return None
            if not isinstance(found, InSegment):
                return None  # in a block run: its reads are not read ahead
            location = found.row
        row = location
        index = await self._index_for(row)
        if isinstance(index, Unreadable):
            return None
        window = segment_window(index, row.base_seq, row.size_bytes, seq, fetch_size)
        read = RangeRead.ahead(self.store, row.object_key, window.floor, window.end, self.budget, self._slots,
                               Attribution.topic(row.topic), self.pace)
        if read is None:
            return None
        self.metrics.inc(m.REMOTE_GETS)
        entry.follow = self._follow(index, row, window, seq, fetch_size)
        if entry.chain > 0 and entry.follow is not None:
            self._start_ahead(tp, entry.follow, fetch_size, entry.chain - 1)
        return read

    @staticmethod
    def _follow(index: SparseIndex, row: SegmentRow, window: Window, seq: int, fetch_size: int) -> int | None:
        """The seq a consumer asks for after the answer to `seq` from `window`, when the index alone tells it: the
        answer starts at the window's floor (the seq starts an index entry) and ends where the window does, at an
        index entry or the segment's end."""
        if window.floor_seq != seq:
            return None
        if window.end >= row.size_bytes:
            return row.last_seq + 1
        end = indexed_end(index, row.size_bytes, window.floor, window.floor + 1, fetch_size)
        if end != window.end:
            return None
        i = bisect_right(index.positions, end) - 1
        return row.base_seq + index.rel_seqs[i] if index.positions[i] == end else None
