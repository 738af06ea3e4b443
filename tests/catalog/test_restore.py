"""Restoring a catalog from the bucket (tiered.catalog.restore), on both backends."""

from __future__ import annotations

import pytest

from tiered.catalog import BlockState, SegmentState, UnknownPartition
from tiered.catalog.blocks import RunLocation, find_run, get_block, insert_pending_block, runs_for_range
from tiered.catalog import cluster
from tiered.catalog.brokers import list_brokers
from tiered.catalog.partitions import claim_partitions, get_partition_states
from tiered.catalog.restore import (
    PartitionBounds,
    RestoredBlock,
    catalog_is_empty,
    clear_catalog,
    insert_committed_blocks,
    insert_finished_segments,
    restore_partition_bounds,
)
from tiered.catalog.segments import find_remote_segment, get_segment, list_segments, segment_copy_started
from tiered.catalog.topics import create_topic, list_topics

from .rows import T0, minutes, run, segment
from .test_plans import explain, full_scans


def block(object_key, *runs, broker_id=3):
    return RestoredBlock(object_key, broker_id, sum(r.length_bytes for r in runs), T0, T0 + minutes(1), runs)


def bounds(cat):
    return {(s.topic, s.partition): (s.first_available_seq, s.hwmark_seq) for s in get_partition_states(cat)}


def test_empty_means_no_topic_block_or_segment(cat):
    assert catalog_is_empty(cat)
    cluster.register(cat, 1, "b1", "127.0.0.1:11011", "127.0.0.1:8080", 10_000, now=T0)
    assert catalog_is_empty(cat)  # brokers do not count: they register again on start
    insert_pending_block(cat, "blk/1", 1, 10, now=T0)
    assert not catalog_is_empty(cat)
    clear_catalog(cat)
    assert catalog_is_empty(cat)
    create_topic(cat, "t", 1)
    assert not catalog_is_empty(cat)


def test_clear_deletes_everything_but_brokers(cat):
    cluster.register(cat, 1, "b1", "127.0.0.1:11011", "127.0.0.1:8080", 10_000, now=T0)
    create_topic(cat, "t", 2)
    epoch = claim_partitions(cat, 1, "t", [0])[0]
    insert_committed_blocks(cat, [block("blk/1", run("t", 0, 1, 10), run("t", 1, 1, 5, 100))])
    segment_copy_started(cat, segment("t", 0, 1, 10, epoch), now=T0)
    clear_catalog(cat)
    assert catalog_is_empty(cat)
    assert list_topics(cat) == [] and get_partition_states(cat) == []
    assert find_run(cat, "t", 0, 1) is None and get_segment(cat, "t", 0, 1) is None
    assert [b.broker_id for b in list_brokers(cat)] == [1]
    create_topic(cat, "t", 2)  # the name is free again
    assert bounds(cat) == {("t", 0): (0, 0), ("t", 1): (0, 0)}


def test_committed_blocks_are_readable_without_a_leader(cat):
    create_topic(cat, "t", 2)  # no broker leads the partitions: a rebuild restores history, not a commit
    ids = insert_committed_blocks(
        cat,
        [block("blk/1", run("t", 0, 1, 10), run("t", 1, 1, 5, 100)), block("blk/2", run("t", 0, 11, 20), broker_id=4)],
    )
    assert len(ids) == 2 and ids[0] < ids[1]
    first = get_block(cat, ids[0])
    assert (first.state, first.broker_id, first.size_bytes, first.created_at, first.committed_at) == (
        BlockState.COMMITTED, 3, 200, T0, T0 + minutes(1))
    assert (first.delete_after, get_block(cat, ids[1]).broker_id) == (None, 4)
    assert find_run(cat, "t", 1, 1) == RunLocation("t", 1, 1, 1, 5, 100, 100, ids[0], "blk/1", 1_700_000_000_001,
                                                   1_700_000_000_005, 200)
    assert [(r.first_seq, r.object_key) for r in runs_for_range(cat, "t", 0, 1, 10)] == [(1, "blk/1"), (11, "blk/2")]
    assert bounds(cat) == {("t", 0): (0, 0), ("t", 1): (0, 0)}  # restore_partition_bounds sets them
    assert insert_committed_blocks(cat, []) == []


@pytest.mark.parametrize("bad", [block("blk/x"), block("blk/x", run("t", 0, 0, 5))], ids=["no runs", "seq 0"])
def test_committed_blocks_are_checked_first(cat, bad):
    create_topic(cat, "t", 1)
    with pytest.raises(ValueError):
        insert_committed_blocks(cat, [block("blk/ok", run("t", 0, 1, 10)), bad])
    assert find_run(cat, "t", 0, 1) is None  # nothing inserted, not even the good block


def test_finished_segments_are_readable_and_counted(cat):
    create_topic(cat, "t", 2)
    metas = [segment("t", 0, 1, 100, 0, 1000), segment("t", 0, 101, 200, 0, 500), segment("t", 1, 1, 50, 0, 300)]
    insert_finished_segments(cat, metas, now=T0)
    found = find_remote_segment(cat, "t", 0, 150)
    assert (found.base_seq, found.state, found.updated_at, found.object_key) == (
        101, SegmentState.COPY_FINISHED, T0, metas[1].object_key)
    assert [s.base_seq for s in list_segments(cat, "t", 0, states=(SegmentState.COPY_FINISHED,))] == [1, 101]
    remote = {s.partition: s.remote_bytes for s in get_partition_states(cat, "t")}
    assert remote == {0: 1100 + 550, 1: 330}  # objects and indexes
    insert_finished_segments(cat, [], now=T0)
    assert {s.partition: s.remote_bytes for s in get_partition_states(cat, "t")} == remote


def test_finished_segments_of_an_unknown_partition_insert_nothing(cat):
    create_topic(cat, "t", 1)
    with pytest.raises(UnknownPartition):
        insert_finished_segments(cat, [segment("t", 0, 1, 10, 0), segment("t", 1, 1, 10, 0)], now=T0)
    assert get_segment(cat, "t", 0, 1) is None
    assert get_partition_states(cat, "t")[0].remote_bytes == 0


def test_partition_bounds_are_set_as_given(cat):
    create_topic(cat, "t", 3)
    restore_partition_bounds(cat, [PartitionBounds("t", 0, 5, 90), PartitionBounds("t", 1, 1, 7)])
    assert bounds(cat) == {("t", 0): (5, 90), ("t", 1): (1, 7), ("t", 2): (0, 0)}
    restore_partition_bounds(cat, [PartitionBounds("t", 0, 1, 40), PartitionBounds("nope", 0, 1, 1)])
    assert bounds(cat)[("t", 0)] == (1, 40)  # a rebuild replaces them, downwards too
    restore_partition_bounds(cat, [])
    assert bounds(cat)[("t", 1)] == (1, 7)


def test_restore_writes_go_through_indexes(cat):
    create_topic(cat, "t", 2)
    calls = [
        lambda: insert_committed_blocks(cat, [block("blk/1", run("t", 0, 1, 10))]),
        lambda: insert_finished_segments(cat, [segment("t", 1, 1, 10, 0)], now=T0),
        lambda: restore_partition_bounds(cat, [PartitionBounds("t", 0, 1, 10)]),
    ]
    for call in calls:
        plans = explain(cat, call)
        assert plans
        for statement, plan in plans:
            assert full_scans(cat.backend, plan) == [], f"{statement}\n{plan}"
