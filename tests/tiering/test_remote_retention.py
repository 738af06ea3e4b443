"""Remote retention against moto's S3 server and both catalog backends, on a fake clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tiered.catalog import SegmentState
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import RunRow
from tiered.catalog.segments import SegmentMeta
from tiered.storage.topic_config import TopicConfig
from tiered.tiering.objects import keys
from tiered.tiering.segments.remote_retention import enforce_remote_retention
from tiered.tiering.objects.store import ObjectNotFound, StoreError

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
BROKER = 1
TOPIC = "logs"
# Three remote segments of seqs 1-10, 11-20, 21-30, frozen an hour apart; 1100 bytes each (.ilog and .index).
SEGMENTS = [(1, 10, T0), (11, 20, T0 + timedelta(hours=1)), (21, 30, T0 + timedelta(hours=2))]
ILOG_BYTES, INDEX_BYTES = 1000, 100


async def _history(store, cat) -> dict[int, SegmentMeta]:
    """A partition whose three segments are COPY_FINISHED with their objects in the bucket, and whose block runs for
    seqs 1..35 are still in the catalog: runs that no segment pruned (a catalog from before copies pruned in their own
    transaction): retention's prune below the first available seq is what removes them."""
    catalog_topics.create_topic(cat, TOPIC, 1, now=T0)
    epoch = catalog_partitions.claim_partitions(cat, BROKER, TOPIC, [0])[0]
    metas = {}
    for base, last, frozen in SEGMENTS:
        freeze_s = int(frozen.timestamp())
        meta = SegmentMeta(
            TOPIC, 0, base, last, keys.segment_key(TOPIC, 0, base, last, freeze_s),
            keys.segment_index_key(TOPIC, 0, base, last, freeze_s), ILOG_BYTES, INDEX_BYTES, 1, 2, frozen, epoch,
        )  # fmt: skip
        catalog_segments.segment_copy_started(cat, meta, now=frozen)
        await store.put(meta.object_key, b"i" * ILOG_BYTES)
        await store.put(meta.index_object_key, b"x" * INDEX_BYTES)
        catalog_segments.segment_copy_finished(cat, TOPIC, 0, base, epoch, now=frozen)
        metas[base] = meta
    for first, last in ((1, 10), (11, 20), (21, 30), (31, 35)):
        block_id = catalog_blocks.insert_pending_block(cat, f"blocks/{first}.blk", BROKER, 100, now=T0)
        run = RunRow(TOPIC, 0, first, first, last, last - first + 1, 1, 2, epoch, 0, 100)
        catalog_blocks.commit_block(cat, block_id, BROKER, [run], {(TOPIC, 0): epoch}, now=T0)
    return metas


async def _exists(store, object_key: str) -> bool:
    try:
        await store.head(object_key)
        return True
    except ObjectNotFound:
        return False


def _state(cat) -> catalog_partitions.PartitionState:
    return catalog_partitions.get_partition_states(cat, TOPIC)[0]


def _states(cat) -> dict[int, str]:
    return {s.base_seq: s.state for s in catalog_segments.list_segments(cat, TOPIC, 0)}


async def test_segments_expire_by_age_from_their_freeze_time(s3_store, cat, acat):
    metas = await _history(s3_store, cat)
    config = TopicConfig(remote_retention_secs=90 * 60)

    early = await enforce_remote_retention(s3_store, acat, TOPIC, 0, config, T0 + timedelta(minutes=89))
    assert early.deleted == [] and early.runs_pruned == 0 and early.first_available_seq == 1

    # At 2h01 only the first segment (frozen at 0h00) is older than 90 minutes; the one frozen at 1h00 is not.
    report = await enforce_remote_retention(s3_store, acat, TOPIC, 0, config, T0 + timedelta(hours=2, minutes=1))
    assert [s.base_seq for s in report.deleted] == [1]
    assert report.first_available_seq == 11 and not report.more
    assert _states(cat) == {1: SegmentState.DELETE_FINISHED, 11: SegmentState.COPY_FINISHED,
                            21: SegmentState.COPY_FINISHED}
    state = _state(cat)
    assert (state.first_available_seq, state.hwmark_seq, state.remote_bytes) == (11, 35, 2 * 1100)
    for base, meta in metas.items():
        for object_key in (meta.object_key, meta.index_object_key):
            assert await _exists(s3_store, object_key) == (base != 1), object_key
    # The block run below the new first available seq went with it; its block waits for the sweeper.
    assert report.runs_pruned == 1 and report.blocks_marked == 1
    assert catalog_blocks.find_run(cat, TOPIC, 0, 1).first_seq == 11
    marked = catalog_blocks.blocks_to_sweep(cat, T0 + timedelta(days=1), 10)
    assert [b.object_key for b in marked] == ["blocks/1.blk"]

    # A later pass at the same time has nothing left to do, and writes nothing.
    statements = cat.statements
    again = await enforce_remote_retention(s3_store, acat, TOPIC, 0, config, T0 + timedelta(hours=2, minutes=1))
    assert again.deleted == [] and again.finished == [] and again.first_available_seq == 11
    assert cat.statements - statements <= 4  # leftovers, expiry scan, partition read, one run probe


async def test_segments_expire_by_bytes_oldest_first(s3_store, cat, acat):
    metas = await _history(s3_store, cat)
    # 3300 bytes held, at most 1500 allowed: the two oldest go (2200, then 1100 <= 1500 stops).
    report = await enforce_remote_retention(s3_store, acat, TOPIC, 0, TopicConfig(remote_retention_bytes=1500), T0)
    assert [s.base_seq for s in report.deleted] == [1, 11]
    assert report.deleted_bytes == 2200
    state = _state(cat)
    assert (state.first_available_seq, state.remote_bytes) == (21, 1100)
    assert [await _exists(s3_store, metas[b].object_key) for b in (1, 11, 21)] == [False, False, True]
    assert [await _exists(s3_store, metas[b].index_object_key) for b in (1, 11, 21)] == [False, False, True]
    assert report.runs_pruned == 2
    assert catalog_blocks.find_run(cat, TOPIC, 0, 1).first_seq == 21


async def test_the_last_segment_expiring_moves_first_available_past_it(s3_store, cat, acat):
    await _history(s3_store, cat)
    config = TopicConfig(remote_retention_secs=60)
    report = await enforce_remote_retention(s3_store, acat, TOPIC, 0, config, T0 + timedelta(days=1))
    assert [s.base_seq for s in report.deleted] == [1, 11, 21]
    # No remote segment left: the history starts right after the last one, in the block run of 31..35.
    assert report.first_available_seq == 31 and _state(cat).remote_bytes == 0
    assert catalog_blocks.find_run(cat, TOPIC, 0, 1).first_seq == 31


async def test_first_available_never_moves_back(s3_store, cat, acat):
    await _history(s3_store, cat)
    catalog_partitions.set_first_available(cat, TOPIC, 0, 25)  # e.g. moved by an earlier, larger expiry
    report = await enforce_remote_retention(s3_store, acat, TOPIC, 0, TopicConfig(remote_retention_bytes=2500), T0)
    assert [s.base_seq for s in report.deleted] == [1]
    assert report.first_available_seq == 25 == _state(cat).first_available_seq


async def test_a_pass_is_bounded_and_the_next_one_continues(s3_store, cat, acat):
    await _history(s3_store, cat)
    config = TopicConfig(remote_retention_secs=60)
    now = T0 + timedelta(days=1)
    first = await enforce_remote_retention(s3_store, acat, TOPIC, 0, config, now, limit=2)
    assert [s.base_seq for s in first.deleted] == [1, 11] and first.more
    assert first.first_available_seq == 21
    second = await enforce_remote_retention(s3_store, acat, TOPIC, 0, config, now, limit=2)
    assert [s.base_seq for s in second.deleted] == [21] and not second.more
    assert second.first_available_seq == 31


async def test_no_limit_configured_deletes_nothing(s3_store, cat, acat):
    await _history(s3_store, cat)
    report = await enforce_remote_retention(s3_store, acat, TOPIC, 0, TopicConfig(), T0 + timedelta(days=3650))
    assert report.deleted == [] and report.runs_pruned == 0
    assert set(_states(cat).values()) == {SegmentState.COPY_FINISHED}


async def test_a_crash_after_delete_started_is_finished_by_the_next_pass(s3_store, s3_faults, cat, acat):
    metas = await _history(s3_store, cat)
    config = TopicConfig(remote_retention_bytes=2500)
    # Every attempt of the DeleteObjects request fails: the pass dies between DELETE_STARTED and the deletion.
    s3_faults.fail_next(3, 500, match=lambda method, path: method == "POST" and "delete" in path)
    with pytest.raises(StoreError):
        await enforce_remote_retention(s3_store, acat, TOPIC, 0, config, T0)
    assert _states(cat)[1] == SegmentState.DELETE_STARTED
    assert await _exists(s3_store, metas[1].object_key)
    state = _state(cat)
    assert (state.first_available_seq, state.remote_bytes) == (11, 2200)  # moved before the segment went away

    # The retention limit is lifted meanwhile: nothing new expires, but the interrupted deletion is completed.
    report = await enforce_remote_retention(s3_store, acat, TOPIC, 0, TopicConfig(), T0 + timedelta(minutes=1))
    assert [s.base_seq for s in report.finished] == [1] and report.deleted == []
    assert _states(cat)[1] == SegmentState.DELETE_FINISHED
    assert not await _exists(s3_store, metas[1].object_key)
    assert not await _exists(s3_store, metas[1].index_object_key)
    assert await _exists(s3_store, metas[11].object_key)
    assert report.first_available_seq == 11 and report.runs_pruned == 1
