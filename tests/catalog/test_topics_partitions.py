"""Topics, brokers and partitions queries, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tiered.catalog import TopicExists, UnknownPartition, UnknownTopic
from tiered.catalog import cluster
from tiered.catalog.brokers import BrokerRow, list_brokers
from tiered.catalog.partitions import (
    PartitionState, claim_partitions, get_partition_state, get_partition_states, set_first_available,
)
from tiered.catalog.topics import create_topic, get_topic, list_topics, update_topic_config

from .rows import T0


def test_create_topic_makes_its_partitions(cat):
    row = create_topic(cat, "orders", 3, "retention.segments.count=4\n", now=T0)
    assert (row.name, row.partitions, row.created_at) == ("orders", 3, T0)
    assert get_topic(cat, "orders") == row
    states = get_partition_states(cat, "orders")
    assert states == [PartitionState("orders", p, None, 0, 0, 0, 0) for p in range(3)]


def test_create_topic_twice_raises_and_keeps_the_first(cat):
    create_topic(cat, "orders", 2, "a=1", now=T0)
    with pytest.raises(TopicExists) as caught:
        create_topic(cat, "orders", 5, "b=2", now=T0)
    assert caught.value.topic == "orders"
    assert get_topic(cat, "orders").config_text == "a=1"
    assert len(get_partition_states(cat, "orders")) == 2


@pytest.mark.parametrize("partitions", [0, -1, 65536])
def test_create_topic_refuses_bad_partition_counts(cat, partitions):
    with pytest.raises(ValueError):
        create_topic(cat, "t", partitions)
    assert list_topics(cat) == []


def test_list_get_and_update_topics(cat):
    for name in ("b", "a", "c"):
        create_topic(cat, name, 1, now=T0)
    assert [t.name for t in list_topics(cat)] == ["a", "b", "c"]
    assert get_topic(cat, "zzz") is None
    update_topic_config(cat, "b", "produce.ack=local")
    assert get_topic(cat, "b").config_text == "produce.ack=local"
    with pytest.raises(UnknownTopic):
        update_topic_config(cat, "zzz", "x=1")


def test_partition_states_of_all_topics_in_order(cat):
    create_topic(cat, "b", 2)
    create_topic(cat, "a", 1)
    assert [(s.topic, s.partition) for s in get_partition_states(cat)] == [("a", 0), ("b", 0), ("b", 1)]


def test_brokers_as_registered_and_renewed_by_the_cluster_functions(cat):
    # Lease 0: the leases are not what is tested, and on SQLite another id's live lease would refuse the next one.
    cluster.register(cat, 2, "b2", "10.0.0.2:11011", "10.0.0.2:8080", 0, now=T0)
    cluster.register(cat, 1, "b1", "10.0.0.1:11011", "10.0.0.1:8080", 0, now=T0)
    assert cluster.renew(cat, 1, "b1", 0, now=T0 + timedelta(seconds=5))
    assert list_brokers(cat) == [
        BrokerRow(1, "10.0.0.1:11011", T0, T0 + timedelta(seconds=5)),
        BrokerRow(2, "10.0.0.2:11011", T0, T0),
    ]
    # A restart re-registers: new address, start time and incarnation, same row; the old incarnation renews no more.
    later = T0 + timedelta(hours=1)
    cluster.register(cat, 1, "b1-again", "10.0.0.9:11011", "10.0.0.9:8080", 0, now=later)
    assert list_brokers(cat)[0] == BrokerRow(1, "10.0.0.9:11011", later, later)
    assert not cluster.renew(cat, 1, "b1", 0, now=later)
    assert not cluster.renew(cat, 3, "b3", 0)  # never registered


def test_claim_bumps_epochs_and_sets_the_leader(cat):
    create_topic(cat, "t", 4)
    assert claim_partitions(cat, 1, "t", [2, 0]) == {0: 1, 2: 1}
    assert claim_partitions(cat, 2, "t", [0, 1]) == {0: 2, 1: 1}
    states = {s.partition: (s.leader_broker, s.leader_epoch) for s in get_partition_states(cat, "t")}
    assert states == {0: (2, 2), 1: (2, 1), 2: (1, 1), 3: (None, 0)}
    assert claim_partitions(cat, 1, "t", []) == {}


def test_claim_of_a_missing_partition_changes_nothing(cat):
    create_topic(cat, "t", 2)
    with pytest.raises(UnknownPartition) as caught:
        claim_partitions(cat, 1, "t", [0, 1, 2])
    assert (caught.value.topic, caught.value.partition) == ("t", 2)
    assert all(s.leader_epoch == 0 and s.leader_broker is None for s in get_partition_states(cat, "t"))
    with pytest.raises(UnknownPartition):
        claim_partitions(cat, 1, "nope", [0])


def test_first_available_only_moves_forward(cat):
    create_topic(cat, "t", 1)
    assert set_first_available(cat, "t", 0, 100) == 100
    assert set_first_available(cat, "t", 0, 50) == 100
    assert set_first_available(cat, "t", 0, 180) == 180
    assert get_partition_states(cat, "t")[0].first_available_seq == 180
    with pytest.raises(UnknownPartition):
        set_first_available(cat, "t", 1, 5)


def test_locking_partitions_of_one_topic_or_of_several_reads_the_same_rows(cat):
    """lock_partitions has a prebuilt statement for one topic (every block commit) beside the general one: both read
    the rows get_partition_states reads, and both refuse a partition that does not exist."""
    from tiered.catalog.partitions import lock_partitions

    create_topic(cat, "a", 3)
    create_topic(cat, "b", 2)
    claim_partitions(cat, 7, "a", [0, 2])
    want = {(s.topic, s.partition): s for s in get_partition_states(cat)}
    with cat.write() as conn:
        one = lock_partitions(conn, [("a", 2), ("a", 0), ("a", 2)])
        several = lock_partitions(conn, [("b", 1), ("a", 1), ("a", 0)])
    assert one == {k: want[k] for k in (("a", 0), ("a", 2))}
    assert several == {k: want[k] for k in (("a", 0), ("a", 1), ("b", 1))}
    for keys in ([("a", 3)], [("a", 0), ("a", 3)], [("a", 0), ("c", 0)]):
        with pytest.raises(UnknownPartition), cat.write() as conn:
            lock_partitions(conn, keys)


def test_one_partition_state_is_read_by_its_key(cat):
    create_topic(cat, "t", 3)
    claim_partitions(cat, 4, "t", [1])
    one = get_partition_state(cat, "t", 1)
    assert one == [s for s in get_partition_states(cat, "t") if s.partition == 1][0]
    assert (one.leader_broker, one.leader_epoch) == (4, 1)
    assert get_partition_state(cat, "t", 3) is None and get_partition_state(cat, "nope", 0) is None
