"""The change counter the coordinators look at (migration 0006, tiered.catalog.cluster.look): every change a
cluster decision depends on moves it, in the changing transaction; a commit that only raises high-water marks does
not (the idle cluster and the block path pay nothing for it). On both backends."""

from __future__ import annotations

from tiered.catalog.blocks import commit_block, insert_pending_block
from tiered.catalog.cluster import assign, assignment, look, register, request_handover
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
    """PostgreSQL: a claim bumps the counter itself, once, and the row trigger skips its rows (migration 0010);
    an update outside such a transaction still counts per row. SQLite counts every row."""
    create_topic(cat, "t", 300)
    before = changes(cat)
    claim_partitions(cat, 1, "t", range(300))
    claimed = changes(cat)
    assert claimed - before == (1 if cat.backend == "postgresql" else 300)
    assert request_handover(cat, "t", 5, 2)
    assert changes(cat) == claimed + 1  # the setting was the claim transaction's only


def test_assign_moves_only_what_is_still_as_expected_in_one_count(cat):
    create_topic(cat, "t", 4)
    epochs = claim_partitions(cat, 1, "t", range(4))
    claim_partitions(cat, 3, "t", [2])  # claimed by broker 3 since: no longer as the handover expects
    before = changes(cat)
    done = assign(cat, "t", {0: 2, 1: 2, 2: 2, 3: None, 9: 2},
                  expected={0: (1, epochs[0]), 1: (1, epochs[1] - 1), 2: (1, epochs[2]), 9: (1, 1)})
    assert done == [0, 3]  # 1: another epoch expected; 2: another leader; 3: unchecked; 9: no such partition
    assert [assignment(cat, "t", p).leader_broker for p in range(4)] == [2, 1, 3, None]
    assert changes(cat) - before == (1 if cat.backend == "postgresql" else 2)
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
    assert changes(cat) - before == (1 if cat.backend == "postgresql" else 3)


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
