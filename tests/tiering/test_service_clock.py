"""The TieringService built directly, on the manual clock (tests/support/clock.py), the local object store and SQLite:
a partition resumed here takes a produce, its block closes when the clock reaches the block's age (nothing sleeps
on real time for it) and commits; the tier state (tiered.tiering.partition_state) is the one place that then says
the committed seq. A partition whose commit a newer leader refuses is fenced there, so the service no longer
counts it as led (before, its builder was released while the service still listed it)."""

from __future__ import annotations

import asyncio

from tests.support.clock import ManualClock
from tests.tiering.test_durable_path import RecordingSink, appended, claimed_catalog, record, settle
from tiered.catalog import partitions as catalog_partitions
from tiered.config import Settings
from tiered.metrics import Metrics
from tiered.storage.topic_config import TopicConfig
from tiered.tier_interface import AckOutcome, PartitionPlan
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.tiering.partition_state import Role
from tiered.tiering.service import TieringService
from tiered.topic_partition import TopicPartition


def plan(partition: int, epoch: int) -> PartitionPlan:
    return PartitionPlan("t", partition, epoch, committed=0, first_available=0, highest_copied_seq=0, truncate_after=None,
                         next_seq=1, reupload_after=None, reason="a new partition")


async def test_a_block_commits_on_the_manual_clock_and_a_refused_one_fences(tmp_path):
    catalog, epochs = claimed_catalog(tmp_path / "catalog.db")
    clock = ManualClock()
    sink = RecordingSink()
    service = TieringService(Settings(data_dir=tmp_path / "data", broker_id=1), sink, Metrics(), disk_id="disk",
                             store=LocalObjectStore(tmp_path / "objects"), catalog=catalog, clock=clock,
                             migrate=False)
    await service.start()
    try:
        for p, epoch in epochs.items():
            await service.resume(plan(p, epoch), TopicConfig(), [])
        assert service.leading() == {("t", 0): epochs[0], ("t", 1): epochs[1]}

        ack = service.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
        await settle(None, lambda: service.durable.due_in_s() is not None, "the block open")
        clock.advance(service.settings.block_max_age_ms / 1000)
        await clock.settle()
        assert await asyncio.wait_for(ack, 10) is AckOutcome.COMMITTED
        assert sink.commits == [("t", 0, 1, 1)]
        assert service.state.committed_seq(TopicPartition("t", 0)) == 1
        assert catalog_partitions.get_partition_states(catalog, "t")[0].hwmark_seq == 1

        catalog_partitions.claim_partitions(catalog, 9, "t", [1])  # another broker takes t/1 over
        refused = service.appended(TopicPartition("t", 1), appended(1, record()), durable=True)
        await settle(None, lambda: service.durable.due_in_s() is not None, "the block open")
        clock.advance(service.settings.block_max_age_ms / 1000)
        await clock.settle()
        assert await asyncio.wait_for(refused, 10) is AckOutcome.REFUSED
        assert sink.fences == [("t", 1)]
        assert service.state.of(TopicPartition("t", 1)).role is Role.FENCED
        assert service.leading() == {("t", 0): epochs[0]}
        assert service.partition_status(TopicPartition("t", 0))["committed_seq"] == 1
    finally:
        await service.stop(clock.monotonic() + 5)


async def test_the_produce_calls_answer_as_the_services_own_methods(tmp_path):
    """The produce path calls the tier through `produce_calls` (the owners' methods, bound by start and join): before
    the service joins it may not acknowledge (its ack deadline never allows), after start its pipeline admits and a
    record appended through it is committed, as through the service's own `appended`."""
    catalog, epochs = claimed_catalog(tmp_path / "catalog.db")
    clock = ManualClock()
    service = TieringService(Settings(data_dir=tmp_path / "data", broker_id=1), RecordingSink(), Metrics(),
                             disk_id="disk", store=LocalObjectStore(tmp_path / "objects"), catalog=catalog,
                             clock=clock, migrate=False)
    assert not service.produce_calls.ack_deadline.allows(clock.monotonic())  # not joined
    await service.start()
    try:
        calls = service.produce_calls
        assert not calls.ack_deadline.allows(clock.monotonic()) and not service.may_acknowledge()  # not joined yet
        assert calls.admits_now() and service.admits_now()
        await service.resume(plan(0, epochs[0]), TopicConfig(), [])
        ack = calls.appended(TopicPartition("t", 0), appended(1, record()), True)
        assert ack is not None
        await settle(None, lambda: service.durable.due_in_s() is not None, "the block open")
        clock.advance(service.settings.block_max_age_ms / 1000)
        await clock.settle()
        assert await asyncio.wait_for(ack, 10) is AckOutcome.COMMITTED
        assert service.state.committed_seq(TopicPartition("t", 0)) == 1
    finally:
        await service.stop(clock.monotonic() + 5)
