"""The remote tier: sealed segments copied to the bucket, reads below the local disk, remote retention, and the
two-phase deletion with its orphan reconciler (docs/architecture.md, data path steps 5 to 8).

Its loops run under the broker's supervisor: the copier continuously, retention and reconciliation as periodic
passes. Everything it learns that changes what a partition serves (a segment copied, the first available seq moved)
goes to the server's sink.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Callable

from tiered import metrics as m
from tiered.catalog import segments as catalog_segments
from tiered.catalog.errors import StaleEpoch
from tiered.clock import Clock, utc_now
from tiered.metrics import Metrics
from tiered.storage.segment import SealedSegment
from tiered.storage.topic_config import TopicConfig
from tiered.tier_interface import Expired, RemoteChunk, TierSink, Unreadable
from tiered.tiering.segments.abandoned_copies import clean_abandoned_copies
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.blocks.hot_path import HotPathGate
from tiered.tiering.partition_state import TierState
from tiered.tiering.recovery.reconciler import abandon_stale_pending, reconcile, sweep_deleted_blocks
from tiered.tiering.reads.range_reads import ReadBudget
from tiered.tiering.reads.remote_fetch import DEFAULT_READ_BUDGET_BYTES, RemoteReader
from tiered.tiering.segments.remote_retention import (
    enforce_remote_retention,
    finish_interrupted_deletions,
    partitions_due,
    retention_limits,
)
from tiered.tiering.segments.segment_copier import CopyJob, SegmentCopier
from tiered.tiering.objects.store import ObjectStore
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.tiering")

RECONCILE_INTERVAL_S = 120.0


class RemoteTier:
    def __init__(self, store: ObjectStore, catalog: AsyncCatalog, sink: TierSink, *, metrics: Metrics,
                 state: TierState, fence: Callable[[TopicPartition, int | None, str], None], grace: timedelta,
                 clock: Clock, read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES,
                 hot_path: HotPathGate | None = None):
        self.store = store
        self.catalog = catalog
        self.sink = sink
        self.metrics = metrics
        self.clock = clock
        self.grace = grace
        self.state = state
        self.copier = SegmentCopier(store, catalog, metrics=metrics, state=state, on_copied=self._copied,
                                    fence=fence, grace=grace, clock=clock)
        # The reader asks the catalog where a seq is (tiered.catalog.locate), never what this broker believes was
        # copied: a remote compaction or another broker's copy changes the locations without telling the copier.
        self.reader = RemoteReader(store, catalog, metrics, budget=ReadBudget(read_budget_bytes),
                                   pace=hot_path.turn if hot_path is not None else None, clock=clock)
        self._reconcile_cursor: str | None = None
        self._cleanup_cursors: dict[TopicPartition, int] = {}  # per partition: the next page of abandoned copies
        self._cleanup_due = 0.0  # monotonic time of the next page scan for abandoned copies
        self._retention_again: set[TopicPartition] = set()  # partitions a retention limit stopped: visit again

    # -- segments ---------------------------------------------------------------------------------------------------

    def sealed(self, tp: TopicPartition, segment: SealedSegment, copy: bool) -> None:
        if copy:
            self.copier.enqueue(tp, segment)

    def may_delete_local(self, tp: TopicPartition, segment: SealedSegment, copy: bool, committed: int) -> bool:
        """A sealed segment leaves the local disk only once it is in the bucket (COPY_FINISHED); with
        `remote.copy=false`, once its records are committed in blocks."""
        if copy:
            return self.copier.is_copied(tp, segment.base)
        return segment.last <= committed

    def _copied(self, job: CopyJob) -> None:
        self.sink.copied(job.tp, job.segment.base, job.segment.last)

    async def read(self, tp: TopicPartition, seq: int, fetch_size: int) -> RemoteChunk | Unreadable | Expired:
        return await self.reader.fetch(tp, seq, fetch_size)

    # -- periodic passes --------------------------------------------------------------------------------------------

    def _now(self) -> datetime:
        return utc_now(self.clock)

    async def remote_retention_pass(self) -> int:
        """One pass of remote retention, and of the cleanup of abandoned copies, over the partitions this broker
        leads; returns segments deleted by retention. It never walks the led partitions: the catalog names those
        with something to do (a few statements), and the tier state the topics with a remote retention, so an idle
        broker's pass costs the same with 10 or 100,000 partitions."""
        deleted = 0
        # A copy is abandoned only once older than the grace period, so looking for them once a grace period is
        # enough; deletions an interrupted pass left are finished at every pass (one index probe), because a copy
        # of their base waits for them.
        scan = self.clock.monotonic() >= self._cleanup_due
        if scan:
            self._cleanup_due = self.clock.monotonic() + self.grace.total_seconds()
        # One statement finds the partitions with interrupted deletions, instead of a probe per led partition: a
        # pass costs what is left to finish. A deletion interrupted after this read is finished by the next pass.
        # Likewise one statement finds the partitions with copies old enough to be abandoned: a partition without
        # one has nothing for the cleanup scan to delete.
        leading = bool(self.state.led_epochs_held())
        mid_deletion = await self.catalog.read(catalog_segments.partitions_mid_deletion) if leading else set()
        stale_copies = (await self.catalog.read(catalog_segments.partitions_with_stale_copies,
                                                older_than=self._now() - self.grace)
                        if scan and leading else set())
        mid_retention: set[TopicPartition] = set()  # led here, with a retention and interrupted deletions
        unfinished: set[TopicPartition] = set()  # of those, the ones whose deletions retention finishes

        def retained(tp: TopicPartition) -> TopicConfig | None:
            config = self.state.config_of(tp)
            return config if config and (config.remote_retention_secs or config.remote_retention_bytes) else None

        for tp in sorted({TopicPartition(*key) for key in mid_deletion | stale_copies}):
            if self.state.epoch_of(tp) is None:
                continue  # led elsewhere: its leader finishes and cleans
            config = retained(tp)
            leftovers = tp in mid_deletion
            # Interrupted deletions are finished once per pass: by the cleanup scan, else by retention, else here.
            cleaned = await self._clean_abandoned_copies(tp, tp in stale_copies, finish=leftovers and config is None)
            if config is not None and leftovers:
                mid_retention.add(tp)
                if not cleaned:
                    unfinished.add(tp)
        # Retention visits only the partitions with something to do: those one statement per page names (something
        # past a limit), those with an interrupted deletion, those a limit stopped last time, and, once a grace
        # period, those with block runs left below their first available seq (a pass interrupted before its prune).
        # A partition with nothing past its limits costs nothing: the pass costs what expires.
        again, self._retention_again = self._retention_again, set()
        visited: set[TopicPartition] = set()

        async def enforce(tp: TopicPartition) -> int:
            config = retained(tp)
            if config is None or tp in visited:
                return 0
            visited.add(tp)
            report = await enforce_remote_retention(
                self.store, self.catalog, tp.topic, tp.partition, config, self._now(), grace=self.grace,
                finish_leftovers=tp in unfinished, moved=lambda seq: self.sink.first_available_moved(tp, seq))
            if report.first_available_seq:  # also when nothing expired now: the start as the catalog has it
                self.sink.first_available_moved(tp, report.first_available_seq)
            if report.more:
                self._retention_again.add(tp)
            return len(report.deleted)

        for tp in sorted(mid_retention | again):
            deleted += await enforce(tp)
        limits = retention_limits(self.state.remote_retention_topics())
        async for page in partitions_due(self.catalog, limits, self._now(), runs_below=scan):
            for topic, partition in page:
                deleted += await enforce(TopicPartition(topic, partition))
        if deleted:
            self.metrics.inc(m.REMOTE_SEGMENTS_DELETED, deleted)
        return deleted

    async def _clean_abandoned_copies(self, tp: TopicPartition, scan: bool, *, finish: bool) -> bool:
        """Cleans abandoned copies when `scan`, finishing interrupted deletions on the way; otherwise only finishes
        those, if `finish`. Returns whether interrupted deletions were looked for."""
        epoch = self.state.epoch_of(tp)
        if epoch is None:
            return False
        if not scan:
            if finish:
                await finish_interrupted_deletions(self.store, self.catalog, tp.topic, tp.partition, self._now())
            return finish
        try:
            report = await clean_abandoned_copies(
                self.store, self.catalog, tp.topic, tp.partition, epoch, self._now(), grace=self.grace,
                will_copy=lambda base: self.copier.will_copy(tp, base),
                after_base_seq=self._cleanup_cursors.get(tp, 0))
        except StaleEpoch:
            return False  # led elsewhere now: its leader cleans up; the copier or the durable path fences it here
        self._cleanup_cursors[tp] = report.next_after_base_seq
        if report.deleted:
            self.metrics.inc(m.ABANDONED_COPIES_DELETED, len(report.deleted))
        return True

    async def reconcile_pass(self) -> int:
        """One bounded pass of the two-phase deletion and the orphan reconciler; returns objects deleted."""
        now = self._now()
        abandoned = await abandon_stale_pending(self.catalog, now, grace=self.grace)
        swept = await sweep_deleted_blocks(self.store, self.catalog, now)
        report = await reconcile(self.store, self.catalog, now, grace=self.grace, start_after=self._reconcile_cursor)
        self._reconcile_cursor = report.next_start_after
        if swept:
            self.metrics.inc(m.BLOCKS_DELETED, len(swept))
        if abandoned:
            self.metrics.inc(m.BLOCKS_ABANDONED, len(abandoned))
        if report.deleted:
            self.metrics.inc(m.RECONCILER_DELETIONS, len(report.deleted))
        return len(swept) + len(report.deleted)

    def register_metrics(self) -> None:
        self.metrics.gauge(m.SEGMENTS_PENDING_UPLOAD, lambda: self.copier.pending)
        self.metrics.gauge(m.REMOTE_READ_BYTES, lambda: self.reader.buffered_bytes)
