"""A committed block's runs are expanded into block_runs after the acknowledgements (tiered.tiering.blocks.
block_pipeline): by the committing broker right away, or, when it stopped in between, by the sweep of any broker.
The acked seqs are readable at every moment in between, from any broker's catalog."""

from __future__ import annotations

import asyncio

from tiered.catalog import Catalog
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import topics as catalog_topics
from tiered.catalog.check import check_catalog
from tiered.catalog.locate import InRun, locate
from tiered.clock import utc_now
from tiered.metrics import Metrics
from tiered.tier_interface import AckOutcome
from tiered.tiering.blocks.block_pipeline import EXPANSION_SWEEP_AGE, BlockPipeline
from tiered.tiering.blocks.durable import DurablePath
from tiered.tiering.catalog_access import AsyncCatalog
from tiered.tiering.objects.local_store import LocalObjectStore
from tiered.topic_partition import TopicPartition

from tests.catalog.rows import run
from tests.support.clock import ManualClock
from tests.tiering.tier_state import led_state
from tests.tiering.test_durable_path import RecordingSink, appended, record


def pipeline_of(acat: AsyncCatalog, broker_id: int, clock: ManualClock, tmp_path) -> BlockPipeline:
    return BlockPipeline(LocalObjectStore(tmp_path / f"objects{broker_id}", fsync=False), acat, broker_id,
                         metrics=Metrics(), on_committed=lambda runs: None, on_fenced=lambda *args: None,
                         grace=catalog_blocks.DEFAULT_DELETE_GRACE, clock=clock)


async def test_a_block_left_unexpanded_by_a_crash_is_readable_then_swept_by_another_broker(cat, catalog_url, tmp_path):
    """Broker 1 commits a block of two partitions and dies before expanding it; broker 2, on a catalog connection of
    its own, reads both partitions' seqs from the block's row, and its sweep expands the block once it is older
    than EXPANSION_SWEEP_AGE, leaving the same locations."""
    clock = ManualClock()
    catalog_topics.create_topic(cat, "t", 2)
    epochs = {("t", p): e for p, e in catalog_partitions.claim_partitions(cat, 1, "t", [0, 1]).items()}
    block_id = catalog_blocks.insert_pending_block(cat, "blk/1", 1, 300, now=utc_now(clock))
    runs = [run("t", 0, 1, 10, epoch=epochs["t", 0]), run("t", 1, 1, 3, 100, epoch=epochs["t", 1])]
    catalog_blocks.commit_block(cat, block_id, 1, runs, epochs, now=utc_now(clock), expand=False)  # then dies

    other = Catalog.open(catalog_url)
    acat = AsyncCatalog(other)
    try:
        before = [locate(other, "t", 0, 5), locate(other, "t", 1, 3)]
        assert all(isinstance(where, InRun) and where.run.block_id == block_id for where in before)
        sweeper = pipeline_of(acat, 2, clock, tmp_path)
        assert await sweeper.expand_stale() == 0  # just committed: its broker may still be expanding it
        clock.advance(EXPANSION_SWEEP_AGE.total_seconds() + 1)
        assert await sweeper.expand_stale() == 2
        assert await sweeper.expand_stale() == 0
        after = [locate(other, "t", 0, 5), locate(other, "t", 1, 3)]
        assert after == before
        assert catalog_blocks.unexpanded_blocks(other, utc_now(clock)) == []
        assert check_catalog(other).ok, check_catalog(other).problems
    finally:
        acat.shutdown()
        other.close()


async def test_the_committing_broker_expands_its_block_after_the_ack(cat, acat, tmp_path, monkeypatch):
    """Through the durable path: the ack is answered, and the block's runs then reach block_runs (on PostgreSQL by
    the expansion after the ack, here for a block of any size; on SQLite inside the commit), nothing left for the
    sweep."""
    monkeypatch.setattr(catalog_blocks, "EXPAND_IN_COMMIT_RUNS", 0)
    clock = ManualClock()
    catalog_topics.create_topic(cat, "t", 2)
    epochs = catalog_partitions.claim_partitions(cat, 1, "t", [0, 1])
    state = led_state({("t", p): epoch for p, epoch in epochs.items()})
    durable = DurablePath(LocalObjectStore(tmp_path / "objects", fsync=False), acat, 1, RecordingSink(), state=state,
                          metrics=Metrics(), max_bytes=1, max_age_ms=250, grace=catalog_blocks.DEFAULT_DELETE_GRACE,
                          clock=clock)
    for p in epochs:
        durable.lead(TopicPartition("t", p))
    timer = asyncio.ensure_future(durable.block_timer())
    try:
        ack = durable.appended(TopicPartition("t", 0), appended(1, record()), durable=True)
        assert await asyncio.wait_for(ack, 10) is AckOutcome.COMMITTED
        for _ in range(400):
            with cat.read() as conn:
                if not catalog_blocks.pending_runs(conn):
                    break
            await asyncio.sleep(0.01)
        with cat.read() as conn:
            assert catalog_blocks.pending_runs(conn) == []
        found = catalog_blocks.find_run(cat, "t", 0, 1)
        assert found is not None and found.holds(1)
        assert check_catalog(cat).ok, check_catalog(cat).problems
    finally:
        timer.cancel()
        await durable.stop()
