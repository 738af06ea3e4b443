"""Blocks and runs: intent row, commit (epoch fencing), lookups, abandon, prune, sweep, on both backends."""

from __future__ import annotations

import pytest

from tiered.catalog import BlockState, IllegalTransition, StaleEpoch, UnknownBlock, UnknownPartition
from tiered.catalog.errors import Discontinuity
from tiered.catalog.blocks import (
    BlockRow,
    PruneResult,
    RunLocation,
    abandon_block,
    blocks_to_sweep,
    commit_block,
    delete_block_rows,
    find_run,
    get_block,
    insert_pending_block,
    known_object_keys,
    object_key_known,
    pending_blocks_older_than,
    prune_runs_below,
    prune_runs_within,
    runs_for_range,
)
from tiered.catalog.partitions import claim_partitions, get_partition_states
from tiered.catalog.segments import segment_copy_started
from tiered.catalog.topics import create_topic

from .rows import T0, minutes, run, segment, stamped

BROKER = 7


@pytest.fixture
def epochs(cat):
    """Topics a (2 partitions) and b (1), all led by BROKER; {(topic, partition): epoch}."""
    create_topic(cat, "a", 2)
    create_topic(cat, "b", 1)
    held = {("a", p): e for p, e in claim_partitions(cat, BROKER, "a", [0, 1]).items()}
    held |= {("b", p): e for p, e in claim_partitions(cat, BROKER, "b", [0]).items()}
    return held


def commit(cat, epochs, object_key, *runs, now=T0):
    block_id = insert_pending_block(cat, object_key, BROKER, sum(r.length_bytes for r in runs), now=now)
    return block_id, commit_block(cat, block_id, BROKER, stamped(runs, epochs), epochs, now=now)


def hwmarks(cat):
    return {(s.topic, s.partition): (s.first_available_seq, s.hwmark_seq) for s in get_partition_states(cat)}


def test_pending_block_is_an_intent_row(cat):
    block_id = insert_pending_block(cat, "blk/1", BROKER, 4096, now=T0)
    assert get_block(cat, block_id) == BlockRow(block_id, "blk/1", "pending", BROKER, 4096, T0, None, None)
    assert insert_pending_block(cat, "blk/2", BROKER, 1, now=T0) > block_id
    assert get_block(cat, 10_000) is None


def test_an_intent_row_retried_after_it_landed_returns_the_same_block(cat):
    """After CatalogUnavailable the caller cannot know whether the insert landed: asking again is safe."""
    block_id = insert_pending_block(cat, "blk/1", BROKER, 4096, now=T0)
    assert insert_pending_block(cat, "blk/1", BROKER, 4096, now=T0) == block_id
    with pytest.raises(ValueError):  # the same key from another broker, or in another state, is a bug
        insert_pending_block(cat, "blk/1", BROKER + 1, 4096, now=T0)


def test_commit_inserts_runs_and_raises_hwmarks(cat, epochs):
    block_id, marks = commit(cat, epochs, "blk/1", run("a", 0, 1, 10, 0, 300), run("b", 0, 5, 5, 300, 40, from_seq=1))
    assert marks == {("a", 0): 10, ("b", 0): 5}
    block = get_block(cat, block_id)
    assert (block.state, block.committed_at) == ("committed", T0)
    assert hwmarks(cat) == {("a", 0): (1, 10), ("a", 1): (0, 0), ("b", 0): (5, 5)}
    _, marks = commit(cat, epochs, "blk/2", run("a", 0, 11, 20, 0, 300), run("a", 1, 1, 3, 300, 10))
    assert marks == {("a", 0): 20, ("a", 1): 3}
    # first_available_seq is set once, by the first commit; later ones only raise the hwmark.
    assert hwmarks(cat) == {("a", 0): (1, 20), ("a", 1): (1, 3), ("b", 0): (5, 5)}
    assert find_run(cat, "a", 0, 15).object_key == "blk/2"


def test_a_commit_must_continue_the_high_water_mark(cat, epochs):
    """Continuity: a run answers from hwmark + 1, no lower (reused seqs) and no higher (seqs without a location)."""
    commit(cat, epochs, "blk/1", run("a", 0, 1, 10))
    for bad in (run("a", 0, 5, 20), run("a", 0, 12, 20), run("a", 0, 10, 20)):
        block_id = insert_pending_block(cat, f"blk/bad{bad.first_seq}", BROKER, 1, now=T0)
        with pytest.raises(Discontinuity) as caught:
            commit_block(cat, block_id, BROKER, stamped([bad], epochs), epochs)
        assert (caught.value.hwmark, caught.value.from_seq) == (10, bad.first_seq)
        assert get_block(cat, block_id).state == "pending"  # nothing changed
    assert hwmarks(cat)[("a", 0)] == (1, 10)
    # A jump in seqs (a produce that names its seqs) is the next run's: it answers from 11 but starts at 50.
    _, marks = commit(cat, epochs, "blk/2", run("a", 0, 50, 60, from_seq=11))
    assert marks == {("a", 0): 60}
    hit = find_run(cat, "a", 0, 30)
    assert (hit.object_key, hit.from_seq, hit.first_seq) == ("blk/2", 11, 50) and hit.holds(30)


def test_one_refused_partition_refuses_the_whole_block(cat, epochs):
    """The partitions are checked and raised together: a gap or an overlap in any of them changes none, and the
    refusal names the first refused partition in (topic, partition) order, whatever the order of the runs."""
    commit(cat, epochs, "blk/1", run("a", 0, 1, 10), run("a", 1, 1, 5, 100), run("b", 0, 1, 3, 200))
    before = hwmarks(cat)
    cases = {  # each: runs continuing a/0 exactly, with a gap or an overlap elsewhere
        "gap": ([run("b", 0, 9, 9, 200), run("a", 0, 11, 20), run("a", 1, 8, 9, 100)], ("a", 1, 5, 8)),
        "overlap": ([run("b", 0, 3, 4, 200), run("a", 0, 11, 20), run("a", 1, 6, 7, 100)], ("b", 0, 3, 3)),
    }
    for name, (runs, refusal) in cases.items():
        block_id = insert_pending_block(cat, f"blk/{name}", BROKER, 300, now=T0)
        with pytest.raises(Discontinuity) as caught:
            commit_block(cat, block_id, BROKER, stamped(runs, epochs), epochs)
        error = caught.value
        assert (error.topic, error.partition, error.hwmark, error.from_seq) == refusal
        assert get_block(cat, block_id).state == "pending"
        assert hwmarks(cat) == before
        assert find_run(cat, "a", 0, 11) is None


def test_a_wide_block_commits_every_partition(cat):
    """Hundreds of partitions in one block: every one raised, every run found, and a retry is a no-op."""
    create_topic(cat, "w", 300)
    held = {("w", p): e for p, e in claim_partitions(cat, BROKER, "w", range(300)).items()}
    runs = [run("w", p, 1, 1 + p % 3, 10 * i) for i, p in enumerate(reversed(range(300)))]
    block_id, marks = commit(cat, held, "blk/wide", *runs)
    assert marks == {("w", p): 1 + p % 3 for p in range(300)}
    assert {k: v for k, v in hwmarks(cat).items() if k[0] == "w"} == {("w", p): (1, 1 + p % 3) for p in range(300)}
    assert [find_run(cat, "w", p, 1).position for p in (0, 150, 299)] == [2990, 1490, 0]
    assert commit_block(cat, block_id, BROKER, stamped(runs, held), held) == marks


def test_runs_of_one_partition_in_a_block_must_follow_each_other(cat, epochs):
    _, marks = commit(cat, epochs, "blk/1", run("a", 0, 1, 10), run("a", 0, 11, 20, 100))
    assert marks == {("a", 0): 20}
    block_id = insert_pending_block(cat, "blk/2", BROKER, 1, now=T0)
    with pytest.raises(ValueError):
        commit_block(cat, block_id, BROKER, stamped([run("a", 0, 21, 30), run("a", 0, 25, 40, 100)], epochs), epochs)


def test_a_run_from_another_epoch_is_refused(cat, epochs):
    block_id = insert_pending_block(cat, "blk/1", BROKER, 1, now=T0)
    with pytest.raises(Discontinuity):
        commit_block(cat, block_id, BROKER, [run("a", 0, 1, 10, epoch=99)], epochs)


def test_stale_epoch_is_refused_and_changes_nothing(cat, epochs):
    commit(cat, epochs, "blk/0", run("a", 0, 1, 5))
    block_id = insert_pending_block(cat, "blk/1", BROKER, 200, now=T0)
    claim_partitions(cat, 99, "a", [1])  # another broker takes a/1: epoch 2, leader 99
    with pytest.raises(StaleEpoch) as caught:
        commit_block(cat, block_id, BROKER, stamped([run("a", 0, 6, 9), run("a", 1, 1, 4, 100)], epochs), epochs)
    error = caught.value
    assert (error.topic, error.partition, error.expected, error.actual, error.leader_broker) == ("a", 1, 1, 2, 99)
    assert get_block(cat, block_id).state == "pending"
    assert hwmarks(cat)[("a", 0)] == (1, 5)
    assert find_run(cat, "a", 0, 6) is None
    # Claiming back with a new epoch does not revive the old one: the broker must commit with what it holds now.
    new_epoch = claim_partitions(cat, BROKER, "a", [1])[1]
    with pytest.raises(StaleEpoch):
        commit_block(cat, block_id, BROKER, [run("a", 1, 1, 4)], epochs)
    assert commit_block(cat, block_id, BROKER, [run("a", 1, 1, 4, epoch=new_epoch)],
                        {**epochs, ("a", 1): new_epoch}) == {("a", 1): 4}


def test_same_epoch_from_another_broker_is_refused(cat, epochs):
    block_id = insert_pending_block(cat, "blk/1", 8, 10, now=T0)
    with pytest.raises(StaleEpoch):
        commit_block(cat, block_id, 8, [run("a", 0, 1, 2)], epochs)
    assert get_block(cat, block_id).state == "pending"


def test_commit_refuses_bad_input_before_touching_the_database(cat, epochs):
    block_id = insert_pending_block(cat, "blk/1", BROKER, 10, now=T0)
    with pytest.raises(ValueError):
        commit_block(cat, block_id, BROKER, [], epochs)
    with pytest.raises(ValueError):
        commit_block(cat, block_id, BROKER, [run("a", 0, 5, 4)], epochs)
    with pytest.raises(ValueError):
        commit_block(cat, block_id, BROKER, [run("zzz", 0, 1, 2)], epochs)
    with pytest.raises(UnknownPartition):
        commit_block(cat, block_id, BROKER, [run("a", 5, 1, 2)], {("a", 5): 1})
    with pytest.raises(ValueError):  # another broker's block
        commit_block(cat, block_id, 8, [run("a", 0, 1, 2)], epochs)
    with pytest.raises(UnknownBlock):
        commit_block(cat, 10_000, BROKER, [run("a", 0, 1, 2)], epochs)
    assert get_block(cat, block_id).state == "pending"


def test_commit_retry_after_it_landed_is_a_no_op(cat, epochs):
    block_id, marks = commit(cat, epochs, "blk/1", run("a", 0, 1, 10))
    assert commit_block(cat, block_id, BROKER, stamped([run("a", 0, 1, 10)], epochs), epochs) == marks
    assert len(runs_for_range(cat, "a", 0, 1, 10)) == 1


def test_abandoned_block_cannot_be_committed(cat, epochs):
    block_id = insert_pending_block(cat, "blk/1", BROKER, 10, now=T0)
    assert abandon_block(cat, block_id, grace=minutes(5), now=T0) is True
    assert abandon_block(cat, block_id, grace=minutes(5), now=T0) is True  # a retry
    block = get_block(cat, block_id)
    assert (block.state, block.delete_after) == ("deleting", T0 + minutes(5))
    with pytest.raises(IllegalTransition) as caught:
        commit_block(cat, block_id, BROKER, [run("a", 0, 1, 2)], epochs)
    assert (caught.value.current, caught.value.target) == ("deleting", "committed")
    assert find_run(cat, "a", 0, 1) is None


def test_abandon_refuses_a_referenced_block(cat, epochs):
    block_id, _ = commit(cat, epochs, "blk/1", run("a", 0, 1, 10))
    assert abandon_block(cat, block_id, now=T0) is False
    assert get_block(cat, block_id).state == "committed"
    assert find_run(cat, "a", 0, 1).block_id == block_id
    with pytest.raises(UnknownBlock):
        abandon_block(cat, 10_000)


def test_find_run_edges(cat, epochs):
    # Runs 1..10, 11..20, then a jump: 31..40 answers from 21.
    first, _ = commit(cat, epochs, "blk/1", run("a", 0, 1, 10, 0, 111), run("a", 1, 1, 1, 111, 7))
    second, _ = commit(cat, epochs, "blk/2", run("a", 0, 11, 20, 64, 222))
    third, _ = commit(cat, epochs, "blk/3", run("a", 0, 31, 40, 0, 333, from_seq=21))
    hit = find_run(cat, "a", 0, 1)
    assert hit == RunLocation("a", 0, 1, 1, 10, 0, 111, first, "blk/1", 1_700_000_000_001, 1_700_000_000_010,
                              118)  # the block's size: both its runs
    assert find_run(cat, "a", 0, 10).block_id == first  # exactly the last seq of a run
    assert find_run(cat, "a", 0, 11).block_id == second  # exactly the first seq of the next
    hit = find_run(cat, "a", 0, 25)  # in the jump: the run that answers for it, which starts after the seq asked
    assert (hit.block_id, hit.first_seq, hit.position, hit.holds(25)) == (third, 31, 0, True)
    assert find_run(cat, "a", 0, 0).block_id == first  # below the first run
    assert find_run(cat, "a", 0, 40).block_id == third
    assert find_run(cat, "a", 0, 41) is None  # past the last run
    assert find_run(cat, "a", 1, 1).position == 111
    assert find_run(cat, "b", 0, 1) is None


def test_runs_for_range(cat, epochs):
    for i in range(5):
        commit(cat, epochs, f"blk/{i}", run("a", 0, 10 * i + 1, 10 * i + 10))
    found = runs_for_range(cat, "a", 0, 15, 3)
    assert [(r.first_seq, r.object_key) for r in found] == [(11, "blk/1"), (21, "blk/2"), (31, "blk/3")]
    # with the run's timestamp bounds (rows.run stamps its messages 1_700_000_000_000 + seq)
    assert [(r.min_ts_ms, r.max_ts_ms) for r in found] == [(1_700_000_000_000 + f, 1_700_000_000_000 + f + 9)
                                                          for f in (11, 21, 31)]
    assert found[0] == RunLocation("a", 0, 11, 11, 20, 0, 100, found[0].block_id, "blk/1", 1_700_000_000_011,
                                   1_700_000_000_020, 100)
    assert runs_for_range(cat, "a", 0, 51, 3) == []
    assert len(runs_for_range(cat, "a", 0, 1, 100)) == 5


def test_prune_within_deletes_the_runs_inside_a_range_and_marks_empty_blocks(cat, epochs):
    shared, _ = commit(cat, epochs, "blk/1", run("a", 0, 1, 10), run("a", 1, 1, 5, 100))
    alone, _ = commit(cat, epochs, "blk/2", run("a", 0, 11, 20))
    kept, _ = commit(cat, epochs, "blk/3", run("a", 0, 21, 30))
    assert prune_runs_within(cat, "a", 0, 1, 20, grace=minutes(10), now=T0) == PruneResult(2, 1)
    assert get_block(cat, alone).state == "deleting"
    assert get_block(cat, alone).delete_after == T0 + minutes(10)
    assert get_block(cat, shared).state == "committed"  # a/1 still has a run in it
    assert find_run(cat, "a", 0, 1).block_id == kept
    assert find_run(cat, "a", 1, 1).block_id == shared
    assert prune_runs_within(cat, "a", 1, 1, 5, now=T0) == PruneResult(1, 1)
    assert get_block(cat, shared).state == "deleting"
    assert prune_runs_within(cat, "a", 0, 1, 20, now=T0) == PruneResult(0, 0)
    assert get_block(cat, kept).state == "committed"


def test_prune_within_never_takes_a_run_that_reaches_outside_the_range(cat, epochs):
    """The disk-loss case: runs 1..10 and 11..20 of a lost disk's tail; a new disk's segment holds 21..30 only."""
    commit(cat, epochs, "blk/1", run("a", 0, 1, 10))
    commit(cat, epochs, "blk/2", run("a", 0, 11, 20))
    commit(cat, epochs, "blk/3", run("a", 0, 21, 30))
    assert prune_runs_within(cat, "a", 0, 21, 30, now=T0) == PruneResult(1, 1)
    assert [r.object_key for r in runs_for_range(cat, "a", 0, 1, 10)] == ["blk/1", "blk/2"]
    assert prune_runs_within(cat, "a", 0, 5, 20, now=T0) == PruneResult(1, 1)  # 1..10 reaches below 5: kept
    assert [r.object_key for r in runs_for_range(cat, "a", 0, 1, 10)] == ["blk/1"]


def test_prune_below_is_bounded(cat, epochs):
    for i in range(5):
        commit(cat, epochs, f"blk/{i}", run("a", 0, 10 * i + 1, 10 * i + 10))
    assert prune_runs_below(cat, "a", 0, 51, limit=2, now=T0) == PruneResult(2, 2)
    assert find_run(cat, "a", 0, 1).first_seq == 21  # the oldest went first
    assert prune_runs_below(cat, "a", 0, 51, limit=2, now=T0) == PruneResult(2, 2)
    assert prune_runs_below(cat, "a", 0, 51, limit=2, now=T0) == PruneResult(1, 1)
    assert prune_runs_below(cat, "a", 0, 51, limit=2, now=T0) == PruneResult(0, 0)


def test_sweep_after_the_grace_period(cat, epochs):
    ids = []
    for i in range(4):
        block_id, _ = commit(cat, epochs, f"blk/{i}", run("a", 0, 10 * i + 1, 10 * i + 10))
        ids.append(block_id)
        prune_runs_below(cat, "a", 0, 10 * i + 11, grace=minutes(10), now=T0 + minutes(i))
    assert blocks_to_sweep(cat, T0 + minutes(9), 10) == []
    due = blocks_to_sweep(cat, T0 + minutes(11), 10)
    assert [b.block_id for b in due] == ids[:2]  # delete_after <= now, oldest first
    assert [b.object_key for b in blocks_to_sweep(cat, T0 + minutes(60), 3)] == ["blk/0", "blk/1", "blk/2"]
    live = insert_pending_block(cat, "blk/live", BROKER, 1, now=T0)
    assert delete_block_rows(cat, [ids[0], ids[1], live]) == 2  # only rows in `deleting`
    assert get_block(cat, ids[0]) is None and get_block(cat, live).state == "pending"
    assert [b.block_id for b in blocks_to_sweep(cat, T0 + minutes(60), 10)] == ids[2:]
    assert delete_block_rows(cat, []) == 0


def test_pending_blocks_older_than(cat, epochs):
    old = [insert_pending_block(cat, f"blk/old{i}", BROKER, 1, now=T0 + minutes(i)) for i in range(3)]
    insert_pending_block(cat, "blk/new", BROKER, 1, now=T0 + minutes(30))
    commit(cat, epochs, "blk/done", run("a", 0, 1, 2), now=T0)
    found = pending_blocks_older_than(cat, T0 + minutes(20), 10)
    assert [b.block_id for b in found] == old
    assert all(b.state == BlockState.PENDING for b in found)
    assert [b.block_id for b in pending_blocks_older_than(cat, T0 + minutes(20), 2)] == old[:2]


def test_object_keys_known_from_blocks_and_segments(cat, epochs):
    insert_pending_block(cat, "blk/1", BROKER, 1, now=T0)
    meta = segment("a", 0, 1, 100, epochs[("a", 0)])
    segment_copy_started(cat, meta, now=T0)
    assert object_key_known(cat, "blk/1")
    assert object_key_known(cat, meta.object_key) and object_key_known(cat, meta.index_object_key)
    assert not object_key_known(cat, "blk/2")
    listing = [f"orphan/{i}" for i in range(1200)] + ["blk/1", meta.index_object_key, "blk/1"]
    assert known_object_keys(cat, listing) == {"blk/1", meta.index_object_key}
    assert known_object_keys(cat, []) == set()


def test_runs_of_a_topic_named_with_copy_text_escapes_read_back_as_named(cat):
    """PostgreSQL receives a commit's runs as COPY text: a name holding a backslash, a tab or a line end (the catalog
    takes any name; the broker's rules are narrower) is escaped, not split into other fields or rows."""
    name = "odd\\name\twith\nbreaks\r"
    create_topic(cat, name, 2)
    held = claim_partitions(cat, BROKER, name, [0, 1])
    epochs = {(name, p): e for p, e in held.items()}
    commit(cat, epochs, "blk/odd", run(name, 0, 1, 5), run(name, 1, 1, 2, 100))
    assert [(r.topic, r.partition, r.first_seq, r.last_seq, r.position) for r in
            (find_run(cat, name, 0, 3), find_run(cat, name, 1, 1))] == [(name, 0, 1, 5, 0), (name, 1, 1, 2, 100)]
    assert hwmarks(cat) == {(name, 0): (1, 5), (name, 1): (1, 2)}
