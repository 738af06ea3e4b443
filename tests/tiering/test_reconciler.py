"""The orphan reconciler, the block sweeper and stale intent rows, against moto's S3 server and both catalogs.

Object times come from the S3 server's clock (LastModified, whole seconds), so the fake `now` handed to the
reconciler is placed relative to the objects' own times.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import cluster as catalog_cluster
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import RunRow
from tiered.catalog.segments import SegmentMeta
from tiered.tiering.objects import keys
from tiered.tiering.recovery.reconciler import abandon_stale_pending, is_our_key, reconcile, sweep_deleted_blocks
from tiered.tiering.objects.store import ObjectNotFound

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
GRACE = timedelta(minutes=10)


def _block_key(broker_id: int = 1) -> str:
    return keys.block_key(broker_id, keys.new_block_id(int(T0.timestamp() * 1000)))


async def _exists(store, object_key: str) -> bool:
    try:
        await store.head(object_key)
        return True
    except ObjectNotFound:
        return False


async def _committed_block(store, cat, first: int, last: int, *, now: datetime = T0) -> tuple[int, str]:
    object_key = _block_key()
    await store.put(object_key, b"block %d-%d" % (first, last))
    block_id = catalog_blocks.insert_pending_block(cat, object_key, 1, 20, now=now)
    epoch = catalog_partitions.get_partition_states(cat, "t")[0].leader_epoch
    run = RunRow("t", 0, first, first, last, last - first + 1, 1, 2, epoch, 0, 20)
    catalog_blocks.commit_block(cat, block_id, 1, [run], {("t", 0): epoch}, now=now)
    return block_id, object_key


def _topic(cat) -> int:
    catalog_topics.create_topic(cat, "t", 1, now=T0)
    return catalog_partitions.claim_partitions(cat, 1, "t", [0])[0]


async def test_the_reconciler_deletes_old_orphans_and_nothing_else(s3_store, cat, acat):
    epoch = _topic(cat)
    _, committed = await _committed_block(s3_store, cat, 1, 10)
    pending = _block_key()
    catalog_blocks.insert_pending_block(cat, pending, 1, 5, now=T0)
    await s3_store.put(pending, b"uploaded, commit in flight")
    segment = keys.segment_key("t", 0, 1, 10, 1_700_000_000)
    index = keys.segment_index_key("t", 0, 1, 10, 1_700_000_000)
    catalog_segments.segment_copy_started(cat, SegmentMeta(
        "t", 0, 1, 10, segment, index, 7, 5, 1, 2, T0, epoch), now=T0)  # fmt: skip
    await s3_store.put(segment, b"segment")
    await s3_store.put(index, b"index")
    foreign = "notes/readme.txt"  # not one of our key formats: never ours to delete
    await s3_store.put(foreign, b"hello")
    orphans = [
        _block_key(3),  # an upload whose intent row is gone
        keys.segment_key("t", 0, 11, 20, 1_700_000_100),  # a copy that was never recorded
        keys.segment_index_key("t", 0, 11, 20, 1_700_000_100),
    ]
    for object_key in orphans:
        await s3_store.put(object_key, b"orphan")
    await asyncio.sleep(1.1)  # LastModified has whole seconds: the next object is at least a second younger
    young = _block_key(4)
    await s3_store.put(young, b"intent row about to be written")

    listing = {i.object_key: i.last_modified async for i in s3_store.list()}
    newest_old = max(t for k, t in listing.items() if k != young)
    now = listing[young]
    grace = (listing[young] - newest_old) / 2  # old objects are past the grace period, the young one is not

    deleted, listed, pages, start_after = [], 0, 0, None
    while True:  # a page of 3 at a time, as a bounded background scan goes through the bucket
        report = await reconcile(s3_store, acat, now, grace=grace, start_after=start_after, limit=3)
        deleted += report.deleted
        listed += report.listed
        pages += 1
        start_after = report.next_start_after
        if start_after is None:
            break
    assert listed == len(listing) == 9 and pages == 4  # three full pages, then an empty one
    assert sorted(deleted) == sorted(orphans)
    remaining = {i.object_key async for i in s3_store.list()}
    assert remaining == {committed, pending, segment, index, foreign, young}

    # With real time passing, the young orphan is eventually collected too, and the known objects still are not.
    report = await reconcile(s3_store, acat, now + timedelta(minutes=1), grace=grace)
    assert report.deleted == [young] and report.next_start_after is None


def test_our_key_formats():
    assert is_our_key(_block_key())
    assert is_our_key(keys.segment_key("t", 3, 1, 2, 5)) and is_our_key(keys.segment_index_key("t", 3, 1, 2, 5))
    for other in ("blocks/zzzz/1/x.blk", "segments/t/0/1-2_3.ilog", "backup/catalog.sql", "blocks/"):
        assert not is_our_key(other), other


async def test_the_sweeper_honours_delete_after(s3_store, cat, acat):
    _topic(cat)
    blocks = [await _committed_block(s3_store, cat, f, f + 9) for f in (1, 11, 21)]
    # The runs of the first two are covered by a remote segment: their blocks are marked, 10 minutes of grace.
    catalog_blocks.prune_runs_below(cat, "t", 0, 21, grace=GRACE, now=T0)

    assert await sweep_deleted_blocks(s3_store, acat, T0 + GRACE - timedelta(seconds=1)) == []
    assert all([await _exists(s3_store, k) for _, k in blocks])

    swept = await sweep_deleted_blocks(s3_store, acat, T0 + GRACE, limit=1)  # bounded: one at a time
    assert [b.block_id for b in swept] == [blocks[0][0]]
    swept += await sweep_deleted_blocks(s3_store, acat, T0 + GRACE, limit=10)
    assert [b.object_key for b in swept] == [blocks[0][1], blocks[1][1]]
    assert [await _exists(s3_store, k) for _, k in blocks] == [False, False, True]
    assert [catalog_blocks.get_block(cat, i) is None for i, _ in blocks] == [True, True, False]
    assert await sweep_deleted_blocks(s3_store, acat, T0 + timedelta(days=1)) == []


async def test_stale_pending_blocks_are_abandoned_only_when_their_broker_cannot_commit(s3_store, cat, acat):
    now = T0 + timedelta(minutes=55)

    def register(broker_id: int, address: str, at: datetime) -> None:
        # Lease 0: liveness here is the heartbeat time; on SQLite another id's live lease would refuse the next one.
        catalog_cluster.register(cat, broker_id, address, address, "", 0, now=at)

    def renew(broker_id: int, address: str, at: datetime) -> None:
        assert catalog_cluster.renew(cat, broker_id, address, 0, now=at)

    register(1, "alive:1", T0 - timedelta(hours=1))
    renew(1, "alive:1", now - timedelta(seconds=5))
    register(2, "restarted:1", T0 + timedelta(minutes=30))
    register(4, "silent:1", T0 - timedelta(hours=1))
    renew(4, "silent:1", T0 + timedelta(minutes=10))

    def pending(broker_id: int, created: datetime) -> tuple[int, str]:
        object_key = _block_key(broker_id)
        return catalog_blocks.insert_pending_block(cat, object_key, broker_id, 6, now=created), object_key

    kept_alive = pending(1, T0)  # old, but its broker is alive and retries the commit as long as it runs
    restarted = pending(2, T0)  # its broker restarted since: the new incarnation re-uploaded the records
    unknown = pending(3, T0)  # no such broker
    silent = pending(4, T0)  # its broker stopped heartbeating 45 minutes ago
    young = pending(3, now - timedelta(minutes=5))
    for _, object_key in (kept_alive, restarted, unknown, silent, young):
        await s3_store.put(object_key, b"object")

    abandoned = await abandon_stale_pending(acat, now, grace=GRACE, limit=10)
    assert sorted(b.block_id for b in abandoned) == sorted(b for b, _ in (restarted, unknown, silent))
    states = {b: catalog_blocks.get_block(cat, b).state for b, _ in (kept_alive, restarted, unknown, silent, young)}
    assert states == {kept_alive[0]: "pending", restarted[0]: "deleting", unknown[0]: "deleting",
                      silent[0]: "deleting", young[0]: "pending"}
    # The objects go in the second phase, a grace period later.
    assert await sweep_deleted_blocks(s3_store, acat, now) == []
    swept = await sweep_deleted_blocks(s3_store, acat, now + GRACE)
    assert sorted(b.object_key for b in swept) == sorted(k for _, k in (restarted, unknown, silent))
    assert [await _exists(s3_store, k) for _, k in (kept_alive, restarted, unknown, silent, young)] == [
        True, False, False, False, True]  # fmt: skip
    assert await abandon_stale_pending(acat, now, grace=GRACE) == []


async def test_a_pending_block_whose_commit_landed_is_not_abandoned(s3_store, cat, acat):
    _topic(cat)
    block_id, object_key = await _committed_block(s3_store, cat, 1, 5)
    assert await abandon_stale_pending(acat, T0 + timedelta(days=1), grace=GRACE) == []
    assert catalog_blocks.get_block(cat, block_id).state == "committed"
