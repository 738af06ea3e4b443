"""The tiered layer of a running broker: the catalog, the object store, the block builder and its pipeline.

The broker calls it at a few points only: `start` (after the local logs are recovered), `admission` and
`appended` on produce, `create_topic`/`topic_opened`, `may_delete_local` from local retention, `flush`/`stop` on
shutdown, and `check_ready` for /readyz.

Start-up reconciles the local disk with the catalog: see startup.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

from tiered.catalog import brokers as catalog_brokers
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import topics as catalog_topics
from tiered.catalog.engine import Catalog
from tiered.catalog.errors import CatalogUnavailable, StaleEpoch
from tiered.catalog.migrate import upgrade
from tiered.config import Settings, mask_url
from tiered.storage.partition_log import AppendResult
from tiered.tiering.block_builder import BlockBuilder, PartitionKey, PendingRun
from tiered.tiering.block_pipeline import BlockPipeline
from tiered.tiering.catalog_thread import CatalogThread
from tiered.tiering.startup import reconcile_with_catalog
from tiered.tiering.reconciler import abandon_stale_pending, reconcile, sweep_deleted_blocks
from tiered.tiering.remote_retention import enforce_remote_retention
from tiered.tiering.remote_fetch import RemoteReader
from tiered.tiering.segment_copier import CopyJob, SegmentCopier
from tiered.tiering.store import ObjectStore, StoreError, open_store
from tiered.tiering.topic_objects import put_topic_config

log = logging.getLogger("tiered.tiering")

REMOTE_RETENTION_INTERVAL_S = 60.0
RECONCILE_INTERVAL_S = 120.0
HEARTBEAT_INTERVAL_S = 10.0
# Longer than any cache of catalog lookups (the remote reader's segment cache lives 60 s) and any upload in flight.
DELETE_GRACE = timedelta(minutes=10)


class TieringService:
    def __init__(self, settings: Settings, *, store: ObjectStore | None = None, catalog: Catalog | None = None,
                 now_ms: Callable[[], float] = lambda: time.time() * 1000, ack_timeout_s: float = 10.0,
                 migrate: bool = True):
        self.settings = settings
        self.broker_id = settings.broker_id
        self.now_ms = now_ms
        self.ack_timeout_s = ack_timeout_s
        self._store = store
        self._catalog = catalog
        self._migrate = migrate
        self.store: ObjectStore | None = None
        self.catalog: CatalogThread | None = None
        self.builder = BlockBuilder(settings.block_max_bytes, settings.block_max_age_ms)
        self.pipeline: BlockPipeline | None = None
        self.copier: SegmentCopier | None = None
        self.epochs: dict[PartitionKey, int] = {}
        self.broker = None
        self.grace = DELETE_GRACE
        self._reconcile_cursor: str | None = None
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle --------------------------------------------------------------------------------------------

    async def start(self, broker) -> None:
        self.broker = broker
        if self._catalog is None:
            url = self.settings.effective_catalog_url
            if url.startswith("sqlite:///"):
                Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            if self._migrate:
                before, after = await asyncio.to_thread(upgrade, url)
                if before != after:
                    log.info("catalog migrated from %s to %s", before or "empty", after)
            self._catalog = await asyncio.to_thread(Catalog.open, url)
        self.catalog = CatalogThread(self._catalog)
        if self._store is None:
            self._store = open_store(self.settings.effective_store_url, **self._store_options())
        self.store = self._store
        metrics = broker.metrics
        self.pipeline = BlockPipeline(
            self.store, self.catalog, self.broker_id, self.epochs, metrics=metrics,
            on_committed=self._committed, on_fenced=self._fenced, ack_timeout_s=self.ack_timeout_s,
            now_ms=self.now_ms,
        )  # fmt: skip
        self.copier = SegmentCopier(
            self.store, self.catalog, metrics=metrics, epoch_of=lambda t, p: self.epochs[(t, p)],
            committed_up_to=self._committed_up_to, on_copied=self._copied, on_fenced=self._fenced,
        )  # fmt: skip
        broker.fetch.remote = RemoteReader(
            self.store, self.catalog, metrics,
            highest_copied=lambda t, p: self.copier.copied_last.get((t, p), 0),
        )  # fmt: skip
        broker.registry.on_seal = self._sealed
        broker.registry.may_delete = self.may_delete_local
        await self._warm_store()
        host, port = self.settings.listen_endpoint()
        await self.catalog.call(catalog_brokers.register_broker, self.broker_id, f"{socket.gethostname()}:{port}")
        await reconcile_with_catalog(self)
        self._register_metrics(metrics)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._block_timer()))
        self._tasks.append(loop.create_task(self.copier.run()))
        self._tasks.append(loop.create_task(self._every(REMOTE_RETENTION_INTERVAL_S, "remote retention",
                                                        self.remote_retention_pass)))
        self._tasks.append(loop.create_task(self._every(RECONCILE_INTERVAL_S, "reconciler", self.reconcile_pass)))
        self._tasks.append(loop.create_task(self._heartbeat()))

    async def _warm_store(self) -> None:
        """Opens the object store client now (creating it costs ~0.3 s), so the first produce or fetch does not pay;
        an unreachable store is reported here and by /readyz, and does not stop the broker from starting."""
        try:
            async for _ in self.store.list("", limit=1):
                break
        except Exception as exc:
            log.warning("object store %s does not answer yet: %s", mask_url(self.settings.effective_store_url), exc)

    def _store_options(self) -> dict:
        if self.settings.effective_store_url.startswith("s3://"):
            return {"path_style": self.settings.s3_path_style}
        return {}

    async def flush(self, deadline: float) -> None:
        """Shutdown: close the open block and wait (until `deadline`, a monotonic time) for every commit."""
        pending = self.builder.pending_bytes
        self._close_block()
        if self.pipeline is not None:
            in_flight = self.pipeline.in_flight
            done = await self.pipeline.drain(deadline - time.monotonic())
            if done:
                log.info("shutdown: committed the open block (%d bytes) and %d blocks in flight", pending, in_flight)
            else:
                log.error("shutdown: %d blocks not committed in time; their records stay on the local disk and are "
                          "uploaded at the next start", self.pipeline.in_flight)

    async def stop(self, deadline: float) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        if self.pipeline is not None:
            await self.pipeline.cancel()
        if self.store is not None:
            await self.store.close()
        if self.catalog is not None:
            await asyncio.to_thread(self.catalog.close)

    async def check_ready(self, timeout_s: float = 1.0) -> tuple[bool, str]:
        """Both parts are asked at once, each within `timeout_s`, so a 503 names the part that failed."""

        async def store_answers() -> None:
            async for _ in self.store.list("", limit=1):
                break

        checks = {"catalog": self.catalog.call(catalog_topics.list_topics), "object store": store_answers()}
        results = await asyncio.gather(*(asyncio.wait_for(c, timeout_s) for c in checks.values()),
                                       return_exceptions=True)
        for part, result in zip(checks, results):
            if isinstance(result, BaseException):  # readiness reports any failure, it never raises
                return False, f"{part}: {result or type(result).__name__}"
        return True, ""

    # -- topics and partitions --------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int, config_text: str) -> None:
        """Records a new topic in the catalog before its directories exist. Raises TopicExists."""
        await self.catalog.call(catalog_topics.create_topic, name, partitions, config_text)
        await put_topic_config(self.store, name, partitions, config_text)

    async def topic_opened(self, topic) -> None:
        """Claims leadership of a topic's partitions; the broker serves them from now on."""
        claimed = await self.catalog.call(catalog_partitions.claim_partitions, self.broker_id, topic.name,
                                          range(len(topic.partitions)))
        for partition, epoch in claimed.items():
            self.epochs[(topic.name, partition)] = epoch

    # -- the produce path ---------------------------------------------------------------------------------------

    async def admission(self) -> bool:
        return await self.pipeline.admission(self.ack_timeout_s)

    def appended(self, part, appended: AppendResult) -> asyncio.Future | None:
        ack = asyncio.get_running_loop().create_future() if part.durable else None
        was_empty = self.builder.empty
        self.builder.add(part.topic, part.partition, appended.first_seq, appended.last_seq, appended.record,
                         self.now_ms(), ack, appended.header)
        if self.builder.pending_bytes >= self.builder.max_bytes:
            self._close_block()  # at once: the timer task may only run after many more appends
        elif was_empty:
            self._kick.set()
        return ack

    def kick(self) -> None:
        """Wakes the block timer: records arrived in an empty builder, or it is full."""
        self._kick.set()

    def _close_block(self) -> None:
        block = self.builder.close()
        if block is not None:
            self.pipeline.submit(block)

    async def _block_timer(self) -> None:
        while True:
            due = self.builder.due_ms()
            if due is None:
                await self._kick.wait()
                self._kick.clear()
                continue
            now = self.now_ms()
            if self.builder.should_close(now):
                self._close_block()
                continue
            try:
                await asyncio.wait_for(self._kick.wait(), (due - now) / 1000.0)
                self._kick.clear()
            except asyncio.TimeoutError:
                pass

    def _committed(self, runs: list[PendingRun]) -> None:
        registry = self.broker.registry
        for run in runs:
            part = registry.get(run.topic, run.partition)
            if part is None:
                continue
            part.remote_hwmark = max(part.remote_hwmark, run.last_seq)
            if not part.remote_first_available:
                part.remote_first_available = run.first_seq
            if part.durable:
                part.log.mark_visible(run.last_seq)
                self.broker.made_visible(part, run.first_seq, run.size_bytes)
        self.copier.commits_advanced()

    def _fenced(self, key: PartitionKey, exc: StaleEpoch) -> None:
        part = self.broker.registry.get(*key)
        if part is not None:
            part.fenced = True
        self.broker.metrics.inc("tiered_fenced_partitions_total", help="partitions fenced by a newer leader epoch")
        log.error("%s/%d: %s; this broker stops serving the partition", key[0], key[1], exc)

    def _sealed(self, part, segment) -> None:
        """A segment rolled (or was found sealed at start): copy it unless the topic keeps segments local."""
        if part.config.remote_copy:
            self.copier.enqueue(part.topic, part.partition, segment)

    def _committed_up_to(self, topic: str, partition: int) -> int:
        part = self.broker.registry.get(topic, partition)
        return part.remote_hwmark if part is not None else 0

    def _copied(self, job: CopyJob) -> None:
        part = self.broker.registry.get(job.topic, job.partition)
        if part is not None and not part.remote_first_available:
            part.remote_first_available = job.segment.base

    def may_delete_local(self, part, segment) -> bool:
        """A sealed segment leaves the local disk only once it is in the bucket (COPY_FINISHED); with
        `remote.copy=false`, once its records are committed in blocks."""
        if part.config.remote_copy:
            return self.copier.is_copied(part.topic, part.partition, segment.base)
        return segment.last <= part.remote_hwmark

    def tier_status(self) -> list[dict]:
        """Per partition: what the local disk holds, what the bucket holds, and what is still on its way there."""
        out = []
        for part in self.broker.registry.all_partitions():
            plog = part.log
            segments, pending_bytes = self.copier.pending_for(part.topic, part.partition)
            out.append({
                "topic": part.topic,
                "partition": part.partition,
                "local_first": plog.first_available,
                "local_last": plog.last_assigned,
                "local_bytes": plog.stats().bytes,
                "remote_first": part.remote_first_available,
                "remote_segments_last": self.copier.copied_last.get((part.topic, part.partition), 0),
                "committed": part.remote_hwmark,
                "hwmark": part.hwmark,
                "pending_segments": segments,
                "pending_segment_bytes": pending_bytes,
                "fenced": part.fenced,
            })  # fmt: skip
        return out

    # -- background ---------------------------------------------------------------------------------------------

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.now_ms() / 1000, timezone.utc)

    async def remote_retention_pass(self) -> int:
        """One pass of remote retention over the partitions this broker leads; returns segments deleted."""
        deleted = 0
        for part in list(self.broker.registry.all_partitions()):
            config = part.config
            if part.fenced or not (config.remote_retention_secs or config.remote_retention_bytes):
                continue
            report = await enforce_remote_retention(self.store, self.catalog.catalog, part.topic, part.partition,
                                                    config, self._now(), grace=self.grace)
            if report.first_available_seq > part.remote_first_available:
                part.remote_first_available = report.first_available_seq
            deleted += len(report.deleted)
        if deleted:
            self.broker.metrics.inc("tiered_remote_segments_deleted_total", deleted,
                                    help="remote segments expired by remote retention")
        return deleted

    async def reconcile_pass(self) -> int:
        """One bounded pass of the two-phase deletion and the orphan reconciler; returns objects deleted."""
        now = self._now()
        metrics = self.broker.metrics
        abandoned = await abandon_stale_pending(self.catalog.catalog, now, grace=self.grace)
        swept = await sweep_deleted_blocks(self.store, self.catalog.catalog, now)
        report = await reconcile(self.store, self.catalog.catalog, now, grace=self.grace,
                                 start_after=self._reconcile_cursor)
        self._reconcile_cursor = report.next_start_after
        if swept:
            metrics.inc("tiered_blocks_deleted_total", len(swept), help="block objects deleted after their grace period")
        if abandoned:
            metrics.inc("tiered_blocks_abandoned_total", len(abandoned), help="intent rows whose upload never committed")
        if report.deleted:
            metrics.inc("tiered_reconciler_deletions_total", len(report.deleted),
                        help="orphan objects the catalog did not know, deleted by the reconciler")
        return len(swept) + len(report.deleted)

    async def _every(self, interval_s: float, what: str, step) -> None:
        """Runs `step` every `interval_s`. An outage (catalog or store unavailable) is logged in one line when it
        starts and one when it ends, not once per pass with a traceback; anything else is a bug, logged whole."""
        failing = False
        while True:
            await asyncio.sleep(interval_s)
            try:
                await step()
            except (CatalogUnavailable, StoreError, OSError) as exc:
                if not failing:
                    log.warning("%s failed: %s; retrying every %.0f s", what, exc or type(exc).__name__, interval_s)
                failing = True
                continue
            except Exception:
                log.exception("%s failed; retrying in %.0f s", what, interval_s)
                continue
            if failing:
                log.info("%s works again", what)
                failing = False

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
            try:
                await self.catalog.call(catalog_brokers.heartbeat, self.broker_id)
            except Exception as exc:
                log.warning("catalog heartbeat failed: %s", exc)

    def _register_metrics(self, metrics) -> None:
        counters = self.store.counters
        metrics.counter_fn("tiered_store_puts_total", "object store PUT requests", lambda: counters.puts)
        metrics.counter_fn("tiered_store_gets_total", "object store GET requests", lambda: counters.gets)
        metrics.counter_fn("tiered_store_errors_total", "object store request errors", lambda: counters.errors)
        metrics.counter_fn("tiered_store_put_bytes_total", "bytes uploaded", lambda: counters.put_bytes)
        metrics.gauge("tiered_block_pending_bytes", "bytes waiting for the next block",
                      lambda: self.builder.pending_bytes)
        metrics.gauge("tiered_blocks_in_flight", "blocks uploading or committing", lambda: self.pipeline.in_flight)
        metrics.counter_fn("tiered_catalog_statements_total", "SQL statements sent to the catalog",
                           lambda: self.catalog.catalog.statements)
        metrics.gauge("tiered_segments_pending_upload", "sealed segments waiting to be copied",
                      lambda: self.copier.pending)
        metrics.gauge("tiered_upload_lag_bytes", "bytes appended locally and not yet in the bucket",
                      lambda: self.builder.pending_bytes + self.pipeline.in_flight_bytes + self.copier.pending_bytes)
        metrics.gauge("tiered_upload_lag_seconds", "age of the oldest record not yet committed to the bucket",
                      self._upload_lag_s)

    def _upload_lag_s(self) -> float:
        oldest = [t for t in (self.pipeline.oldest_open_ms(), self.builder.opened_ms) if t is not None]
        return max(0.0, (self.now_ms() - min(oldest)) / 1000.0) if oldest else 0.0
