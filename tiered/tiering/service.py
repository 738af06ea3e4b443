"""The tier below the local disk, as the server sees it (tiered.tier_interface.Tier): the catalog and the object
store, the durable path (tiered.tiering.blocks.durable) and the remote tier (tiered.tiering.remote_tier), wired together.

Life: `start` opens the catalog (migrating it) and the store and starts the background loops; `open_partitions`
registers the disk's topics in the catalog and names the catalog's topics the disk lacks; `join` makes the broker a
member of the service (tiered.tiering.cluster.coordinator): it claims the partitions it should lead, plans each one
(tiered.tiering.cluster.startup) and hands the plans to the server, which carries them out and calls `resume`, after which
the partition is led here; the others are followed. Produce, roll, retention and reads call in through the Tier
methods; commits, fences, copies, leads and follows go out through the server's TierSink.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from tiered import metrics as m
from tiered.bounds import PartitionBounds
from tiered.cancellation import within
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import DEFAULT_DELETE_GRACE
from tiered.catalog.engine import Catalog, mask_url
from tiered.catalog.errors import TopicExists
from tiered.catalog.migrate import upgrade
from tiered.clock import Clock
from tiered.config import Settings
from tiered.metrics import Metrics
from tiered.storage.partition_log import AppendResult, PartitionLog, StoredRecord
from tiered.storage.segment import SealedSegment
from tiered.storage.topic_config import TopicConfig
from tiered.tasks import OUTAGES, Supervisor
from tiered.tier_interface import (
    AckDeadline,
    Expired,
    LocalTopic,
    NewLocalTopic,
    OpenPlan,
    PartitionPlan,
    ProduceCalls,
    RemoteChunk,
    RemoteCompactionReport,
    TierSink,
    Unreadable,
)
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.cluster.coordinator import Coordinator, Endpoints
from tiered.tiering.cluster.notices import Notices, listen_plan
from tiered.tiering.blocks.durable import DurablePath
from tiered.tiering.blocks.block_pipeline import EXPANSION_SWEEP_INTERVAL_S
from tiered.tiering.objects.meter import CATALOG, Direction
from tiered.tiering.partition_state import TierState
from tiered.tiering.compaction.remote_compaction import RemoteCompactor
from tiered.tiering.remote_tier import RECONCILE_INTERVAL_S, RemoteTier
from tiered.tiering.cluster.startup import plan_partition
from tiered.tiering.objects.store import ObjectStore, StoreError, open_store, store_options
from tiered.tiering.objects.topic_objects import put_missing_topic_objects, put_topic_config
from tiered.tiering.objects.usage_flush import FLUSH_INTERVAL_S, UsageFlush
from tiered.topic_partition import TopicPartition

log = logging.getLogger("tiered.tiering")


class TieringService:
    lower_tier = True

    def __init__(self, settings: Settings, sink: TierSink, metrics: Metrics, *, disk_id: str,
                 clock: Clock, store: ObjectStore | None = None, catalog: Catalog | None = None,
                 ack_timeout_s: float = 10.0, migrate: bool = True, grace: timedelta = DEFAULT_DELETE_GRACE):
        self.settings = settings
        self.sink = sink
        self.metrics = metrics
        self.broker_id = settings.broker_id
        self.disk_id = disk_id
        self.clock = clock
        self.ack_timeout_s = ack_timeout_s
        self.grace = grace
        self._store_given = store
        self._catalog_given = catalog
        self._migrate = migrate
        self.supervisor = Supervisor(metrics, clock=clock, outages=(*OUTAGES, StoreError))
        self.state = TierState()  # the one owner of what the tier knows of each partition
        self.coordinator: Coordinator | None = None  # set by join()
        # The produce path's calls (Tier.produce_calls), read per request and per record: until start() and join()
        # this object's own methods, then the owners' methods bound directly, so each costs one Python frame, not two;
        # the ack deadline, until join(), one that never allows (the coordinator's own after).
        self.produce_calls = ProduceCalls(AckDeadline(), self.admits_now, self.appended)
        # Set by start():
        self.store: ObjectStore
        self.catalog: AsyncCatalog
        self.durable: DurablePath
        self.remote: RemoteTier
        self.remote_compactor: RemoteCompactor

    # -- lifecycle --------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        catalog = self._catalog_given
        if catalog is None:
            url = self.settings.effective_catalog_url
            if url.startswith("sqlite:///"):
                Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            if self._migrate:
                before, after = await asyncio.to_thread(upgrade, url)
                if before != after:
                    log.info("catalog migrated from %s to %s", before or "empty", after)
            catalog = await asyncio.to_thread(Catalog.open, url)
        self.catalog = AsyncCatalog(catalog)
        self.store = self._store_given or open_store(self.settings.effective_store_url, **self._store_options())
        # Tests set TIERED_REQUIRE_ATTRIBUTION: a store call of the broker's without one is then refused (a bug).
        self.store.require_attribution = os.environ.get("TIERED_REQUIRE_ATTRIBUTION", "") == "1"
        self.usage = UsageFlush(self.store.meter, self.catalog, self.broker_id, self.clock)
        self.durable = DurablePath(self.store, self.catalog, self.broker_id, self.sink, state=self.state,
                                   metrics=self.metrics, max_bytes=self.settings.block_max_bytes,
                                   max_age_ms=self.settings.block_max_age_ms, grace=self.grace, clock=self.clock,
                                   on_committed=self._commits_advanced, linger_ms=self.settings.block_linger_ms,
                                   max_puts_per_s=self.settings.block_max_puts_per_s,
                                   remote_read_yield_s=self.settings.remote_read_yield_ms / 1000,
                                   expand_in_commit_runs=self.settings.block_expand_in_commit_runs)
        self.hot_path = self.durable.hot_path
        self.produce_calls = replace(self.produce_calls, admits_now=self.durable.pipeline.has_room,
                                     appended=self.durable.appended)
        self.remote = RemoteTier(self.store, self.catalog, self.sink, metrics=self.metrics, state=self.state,
                                 fence=self.durable.fence, grace=self.grace,
                                 read_budget_bytes=self.settings.remote_read_budget_bytes, clock=self.clock,
                                 hot_path=self.hot_path)
        self.remote_compactor = RemoteCompactor(self.store, self.catalog, broker_id=self.broker_id,
                                                workdir=str(self.settings.state_dir / "compaction"), grace=self.grace,
                                                clock=self.clock)
        await self._warm_store()
        try:
            await self.usage.run_pass()  # the stored-bytes gauge from the first scrape on
        except Exception as exc:
            log.warning("the cost meter could not read the bytes stored yet: %s", exc)
        self._register_metrics()
        sup = self.supervisor
        sup.start("block timer", self.durable.block_timer)
        sup.start("segment copier", self.remote.copier.run)
        sup.every("remote retention", self.settings.remote_retention_interval_ms / 1000, self.remote_retention_pass)
        sup.every("reconciler", RECONCILE_INTERVAL_S, self.remote.reconcile_pass)
        sup.every("cost meter", FLUSH_INTERVAL_S, self.usage.run_pass)
        sup.every("block expansion", EXPANSION_SWEEP_INTERVAL_S, self.durable.pipeline.expand_stale)

    async def join(self, advertised: str, http: str, advertised_plain: str = "") -> None:
        """Becomes a member (refused on SQLite while another broker is live), claims what this broker should lead
        before it serves (the first tick), then keeps its lease and looks at the assignments (tiered.tiering.
        coordinator)."""
        coordinator = Coordinator(self.catalog, self.sink, self, broker_id=self.broker_id,
                                  lease_ms=self.settings.cluster_lease_ms, metrics=self.metrics, clock=self.clock)
        await coordinator.join(Endpoints(advertised, http, advertised_plain))
        self.coordinator = coordinator
        self.produce_calls = replace(self.produce_calls, ack_deadline=coordinator.ack_deadline)
        await coordinator.tick()
        self.supervisor.start("lease", coordinator.renew_loop)
        catalog = self.catalog.catalog
        plan = listen_plan(catalog.backend, catalog.engine.url, catalog.pooled, self.settings.catalog_notices_url)
        if plan.note is not None:
            log.warning("%s", plan.note)
        if plan.url is not None:  # LISTEN needs a session of its own, outside the pool
            notices = Notices(plan.url, coordinator.noticed, coordinator.listening)
            self.supervisor.start("change notices", notices.run)
        self.supervisor.start("cluster", coordinator.tick_loop)

    def may_acknowledge(self) -> bool:
        return self.coordinator is not None and self.coordinator.holds_lease()

    def durable_trouble(self) -> str | None:
        return self.durable.trouble() if hasattr(self, "durable") else None

    async def refresh_follower(self, tp: TopicPartition) -> bool:
        return self.coordinator is not None and await self.coordinator.refresh_follower(tp)

    async def hand_over(self, deadline: float) -> None:
        """Stops looking at the assignments and renewing, hands every partition led here to the other live
        brokers (each a clean handover), then ends the lease."""
        if self.coordinator is None:
            return
        await self.supervisor.stop_task("cluster")
        await self.supervisor.stop_task("change notices")
        await self.supervisor.stop_task("lease")
        try:
            await self.coordinator.leave(deadline)
        except Exception as exc:  # the others take the partitions over when the lease expires instead
            log.error("handover failed (%s): the other brokers take the partitions over when the lease expires", exc)

    async def _warm_store(self) -> None:
        """Opens the object store client now (creating it costs ~0.3 s), so the first produce or fetch does not pay;
        an unreachable store is reported here and by /readyz, and does not stop the broker from starting."""
        try:
            async for _ in self.store.list("", limit=1, attribution=CATALOG):
                break
        except Exception as exc:
            log.warning("object store %s does not answer yet: %s", mask_url(self.settings.effective_store_url), exc)

    def _store_options(self) -> dict:
        return store_options(self.settings)

    async def flush(self, deadline: float) -> None:
        if hasattr(self, "durable"):
            await self.durable.flush(deadline)

    async def stop(self, deadline: float) -> None:
        """Stops what start() got to (it may have failed half-way)."""
        await self.supervisor.stop()
        if hasattr(self, "durable"):
            await self.durable.stop()
        if hasattr(self, "usage"):
            try:  # what the meter counted since its last flush
                await self.usage.flush()
            except Exception as exc:
                log.warning("the cost meter's last counts were not written to the catalog: %s", exc)
        if hasattr(self, "remote"):
            self.remote.reader.close()
        if hasattr(self, "store"):
            await self.store.close()
        if hasattr(self, "catalog"):
            await asyncio.to_thread(self.catalog.close)

    async def check_ready(self, timeout_s: float = 1.0) -> tuple[bool, str]:
        """Both parts are asked at once, each within `timeout_s`, so a 503 names the part that failed; a background
        task that keeps failing makes the broker not ready too."""

        async def store_answers() -> None:
            async for _ in self.store.list("", limit=1, attribution=CATALOG):
                break

        checks = {"catalog": self.catalog.read(catalog_topics.list_topics, deadline_s=timeout_s),
                  "object store": store_answers()}
        results = await asyncio.gather(*(within(c, timeout_s) for c in checks.values()), return_exceptions=True)
        for part, result in zip(checks, results):
            if isinstance(result, BaseException):  # readiness reports any failure, it never raises
                reason = str(result) or type(result).__name__
                if isinstance(result, TimeoutError):
                    reason = f"no answer within {timeout_s:.0f} s"
                return False, f"{part}: {reason}"
        problems = self.supervisor.problems()
        if problems:
            return False, problems
        return True, ""

    # -- partitions ------------------------------------------------------------------------------------------------

    async def open_partitions(self, local: Sequence[LocalTopic]) -> OpenPlan:
        """Start-up: registers the disk's topics the catalog lacks, and names the catalog's topics the disk lacks
        (created locally before serving: any broker serves any topic). Which partitions are led here is decided
        when the broker joins."""
        plan = OpenPlan()
        in_catalog = {t.name: t for t in await self.catalog.read(catalog_topics.list_topics)}
        on_disk = {t.name for t in local}
        for topic in local:
            if topic.name not in in_catalog:
                log.info("registering local topic %s in the catalog", topic.name)
                try:
                    await self.catalog.write(catalog_topics.create_topic, topic.name, len(topic.partitions),
                                             topic.config_text)
                except TopicExists:
                    pass
        plan.create = [NewLocalTopic(name, row.partitions, row.config_text) for name, row in in_catalog.items()
                       if name not in on_disk]
        await put_missing_topic_objects(self.store, await self.catalog.read(catalog_topics.list_topics))
        return plan

    async def create_topic(self, name: str, partitions: int, config_text: str) -> list[PartitionPlan]:
        """Records a new topic in the catalog, its partitions spread over the live brokers (and its copy in the
        bucket, for a rebuild). The server creates it locally, then calls `topic_created`. Raises TopicExists."""
        placed = await self.coordinator.place_new_topic(partitions) if self.coordinator is not None else {}
        await self.catalog.write(catalog_topics.create_topic, name, partitions, config_text, leaders=placed)
        await put_topic_config(self.store, name, partitions, config_text)
        return []

    async def topic_created(self, name: str, partitions: int) -> None:
        """The topic exists locally: claim this broker's share now, and wait (a few seconds at most) until the
        other brokers have claimed theirs, so that a client redirected there right after finds the topic led."""
        if self.coordinator is None:
            return
        await self.coordinator.tick()
        await self.coordinator.await_claims({TopicPartition(name, p): 0 for p in range(partitions)},
                                            self.clock.monotonic() + 5.0)

    # -- leadership (tiered.tiering.cluster.coordinator.Leadership) ------------------------------------------------------

    def leading(self) -> dict[TopicPartition, int]:
        return self.state.led_epochs()

    async def claim(self, topic: str, expected: dict[int, int]) -> list[PartitionPlan]:
        """Claims the partitions whose epoch is still the one expected, and plans each one won from what the disk
        holds (tiered.tiering.cluster.startup). A partition not open here is not claimed: its topic is created locally only
        at the tick after the catalog names it, and a claim before that would leave it led and not served until
        the tick after (clients told "unknown topic" by its leader meanwhile)."""
        local = {p: self.sink.local_partition(TopicPartition(topic, p)) for p in expected}
        opened = {p: lp for p, lp in local.items() if lp is not None}
        if len(opened) < len(local):
            log.info("%s: partitions %s are not open here yet; not claimed", topic, sorted(set(local) - set(opened)))
        if not opened:
            return []
        expected = {p: expected[p] for p in opened}
        since = {p: (lp.applied_epoch if lp is not None else None) for p, lp in local.items()}
        claims = await self.catalog.write(catalog_partitions.claim_leadership, self.broker_id, self.disk_id, topic,
                                          since, expected_epochs=expected)
        plans = []
        for p, claim in sorted(claims.items()):
            tp = TopicPartition(topic, p)
            if claim.before.hwmark_seq:  # never committed (a new topic's): nothing of it can be in the bucket
                await self.remote.copier.load_copied(tp)
            plans.append(plan_partition(local[p], claim, broker_id=self.broker_id, disk_id=self.disk_id,
                                        highest_copied_seq=self.state.highest_copied_seq(tp)))
        return plans

    async def give_up(self, keys: Sequence[TopicPartition], deadline: float) -> None:
        """A clean handover: the open block and every block in flight are committed (until `deadline`), then the
        partitions are no longer led here. Records still uncommitted then are refused by the new leader's epoch."""
        await self.durable.flush(deadline)
        for tp in keys:
            self.lost(tp)

    def lost(self, tp: TopicPartition) -> None:
        self.state.lose(tp)
        self.durable.release(tp)

    async def resume(self, plan: PartitionPlan, config: TopicConfig, tail: Iterable[StoredRecord]) -> None:
        tp = TopicPartition(plan.topic, plan.partition)
        self.state.lead(tp, plan.epoch, config, plan.committed)
        self.durable.lead(tp)
        count = await self.durable.upload_tail(tp, tail, self.ack_timeout_s)
        if count:
            log.info("%s: uploading %d records past the catalog's high-water mark before serving them", tp, count)

    def reconfigured(self, tp: TopicPartition, config: TopicConfig) -> None:
        self.state.reconfigured(tp, config)

    def _commits_advanced(self) -> None:
        self.remote.copier.commits_advanced()

    # -- the produce path ---------------------------------------------------------------------------------------------

    async def admission(self) -> bool:
        return await self.durable.admission(self.ack_timeout_s)

    def admits_now(self) -> bool:
        return self.durable.pipeline.has_room()

    def appended(self, tp: TopicPartition, appended: AppendResult, durable: bool) -> asyncio.Future | None:
        return self.durable.appended(tp, appended, durable)

    # -- segments and reads -----------------------------------------------------------------------------------------

    def sealed(self, tp: TopicPartition, segment: SealedSegment) -> None:
        config = self.state.config_of(tp)
        if config is not None:
            self.remote.sealed(tp, segment, config.remote_copy)

    def may_delete_local(self, tp: TopicPartition, segment: SealedSegment) -> bool:
        config = self.state.config_of(tp)
        if config is None:
            # Led elsewhere (or fenced): the local records are a cache of what the bucket holds (or were never
            # committed).
            return True
        return self.remote.may_delete_local(tp, segment, config.remote_copy, self.state.committed_seq(tp))

    async def read(self, tp: TopicPartition, seq: int, fetch_size: int,
                   bounds: PartitionBounds) -> RemoteChunk | Unreadable | Expired | None:
        return await self.remote.read(tp, seq, fetch_size)

    async def compact_remote(self, tp: TopicPartition, log: PartitionLog,
                             force: bool = False) -> RemoteCompactionReport | None:
        """The bucket's copy of a compacted partition led here, compacted (tiered.tiering.compaction.remote_compaction)."""
        epoch, config = self.state.epoch_of(tp), self.state.config_of(tp)
        if epoch is None or config is None:
            return None
        report = await self.remote_compactor.compact(tp.topic, tp.partition, log, epoch, force=force)
        if report.groups:  # consumers read the compacted locations from now on, not the cached old ones
            self.state.locations_changed(tp)
            self.remote.reader.forget_locations(tp)
        if report.groups and config.remote_copy:  # the compacted local segments now in the bucket may leave
            await self.remote.copier.load_copied(tp)  # the disk's veto list
        return report

    async def remote_retention_pass(self) -> int:
        return await self.remote.remote_retention_pass()

    async def reconcile_pass(self) -> int:
        return await self.remote.reconcile_pass()

    # -- observability ----------------------------------------------------------------------------------------------

    def partition_status(self, tp: TopicPartition) -> dict:
        segments, pending_bytes = self.remote.copier.pending_for(tp)
        state = self.state.of(tp)
        return {
            "highest_copied_seq": state.highest_copied_seq,
            "committed_seq": state.committed_seq,
            "pending_segments": segments,
            "pending_segment_bytes": pending_bytes,
        }

    def _register_metrics(self) -> None:
        counters = self.store.counters
        metrics = self.metrics
        metrics.counter_fn(m.STORE_PUTS, lambda: counters.puts)
        metrics.counter_fn(m.STORE_GETS, lambda: counters.gets)
        metrics.counter_fn(m.STORE_ERRORS, lambda: counters.errors)
        metrics.counter_fn(m.STORE_PUT_BYTES, lambda: counters.put_bytes)
        metrics.counter_fn(m.CATALOG_STATEMENTS, lambda: self.catalog.catalog.statements)
        meter = self.store.meter
        metrics.counter_fn(m.OBJECT_REQUESTS, lambda: {m.labels(topic=topic, op=op): n
                                                       for (topic, op), n in sorted(meter.requests.items())})
        metrics.counter_fn(m.OBJECT_BYTES, lambda: {m.labels(topic=topic, direction=direction): n
                                                    for (topic, direction), n in sorted(meter.bytes.items())
                                                    if direction != Direction.INGESTED})
        metrics.gauge(m.OBJECT_BYTES_STORED, lambda: {m.labels(topic=topic): float(n)
                                                      for topic, n in sorted(self.usage.stored.items())})
        self.durable.register_metrics()
        self.remote.register_metrics()
        metrics.gauge(m.UPLOAD_LAG_BYTES, lambda: self.durable.unuploaded_bytes + self.remote.copier.pending_bytes)
        metrics.gauge(m.UPLOAD_LAG_SECONDS, self._upload_lag_s)
        metrics.gauge(m.LEADERSHIPS, lambda: len(self.leading()))
        metrics.gauge(m.LEASE_HELD, lambda: 1 if self.may_acknowledge() else 0)

    def _upload_lag_s(self) -> float:
        oldest = self.durable.oldest_unuploaded_ms()
        return max(0.0, (self.clock.now_ms() - oldest) / 1000.0) if oldest is not None else 0.0
