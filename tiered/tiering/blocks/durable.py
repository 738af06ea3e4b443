"""The durable path: every appended record reaches the bucket and the catalog within the block window.

Appended records go to the block builder (tiered.tiering.blocks.block_builder); a timer closes the block when its oldest
record is `block_max_age_ms` old (or at once when it is full) and hands it to the pipeline
(tiered.tiering.blocks.block_pipeline), which uploads and commits blocks in order. Commits are reported to the server's
sink (records become visible, durable acks are answered); a refused commit fences the partition.

Two block policies, one setting apart:
- cost-first (the default, `block_linger_ms` = the age limit): a block waits out its age limit, so at low rates
  every ack waits ~250 ms, and PUTs stay at most a few a second (and ~128 per GiB at high rates);
- latency-first (`block_linger_ms` below the age limit): while no block is uploading, the open block closes once
  its oldest record is `block_linger_ms` old, so a lone produce is acked after linger + one PUT + one commit. While
  a block uploads, records gather as under cost-first (an upload is the natural batch window), and early closes are
  spaced at least 1/`block_max_puts_per_s` apart, so the PUTs this adds per second stay bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from tiered import metrics as m
from tiered.catalog.blocks import EXPAND_IN_COMMIT_RUNS
from tiered.clock import Clock, wait_for_event
from tiered.metrics import Metrics
from tiered.storage.partition_log import AppendResult, StoredRecord
from tiered.tier_interface import TierSink
from tiered.tiering.blocks.block_builder import BlockBuilder, PendingRun, _add_to_run_native
from tiered.tiering.blocks.block_pipeline import BlockPipeline
from tiered.tiering.blocks.hot_path import HotPathGate
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.partition_state import TierState
from tiered.tiering.objects.store import ObjectStore
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.tiering")

try:
    from tiered.tiering.blocks._builder import Appended as _Appended
except ImportError:  # built without a C compiler: DurablePath.appended serves
    pass


class DurablePath:
    def __init__(self, store: ObjectStore, catalog: AsyncCatalog, broker_id: int, sink: TierSink, *,
                 state: TierState, metrics: Metrics, max_bytes: int, max_age_ms: int, grace, clock: Clock,
                 on_committed=None, linger_ms: int | None = None, max_puts_per_s: float = 10.0,
                 remote_read_yield_s: float = 0.0, expand_in_commit_runs: int = EXPAND_IN_COMMIT_RUNS):
        self.sink = sink
        self.state = state
        self.metrics = metrics
        self.clock = clock
        self.builder = BlockBuilder(state, max_bytes, max_age_ms)
        self._extra_on_committed = on_committed
        # Remote reads give way to this path (tiered.tiering.blocks.hot_path): the gate is told when blocks are in flight,
        # and asks when the open block is due.
        self.hot_path = HotPathGate(remote_read_yield_s, due_in_s=self.due_in_s, clock=clock)
        self.pipeline = BlockPipeline(store, catalog, broker_id, metrics=metrics, on_committed=self._committed,
                                      on_fenced=self.fence, grace=grace, clock=clock, on_done=self._upload_done,
                                      hot_path=self.hot_path, expand_in_commit_runs=expand_in_commit_runs)
        self._kick = asyncio.Event()
        if self.builder._add_to_run is _add_to_run_native:
            # `appended` natively (_builder.Appended: the same steps in one call, the clock read only when a record
            # opens the block); the method below is its reference, and serves with TIERED_PRODUCE_PATH=python.
            self.appended = _Appended(self.builder, clock.now_ms, self._close_block, self._kick.set)
        self.linger_ms = max_age_ms if linger_ms is None else min(linger_ms, max_age_ms)
        self.early_close_spacing_ms = 1000.0 / max_puts_per_s
        self._last_early_close_ms = float("-inf")

    # -- leadership ------------------------------------------------------------------------------------------------

    def lead(self, tp: TopicPartition) -> None:
        """Uploads the partition's records from now on (led here: TierState.lead first), under its epoch,
        continuing its committed seq."""
        self.builder.lead(tp)

    async def upload_tail(self, tp: TopicPartition, tail: Iterable[StoredRecord], timeout_s: float) -> int:
        """Uploads local records past the catalog's high-water mark (a restart), in order, before later appends:
        block by block, waiting for room in the pipeline as produces do. Returns how many records it took."""
        count = 0
        for stored in tail:
            if self.builder.pending_bytes >= self.builder.max_bytes:
                self._close_block()
                while not await self.admission(timeout_s):
                    log.warning("%s: uploads are stalled; the restart's re-upload waits", tp)
            self.builder.add(tp, stored.first_seq, stored.last_seq, stored.record,
                             stored.segment_base, self.clock.now_ms())
            count += 1
        if count:
            self._kick.set()
        return count

    def release(self, tp: TopicPartition) -> None:
        """No longer led here (handed over, or claimed by another broker): records not yet in a block are dropped
        and their acks refused; blocks in flight commit, or are refused by the new leader's epoch."""
        self.builder.release(tp)

    # -- the produce path ------------------------------------------------------------------------------------------

    async def admission(self, timeout_s: float) -> bool:
        return await self.pipeline.admission(timeout_s)

    def appended(self, tp: TopicPartition, appended: AppendResult, durable: bool) -> asyncio.Future | None:
        ack = asyncio.get_running_loop().create_future() if durable else None
        builder = self.builder
        opened = builder.add(tp, appended.first_seq, appended.last_seq, appended.record,
                             appended.segment_base, self.clock.now_ms(), ack, appended.header)
        if builder.pending_bytes >= builder.max_bytes:
            self._close_block()  # at once: the timer task may only run after many more appends
        elif opened:
            self._kick.set()
        return ack

    def _close_block(self) -> None:
        block = self.builder.close()
        if block is not None:
            self.pipeline.submit(block)

    def trouble(self) -> str | None:
        """The latest failed upload or commit of a block, while it is being retried."""
        return self.pipeline.retry.last_failure

    def due_ms(self) -> float | None:
        """When the open block closes by time (None: nothing is open): at its age limit, or, latency-first and with no
        upload in flight, once it has lingered and the last early close is far enough back."""
        by_age = self.builder.due_ms()
        if by_age is None or self.linger_ms >= self.builder.max_age_ms or self.pipeline.in_flight:
            return by_age
        opened = self.builder.opened_ms or 0.0
        early = max(opened + self.linger_ms, self._last_early_close_ms + self.early_close_spacing_ms)
        return min(by_age, early)

    def due_in_s(self) -> float | None:
        """Seconds until the open block closes by time (None: nothing is open; at most 0 when overdue)."""
        due = self.due_ms()
        return None if due is None else (due - self.clock.now_ms()) / 1000.0

    async def block_timer(self) -> None:
        """Closes the open block when it is due (run under the supervisor). It looks again at every append to an
        empty builder and at the end of every upload (latency-first: an idle pipeline may make the block due)."""
        while True:
            due = self.due_ms()
            if due is None:
                await self._kick.wait()
                self._kick.clear()
                continue
            now = self.clock.now_ms()
            by_age = self.builder.should_close(now)  # full, or at its age limit
            if by_age or now >= due:
                self._close_block()
                if not by_age:
                    self._last_early_close_ms = now
                    self.metrics.inc(m.BLOCKS_CLOSED_EARLY)
                continue
            if await wait_for_event(self.clock, self._kick, (due - now) / 1000.0):
                self._kick.clear()

    def _upload_done(self) -> None:
        if self.linger_ms < self.builder.max_age_ms:
            self._kick.set()

    def _committed(self, runs: list[PendingRun]) -> None:
        for run in runs:
            tp = TopicPartition(run.topic, run.partition)
            self.state.committed(tp, run.last_seq)
            self.sink.committed(tp, run.first_seq, run.last_seq, run.size_bytes)
        if self._extra_on_committed is not None:
            self._extra_on_committed()

    def fence(self, tp: TopicPartition, epoch: int | None, reason: str) -> None:
        """A write of the partition under `epoch` (None: its current one) was refused for a newer epoch: it is
        fenced (TierState.fence), its pending records dropped and the server told, once."""
        if not self.state.fence(tp, epoch):
            return  # already reported (by the copier or an earlier block), or led again under a newer epoch
        self.builder.release(tp)
        self.metrics.inc(m.FENCED_PARTITIONS)
        log.error("%s: %s; this broker stops serving the partition", tp, reason)
        self.sink.fenced(tp, reason)

    # -- shutdown ------------------------------------------------------------------------------------------------

    async def flush(self, deadline: float) -> None:
        """Closes the open block and waits (until `deadline`, on the clock's monotonic time) for every commit."""
        pending = self.builder.pending_bytes
        self._close_block()
        in_flight = self.pipeline.in_flight
        if await self.pipeline.drain(deadline - self.clock.monotonic()):
            log.info("shutdown: committed the open block (%d bytes) and %d blocks in flight", pending, in_flight)
        else:
            log.error("shutdown: %d blocks not committed in time; their records stay on the local disk and are "
                      "uploaded at the next start", self.pipeline.in_flight)

    async def stop(self) -> None:
        await self.pipeline.cancel()

    # -- observability -------------------------------------------------------------------------------------------

    def register_metrics(self) -> None:
        self.metrics.gauge(m.BLOCK_PENDING_BYTES, lambda: self.builder.pending_bytes)
        self.metrics.gauge(m.BLOCKS_IN_FLIGHT, lambda: self.pipeline.in_flight)

    def oldest_unuploaded_ms(self) -> float | None:
        oldest = [t for t in (self.pipeline.oldest_open_ms(), self.builder.opened_ms) if t is not None]
        return min(oldest) if oldest else None

    @property
    def unuploaded_bytes(self) -> int:
        return self.builder.pending_bytes + self.pipeline.in_flight_bytes
