"""The change counter the coordinators look at (migration 0006, tiered.catalog.cluster.look) and each partition's
change version (0012, `changed_since`): every change a cluster decision depends on moves them, in the changing
transaction; a commit that only raises high-water marks does not (the idle cluster and the block path pay nothing
for it). On both backends."""

from __future__ import annotations

from tiered.catalog.blocks import commit_block, insert_pending_block
import pytest
from sqlalchemy.exc import OperationalError

from tiered.catalog.changes import take_version
from tiered.catalog.cluster import assign, assignment, changed_since, look, register, request_handover
from tiered.catalog.partitions import claim_partitions, set_first_available
from tiered.catalog.topics import create_topic, update_topic_config

from .rows import run, stamped


def changes(cat) -> int:
    return look(cat).changes or 0  # no row yet: an emptied catalog counts from its next change


def test_each_change_a_decision_depends_on_moves_the_counter(cat):
    before = changes(cat)
    create_topic(cat, "t", 2)
    after_create = changes(cat)
    assert after_create > before
    epochs = {("t", p): e for p, e in claim_partitions(cat, 1, "t", [0, 1]).items()}
    after_claim = changes(cat)
    assert after_claim > after_create
    assert request_handover(cat, "t", 0, 2)
    after_handover = changes(cat)
    assert after_handover > after_claim
    assert assign(cat, "t", {0: 2}) == [0]
    after_assign = changes(cat)
    assert after_assign > after_handover
    update_topic_config(cat, "t", "retention.segments.count=4\n")
    after_config = changes(cat)
    assert after_config > after_assign

    # A commit raises the high-water marks (and sets the first available seq of a partition that had none):
    # no bump, so a follower learns of it when a read needs it (tiered.catalog.cluster.assignment).
    block = insert_pending_block(cat, "blocks/1", 1, 200)
    commit_block(cat, block, 1, stamped([run("t", 1, 1, 10)], epochs), epochs)
    block = insert_pending_block(cat, "blocks/2", 1, 200)
    commit_block(cat, block, 1, stamped([run("t", 1, 11, 20)], epochs), epochs)
    assert changes(cat) == after_config
    assert assignment(cat, "t", 1).hwmark_seq == 20
    assert assignment(cat, "t", 9) is None

    # Retention moving the first available seq is a change a follower must not miss.
    assert set_first_available(cat, "t", 1, 11) == 11
    assert changes(cat) > after_config


def test_look_reads_the_members_and_the_counter(cat):
    assert look(cat).members == ()
    register(cat, 1, "i1", "127.0.0.1:1", "", 10_000)
    seen = look(cat)
    assert [(m.broker_id, m.advertised, m.live) for m in seen.members] == [(1, "127.0.0.1:1", True)]
    create_topic(cat, "t", 1)
    assert look(cat).changes == changes(cat) > 0


def test_a_claim_of_many_partitions_counts_once_and_other_moves_still_count(cat):
    """A claim takes one version for all its rows, and the row trigger skips them (they carry a version of their
    own, migration 0012); an update that leaves the version alone is versioned per row."""
    create_topic(cat, "t", 300)
    before = changes(cat)
    claim_partitions(cat, 1, "t", range(300))
    claimed = changes(cat)
    assert claimed - before == 1
    assert request_handover(cat, "t", 5, 2)
    assert changes(cat) == claimed + 1


def test_assign_moves_only_what_is_still_as_expected_in_one_count(cat):
    create_topic(cat, "t", 4)
    epochs = claim_partitions(cat, 1, "t", range(4))
    claim_partitions(cat, 3, "t", [2])  # claimed by broker 3 since: no longer as the handover expects
    before = changes(cat)
    done = assign(cat, "t", {0: 2, 1: 2, 2: 2, 3: None, 9: 2},
                  expected={0: (1, epochs[0]), 1: (1, epochs[1] - 1), 2: (1, epochs[2]), 9: (1, 1)})
    assert done == [0, 3]  # 1: another epoch expected; 2: another leader; 3: unchecked; 9: no such partition
    assert [assignment(cat, "t", p).leader_broker for p in range(4)] == [2, 1, 3, None]
    assert changes(cat) - before == 1
    assert assign(cat, "t", {1: 2}, expected={1: (3, 0)}) == [] and changes(cat) - before <= 2


def test_members_carry_where_plaintext_clients_reach_them(cat):
    from tiered.catalog.cluster import members

    # Leases of 0: expired at once, so that SQLite takes a second broker.
    register(cat, 1, "i1", "127.0.0.1:1", "", 0, advertised_plain="127.0.0.1:2")
    register(cat, 2, "i2", "127.0.0.1:3", "", 0)  # no plaintext endpoint (or a broker older than 0008)
    for seen in (look(cat).members, members(cat)):
        assert [(m.broker_id, m.advertised, m.advertised_plain) for m in seen] == [
            (1, "127.0.0.1:1", "127.0.0.1:2"), (2, "127.0.0.1:3", "")]
    register(cat, 1, "i1b", "127.0.0.1:1", "", 0)  # a restart without the plaintext listener forgets it
    assert [m.advertised_plain for m in members(cat)] == ["", ""]


def test_claimed_since_names_only_the_partitions_whose_epoch_moved_on(cat):
    from tiered.catalog.cluster import claimed_since

    create_topic(cat, "t", 3)
    create_topic(cat, "u", 1)
    claim_partitions(cat, 2, "t", [1])
    claim_partitions(cat, 3, "u", [0])
    moved = claimed_since(cat, {("t", 0): 0, ("t", 1): 0, ("t", 2): 0, ("u", 0): 1, ("v", 0): 0})
    assert [(a.topic, a.partition, a.leader_broker, a.leader_epoch) for a in moved] == [("t", 1, 2, 1)]
    assert claimed_since(cat, {}) == []


def test_assign_moves_across_topics_in_one_transaction_counted_once(cat):
    from tiered.catalog.cluster import assign_moves

    create_topic(cat, "t", 2)
    create_topic(cat, "u", 2)
    epochs = {("t", p): e for p, e in claim_partitions(cat, 1, "t", [0, 1]).items()}
    epochs.update({("u", p): e for p, e in claim_partitions(cat, 1, "u", [0, 1]).items()})
    before = changes(cat)
    done = assign_moves(cat, {key: 2 for key in epochs},
                        expected={**{key: (1, e) for key, e in epochs.items()}, ("u", 1): (3, epochs[("u", 1)])})
    assert done == [("t", 0), ("t", 1), ("u", 0)]  # u/1 is not led by broker 3
    assert changes(cat) - before == 1


def changed(cat, since: int) -> list[tuple[str, int, int | None, int, int | None]]:
    return sorted((a.topic, a.partition, a.leader_broker, a.leader_epoch, a.handover_to)
                  for a in changed_since(cat, since))


def test_changed_since_names_each_partition_every_kind_of_change_touched(cat):
    """Creation, claims, handover requests, assignments and retention's first available seq each give the rows they
    change a version above what a reader saw; commits give none, and rows not touched never come back."""
    create_topic(cat, "t", 3)
    create_topic(cat, "u", 2)
    assert [a[:2] for a in changed(cat, 0)] == [("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)]
    seen = changes(cat)
    assert changed(cat, seen) == []
    epochs = {("t", p): e for p, e in claim_partitions(cat, 1, "t", [0, 1]).items()}
    assert changed(cat, seen) == [("t", 0, 1, 1, None), ("t", 1, 1, 1, None)]
    seen = changes(cat)
    block = insert_pending_block(cat, "blocks/1", 1, 200)
    commit_block(cat, block, 1, stamped([run("t", 1, 1, 10)], epochs), epochs)
    assert changed(cat, seen) == []  # a commit moves no version
    assert request_handover(cat, "t", 1, 2)
    assert changed(cat, seen) == [("t", 1, 1, 1, 2)]
    seen = changes(cat)
    assert assign(cat, "u", {1: 3}) == [1]
    assert changed(cat, seen) == [("u", 1, 3, 0, None)]
    seen = changes(cat)
    assert set_first_available(cat, "t", 1, 5) == 5
    assert changed(cat, seen) == [("t", 1, 1, 1, 2)]
    assert changed(cat, changes(cat)) == []


def test_a_version_is_taken_only_once_the_transaction_before_it_committed(cat, catalog_url):
    """Versions are in commit order (tiered.catalog.changes): the transaction holding version v keeps the counter row
    until it ends, so no other takes v + 1 before v is visible, and a reader that read the counter at V has every
    row up to V. A sequence would not: the transaction that took 10 could commit after the one that took 11, and a
    reader that remembered 11 would never see 10."""
    if cat.backend != "postgresql" or cat.pooled:
        pytest.skip("the counter row's lock is PostgreSQL's (SQLite has one writer; PgBouncer: the same server)")
    create_topic(cat, "t", 2)
    seen = changes(cat)
    first = cat.engine.connect()
    second = cat.engine.connect()
    try:
        with first.begin():
            first.exec_driver_sql("UPDATE partitions SET leader_broker = 1, change_version = %s "
                                  "WHERE topic = 't' AND partition = 0", (take_version(first),))
            # While the first is open, the second cannot take a version (it would wait for the first's commit).
            with second.begin():
                second.exec_driver_sql("SET LOCAL lock_timeout = '50ms'")
                with pytest.raises(OperationalError):
                    take_version(second)
            # A reader meanwhile sees neither the counter moved nor the row.
            assert changes(cat) == seen and changed(cat, seen) == []
        with second.begin():
            version = take_version(second)
            second.exec_driver_sql("UPDATE partitions SET leader_broker = 2, change_version = %s "
                                   "WHERE topic = 't' AND partition = 1", (version,))
        assert version == seen + 2
    finally:
        first.close()
        second.close()
    assert changes(cat) == seen + 2
    assert changed(cat, seen) == [("t", 0, 1, 0, None), ("t", 1, 2, 0, None)]
    assert changed(cat, seen + 1) == [("t", 1, 2, 0, None)]


def test_full_look_reads_the_topics_and_the_assignments_in_one_snapshot(cat, monkeypatch):
    """A topic created between its two statements is in neither: every assignment's topic is among the topics (the
    coordinator tells the server the topics before it decides about their partitions)."""
    from tiered.catalog import cluster

    create_topic(cat, "t", 2)
    read_topics = cluster.topic_rows

    def then_another_broker_creates_u(conn):
        rows = read_topics(conn)
        create_topic(cat, "u", 1)  # its own connection and transaction, committed before the assignments are read
        return rows

    monkeypatch.setattr(cluster, "topic_rows", then_another_broker_creates_u)
    topics, assignments = cluster.full_look(cat)
    assert [t.name for t in topics] == ["t"]
    assert [(a.topic, a.partition) for a in assignments] == [("t", 0), ("t", 1)]
    monkeypatch.setattr(cluster, "topic_rows", read_topics)
    topics, assignments = cluster.full_look(cat)
    assert [t.name for t in topics] == ["t", "u"] and [a.topic for a in assignments] == ["t", "t", "u"]
