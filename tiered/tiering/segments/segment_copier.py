"""The segment copier: each sealed segment goes to the bucket unchanged, its `.ilog` and its `.index`
(docs/architecture.md, data path step 5; Kafka's KIP-405 RemoteLogSegmentState).

For one segment: COPY_STARTED in the catalog, then both uploads (multipart above a threshold), then COPY_FINISHED,
which in the same transaction prunes the block runs the segment now answers for (blocks left without runs are
marked for deletion). A segment is copied only once every record in it is committed, so the bucket never holds a
seq the catalog did not accept. Store and catalog failures are retried with backoff; a copy interrupted by a crash
is redone from COPY_STARTED at the next start (re-uploading the same keys is harmless). The row's min and max message
timestamp come from the segment's appends when it saw them all (SealedSegment.ts_bounds), else from one native pass
over its bundles (a recovered or compacted segment). A refused epoch fences the
partition, as for blocks. A segment that cannot be read (a damaged file), or whose copy the row of its base refuses
(an abandoned copy of that base mid-deletion, tiered.tiering.segments.abandoned_copies), is reported, counted and tried again
later, and never holds up the other partitions' copies.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable

from tiered import metrics as m
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog.errors import IllegalTransition, StaleEpoch
from tiered.catalog.states import SegmentState
from tiered.clock import Clock, utc_now, wait_for_event
from tiered.metrics import Metrics
from tiered.protocol.bundle import maybe_record, timestamp_bounds
from tiered.protocol.errors import ProtocolError
from tiered.storage.records import iter_records, pread_exact
from tiered.storage.segment import SealedSegment
from tiered.tiering.objects import keys
from tiered.tiering.blocks.block_builder import recorded_ts_bounds
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.partition_state import TierState
from tiered.tiering.objects.retrying import Retrying
from tiered.tiering.objects.store import ObjectStore
from tiered.tiering.objects.meter import Attribution
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.tiering")

MULTIPART_THRESHOLD_BYTES = 64 << 20


@dataclass(frozen=True)
class CopyJob:
    topic: str
    partition: int
    segment: SealedSegment
    tp: TopicPartition = field(init=False, repr=False, compare=False)  # (topic, partition) as one value

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp", TopicPartition(self.topic, self.partition))


def segment_timestamp_bounds(path: str, base: int, size: int) -> tuple[int, int]:
    """(min, max) message timestamp of a sealed segment file as recorded (recorded_ts_bounds), by one native pass
    over each of its bundles (runs in a worker thread)."""
    low, high = None, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for info in iter_records(fd, 0, size, base):
            record = pread_exact(fd, info.length, info.position)
            start, end = maybe_record(record)
            b_low, b_high = timestamp_bounds(memoryview(record)[start:end])
            low = b_low if low is None else min(low, b_low)
            high = max(high, b_high)
    finally:
        os.close(fd)
    return recorded_ts_bounds(low or 0, high)


class SegmentCopier:
    def __init__(self, store: ObjectStore, catalog: AsyncCatalog, *, metrics: Metrics, state: TierState,
                 on_copied: Callable[[CopyJob], None], fence: Callable[[TopicPartition, int | None, str], None],
                 grace: timedelta, clock: Clock, multipart_threshold_bytes: int = MULTIPART_THRESHOLD_BYTES):
        self.store = store
        self.catalog = catalog
        self.metrics = metrics
        self.state = state  # epochs, committed seqs; the highest copied seq is told to it
        self.on_copied = on_copied
        self.fence = fence
        self.grace = grace
        self.clock = clock
        self.multipart_threshold_bytes = multipart_threshold_bytes
        self.retry = Retrying(metrics, clock=clock)
        self.copied: set[tuple[str, int, int]] = set()  # (topic, partition, base) known COPY_FINISHED
        self._queue: deque[CopyJob] = deque()
        self._queued: set[tuple[str, int, int]] = set()
        self._wake = asyncio.Event()
        self.pending_bytes = 0

    def is_copied(self, tp: TopicPartition, base: int) -> bool:
        return (*tp, base) in self.copied

    def will_copy(self, tp: TopicPartition, base: int) -> bool:
        """Whether a segment of that base is queued here: its copy takes over any COPY_STARTED row of the base."""
        return (*tp, base) in self._queued

    def enqueue(self, tp: TopicPartition, segment: SealedSegment) -> None:
        key = (*tp, segment.base)
        if key in self.copied or key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(CopyJob(tp.topic, tp.partition, segment))
        self.pending_bytes += segment.size
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def pending_for(self, tp: TopicPartition) -> tuple[int, int]:
        """(segments, bytes) waiting to be copied for one partition."""
        jobs = [j for j in self._queue if j.tp == tp]
        return len(jobs), sum(j.segment.size for j in jobs)

    async def load_copied(self, tp: TopicPartition) -> None:
        """Learns which segments of a partition are already in the bucket (at start-up)."""
        after = 0
        while True:
            rows = await self.catalog.read(catalog_segments.list_segments, tp.topic, tp.partition,
                                           states=(SegmentState.COPY_FINISHED,), after_base_seq=after, limit=1000)
            for row in rows:
                self._mark_copied(tp, row.base_seq, row.last_seq)
            if len(rows) < 1000:
                return
            after = rows[-1].base_seq

    async def run(self) -> None:
        """The copy loop: one segment at a time, oldest first; a segment whose records are not all committed yet
        waits (behind it, others go ahead); a segment that cannot be read goes to the back and is tried again."""
        while True:
            job = self._next_ready()
            if job is None:
                self._wake.clear()
                if self._queue:  # woken by commits and new segments, and every 0.5 s (a queued segment deleted)
                    await wait_for_event(self.clock, self._wake, 0.5)
                else:  # nothing queued: only a new segment (enqueue) gives it work; an idle broker never wakes it
                    await self._wake.wait()
                continue
            if job.segment.deleted:
                self._finish(job)
                continue
            try:
                await self.copy(job)
            except StaleEpoch as exc:
                self.fence(job.tp, None, str(exc))
                self._drop_partition(job.tp)
                continue
            except NotLeader:
                self._drop_partition(job.tp)
                continue
            except (OSError, ProtocolError, IllegalTransition) as exc:
                # This segment, not the copier: say so, keep it for later, and copy the others meanwhile. A refused
                # transition is a row of the same base mid-deletion (an abandoned copy being cleaned up: once
                # DELETE_FINISHED the copy may take it over); one remote retention deleted is dropped in copy().
                self.metrics.inc(m.SEGMENT_COPY_FAILURES)
                log.error("copy of %s segment %s failed: %s; it is tried again later", job.tp, job.segment.filename,
                          exc)
                self._queue.remove(job)
                self._queue.append(job)
                await self.clock.sleep(1.0)
                continue
            self._finish(job)

    def _next_ready(self) -> CopyJob | None:
        """The oldest job whose records are all committed (a partition's segments in order)."""
        blocked: set[TopicPartition] = set()
        for job in self._queue:
            if job.tp in blocked:
                continue
            if job.segment.deleted or job.segment.last <= self.state.committed_seq(job.tp):
                return job
            blocked.add(job.tp)
        return None

    def _mark_copied(self, tp: TopicPartition, base: int, last: int) -> None:
        self.copied.add((*tp, base))
        self.state.copied(tp, last)

    def commits_advanced(self) -> None:
        self._wake.set()

    def _finish(self, job: CopyJob) -> None:
        self._queue.remove(job)
        self._queued.discard((job.topic, job.partition, job.segment.base))
        self.pending_bytes -= job.segment.size

    def _drop_partition(self, tp: TopicPartition) -> None:
        for job in [j for j in self._queue if j.tp == tp]:
            self._finish(job)

    async def copy(self, job: CopyJob) -> None:
        seg = job.segment
        epoch = self.state.epoch_of(job.tp)
        if epoch is None:
            raise NotLeader(job.topic, job.partition)
        held = await self.catalog.read(catalog_segments.find_remote_segment, job.topic, job.partition, seg.base)
        if held is not None and held.holds(seg.base):
            # Its seqs are in the bucket already: a segment that compaction wrote from copied ones (the remote
            # pass replaces those), never a newly rolled one. Copying it would give its seqs two locations.
            self.copied.add((job.topic, job.partition, seg.base))
            log.info("%s segment %s is not copied: remote segment %d-%d holds its seqs", job.tp, seg.filename,
                     held.base_seq, held.last_seq)
            return
        freeze_ts = seg.freeze_ts
        object_key = keys.segment_key(job.topic, job.partition, seg.base, seg.last, freeze_ts)
        index_key = keys.segment_index_key(job.topic, job.partition, seg.base, seg.last, freeze_ts)
        if seg.ts_bounds is not None:  # told by its appends: no second read of the file
            low, high = recorded_ts_bounds(*seg.ts_bounds)
        else:
            low, high = await asyncio.to_thread(segment_timestamp_bounds, seg.path, seg.base, seg.size)
        meta = catalog_segments.SegmentMeta(
            job.topic, job.partition, seg.base, seg.last, object_key, index_key, seg.size,
            os.path.getsize(seg.index_path), low, high, datetime.fromtimestamp(freeze_ts, timezone.utc), epoch,
        )  # fmt: skip
        what = f"copy of {job.tp} segment {seg.base}-{seg.last}"
        try:
            await self.retry(what, lambda: self.catalog.write(catalog_segments.segment_copy_started, meta,
                                                                       now=utc_now(self.clock)),
                             m.CATALOG_ERRORS)
        except IllegalTransition:
            if not await self._expired(job.tp, seg.last):
                raise
            # Remote retention deleted this base's copy and moved the history's start past it (remote retention
            # shorter than local): its seqs are no longer history, so there is nothing to copy, now or later.
            self.copied.add((job.topic, job.partition, seg.base))
            log.info("%s segment %s is not copied: remote retention expired its seqs", job.tp, seg.filename)
            return
        # A sealed segment file is never written in place (a cut or an append first replaces it with a private copy,
        # storage/segment.make_private) and its COPY_STARTED row names the key: the local store may link it. Its
        # index is rewritten in place by recovery, so it is always copied.
        attribution = Attribution.topic(job.topic)
        await self.retry(what, lambda: self.store.put_file(
            object_key, seg.path, multipart_threshold_bytes=self.multipart_threshold_bytes, immutable_source=True,
            attribution=attribution), m.SEGMENT_UPLOAD_ERRORS)
        await self.retry(what, lambda: self.store.put_file(index_key, seg.index_path, attribution=attribution),
                         m.SEGMENT_UPLOAD_ERRORS)
        finished = await self.retry(what, lambda: self.catalog.write(
            catalog_segments.segment_copy_finished, job.topic, job.partition, seg.base, epoch, grace=self.grace,
            now=utc_now(self.clock)),
            m.CATALOG_ERRORS)
        self._mark_copied(job.tp, seg.base, seg.last)
        self.metrics.inc(m.SEGMENTS_COPIED)
        self.metrics.inc(m.SEGMENT_BYTES_COPIED, seg.size + meta.index_size_bytes)
        log.info("copied %s segment %d-%d (%d bytes); pruned %d block runs, %d blocks now unreferenced",
                 job.tp, seg.base, seg.last, seg.size, finished.pruned.runs_deleted,
                 finished.pruned.blocks_marked)
        self.on_copied(job)

    async def _expired(self, tp: TopicPartition, last_seq: int) -> bool:
        """Whether the partition's history now starts after `last_seq` (remote retention moved it there)."""
        state = await self.catalog.read(catalog_partitions.get_partition_state, tp.topic, tp.partition)
        return state is not None and last_seq < state.first_available_seq


class NotLeader(Exception):
    """The partition is no longer led here: its segments are not copied by this broker."""
