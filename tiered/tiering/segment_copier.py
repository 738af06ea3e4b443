"""The segment copier: each sealed segment goes to the bucket unchanged, its `.ilog` and its `.index`
(DESIGN.md, data path step 5; Kafka's KIP-405 RemoteLogSegmentState).

For one segment: COPY_STARTED in the catalog, then both uploads (multipart above a threshold), then COPY_FINISHED,
then the block runs the segment covers are pruned (blocks left without runs are marked for deletion). A segment
is copied only once every record in it is committed, so the bucket never holds a seq the catalog did not accept.
Failures are retried with backoff; a copy interrupted by a crash is redone from COPY_STARTED at the next start
(re-uploading the same keys is harmless). A refused epoch fences the partition, as for blocks.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import segments as catalog_segments
from tiered.catalog.errors import StaleEpoch
from tiered.catalog.states import SegmentState
from tiered.protocol.bundle import maybe_record, timestamp_bounds
from tiered.storage.records import iter_records, pread_exact
from tiered.tiering import keys
from tiered.tiering.block_builder import recorded_ts_bounds
from tiered.tiering.block_pipeline import Retrying
from tiered.tiering.catalog_thread import CatalogThread
from tiered.tiering.store import ObjectStore

log = logging.getLogger("tiered.tiering")

MULTIPART_THRESHOLD_BYTES = 64 << 20
PRUNE_BATCH = 1000  # prune_runs_covered's default limit


@dataclass(frozen=True)
class CopyJob:
    topic: str
    partition: int
    segment: object  # tiered.storage.segment.SealedSegment


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
    def __init__(self, store: ObjectStore, catalog: CatalogThread, *, metrics,
                 epoch_of: Callable[[str, int], int], committed_up_to: Callable[[str, int], int],
                 on_copied: Callable[[CopyJob], None], on_fenced: Callable[[tuple[str, int], StaleEpoch], None],
                 multipart_threshold_bytes: int = MULTIPART_THRESHOLD_BYTES):
        self.store = store
        self.catalog = catalog
        self.metrics = metrics
        self.epoch_of = epoch_of
        self.committed_up_to = committed_up_to
        self.on_copied = on_copied
        self.on_fenced = on_fenced
        self.multipart_threshold_bytes = multipart_threshold_bytes
        self.retry = Retrying(metrics)
        self.copied: set[tuple[str, int, int]] = set()  # (topic, partition, base) known COPY_FINISHED
        self.copied_last: dict[tuple[str, int], int] = {}  # the highest seq in the bucket's segments, per partition
        self._queue: deque[CopyJob] = deque()
        self._queued: set[tuple[str, int, int]] = set()
        self._wake = asyncio.Event()
        self.pending_bytes = 0

    def is_copied(self, topic: str, partition: int, base: int) -> bool:
        return (topic, partition, base) in self.copied

    def enqueue(self, topic: str, partition: int, segment) -> None:
        key = (topic, partition, segment.base)
        if key in self.copied or key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(CopyJob(topic, partition, segment))
        self.pending_bytes += segment.size
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def pending_for(self, topic: str, partition: int) -> tuple[int, int]:
        """(segments, bytes) waiting to be copied for one partition."""
        jobs = [j for j in self._queue if (j.topic, j.partition) == (topic, partition)]
        return len(jobs), sum(j.segment.size for j in jobs)

    async def load_copied(self, topic: str, partition: int) -> None:
        """Learns which segments of a partition are already in the bucket (at start-up)."""
        after = 0
        while True:
            rows = await self.catalog.call(catalog_segments.list_segments, topic, partition,
                                           states=(SegmentState.COPY_FINISHED,), after_base_seq=after, limit=1000)
            for row in rows:
                self._mark_copied(topic, partition, row.base_seq, row.last_seq)
            if len(rows) < 1000:
                return
            after = rows[-1].base_seq

    async def run(self) -> None:
        """The copy loop: one segment at a time, oldest first; waits while a segment's records are uncommitted."""
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            job = self._queue[0]
            if job.segment.deleted:
                self._finish(job)
                continue
            if job.segment.last > self.committed_up_to(job.topic, job.partition):
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), 0.5)  # woken by commits, or re-checked
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                await self.copy(job)
            except StaleEpoch as exc:
                self.on_fenced((job.topic, job.partition), exc)
                self._drop_partition(job.topic, job.partition)
                continue
            self._finish(job)

    def _mark_copied(self, topic: str, partition: int, base: int, last: int) -> None:
        self.copied.add((topic, partition, base))
        self.copied_last[(topic, partition)] = max(self.copied_last.get((topic, partition), 0), last)

    def commits_advanced(self) -> None:
        self._wake.set()

    def _finish(self, job: CopyJob) -> None:
        self._queue.popleft()
        self._queued.discard((job.topic, job.partition, job.segment.base))
        self.pending_bytes -= job.segment.size

    def _drop_partition(self, topic: str, partition: int) -> None:
        for job in [j for j in self._queue if (j.topic, j.partition) == (topic, partition)]:
            self._queue.remove(job)
            self._queued.discard((topic, partition, job.segment.base))
            self.pending_bytes -= job.segment.size

    async def copy(self, job: CopyJob) -> None:
        seg = job.segment
        freeze_ts = seg.freeze_ts
        object_key = keys.segment_key(job.topic, job.partition, seg.base, seg.last, freeze_ts)
        index_key = keys.segment_index_key(job.topic, job.partition, seg.base, seg.last, freeze_ts)
        low, high = await asyncio.to_thread(segment_timestamp_bounds, seg.path, seg.base, seg.size)
        meta = catalog_segments.SegmentMeta(
            job.topic, job.partition, seg.base, seg.last, object_key, index_key, seg.size,
            os.path.getsize(seg.index_path), low, high, datetime.fromtimestamp(freeze_ts, timezone.utc),
            self.epoch_of(job.topic, job.partition),
        )  # fmt: skip
        what = f"copy of {job.topic}/{job.partition} segment {seg.base}-{seg.last}"
        await self.retry(what, lambda: self.catalog.commit(catalog_segments.segment_copy_started, meta),
                         "tiered_catalog_errors_total")
        await self.retry(what, lambda: self.store.put_file(
            object_key, seg.path, multipart_threshold_bytes=self.multipart_threshold_bytes),
            "tiered_segment_upload_errors_total")
        await self.retry(what, lambda: self.store.put_file(index_key, seg.index_path),
                         "tiered_segment_upload_errors_total")
        await self.retry(what, lambda: self.catalog.commit(
            catalog_segments.segment_copy_finished, job.topic, job.partition, seg.base, meta.leader_epoch),
            "tiered_catalog_errors_total")
        self._mark_copied(job.topic, job.partition, seg.base, seg.last)
        runs_deleted = blocks_marked = 0
        while True:  # bounded batches, until no covered run is left
            pruned = await self.retry(what, lambda: self.catalog.commit(
                catalog_blocks.prune_runs_covered, job.topic, job.partition, seg.last), "tiered_catalog_errors_total")
            runs_deleted += pruned.runs_deleted
            blocks_marked += pruned.blocks_marked
            if pruned.runs_deleted < PRUNE_BATCH:
                break
        self.metrics.inc("tiered_segments_copied_total", help="sealed segments copied to the bucket")
        self.metrics.inc("tiered_segment_bytes_copied_total", seg.size + meta.index_size_bytes,
                         help="segment and index bytes copied")
        log.info("copied %s/%d segment %d-%d (%d bytes); pruned %d block runs, %d blocks now unreferenced",
                 job.topic, job.partition, seg.base, seg.last, seg.size, runs_deleted, blocks_marked)
        self.on_copied(job)
