"""Remote segments: copy and delete transitions, epoch fencing, lookups, retention, on both backends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tiered.catalog import IllegalTransition, SegmentState, StaleEpoch, UnknownSegment
from tiered.catalog.compaction import readable_segments
from tiered.catalog.partitions import claim_partitions, get_partition_states, set_first_available
from tiered.catalog.segments import (
    find_remote_segment,
    get_segment,
    highest_copied_seq,
    list_segments,
    RetentionLimits,
    partitions_due_for_retention,
    partitions_mid_deletion,
    partitions_with_stale_copies,
    segment_copy_abandoned,
    segment_copy_finished,
    segment_copy_started,
    segment_delete_finished,
    segment_delete_started,
    segments_for_remote_retention,
    segments_for_remote_retention as retention,
)
from tiered.catalog.topics import create_topic

from .rows import T0, minutes, segment

S = SegmentState


@pytest.fixture
def epoch(cat):
    create_topic(cat, "t", 2)
    return claim_partitions(cat, 1, "t", [0])[0]


def copy(cat, epoch, base, last, size=1000, freeze_ts=T0):
    meta = segment("t", 0, base, last, epoch, size, freeze_ts)
    segment_copy_started(cat, meta, now=T0)
    return segment_copy_finished(cat, "t", 0, base, epoch, now=T0 + minutes(1)).segment


def remote_bytes(cat):
    return get_partition_states(cat, "t")[0].remote_bytes


def test_copy_started_then_finished(cat, epoch):
    meta = segment("t", 0, 1, 100, epoch, 1000)
    started = segment_copy_started(cat, meta, now=T0)
    assert (started.state, started.updated_at, started.object_key) == (S.COPY_STARTED, T0, meta.object_key)
    assert get_segment(cat, "t", 0, 1) == started
    assert find_remote_segment(cat, "t", 0, 50) is None  # not readable until finished
    assert remote_bytes(cat) == 0
    finished = segment_copy_finished(cat, "t", 0, 1, epoch, now=T0 + minutes(1)).segment
    assert (finished.state, finished.updated_at) == (S.COPY_FINISHED, T0 + minutes(1))
    assert get_segment(cat, "t", 0, 1) == finished
    assert find_remote_segment(cat, "t", 0, 50) == finished
    assert remote_bytes(cat) == 1100  # object and index
    assert highest_copied_seq(cat, "t", 0) == 100


def test_copy_retries_are_idempotent(cat, epoch):
    segment_copy_started(cat, segment("t", 0, 1, 100, epoch, 1000), now=T0)
    # A crashed copy starts over: the row takes the new attempt's numbers.
    again = segment_copy_started(cat, segment("t", 0, 1, 100, epoch, 2000), now=T0 + minutes(5))
    assert (get_segment(cat, "t", 0, 1).size_bytes, again.updated_at) == (2000, T0 + minutes(5))
    finished = segment_copy_finished(cat, "t", 0, 1, epoch, now=T0).segment
    # A COMMIT whose outcome was unknown is retried: nothing moves, bytes are not counted twice.
    assert segment_copy_finished(cat, "t", 0, 1, epoch, now=T0 + minutes(9)).segment == finished
    assert remote_bytes(cat) == 2200
    # Even once another broker has claimed the partition: the copy did finish under the old epoch.
    claim_partitions(cat, 2, "t", [0])
    assert segment_copy_finished(cat, "t", 0, 1, epoch).segment == finished


def test_copy_is_fenced_by_the_leader_epoch(cat, epoch):
    meta = segment("t", 0, 1, 100, epoch)
    segment_copy_started(cat, meta, now=T0)
    new_epoch = claim_partitions(cat, 2, "t", [0])[0]
    with pytest.raises(StaleEpoch) as caught:
        segment_copy_finished(cat, "t", 0, 1, epoch)
    assert (caught.value.expected, caught.value.actual, caught.value.leader_broker) == (epoch, new_epoch, 2)
    with pytest.raises(StaleEpoch):
        segment_copy_started(cat, segment("t", 0, 101, 200, epoch))
    assert get_segment(cat, "t", 0, 1).state == S.COPY_STARTED
    assert get_segment(cat, "t", 0, 101) is None
    # The new leader redoes the copy under its own epoch.
    segment_copy_started(cat, segment("t", 0, 1, 100, new_epoch), now=T0)
    assert segment_copy_finished(cat, "t", 0, 1, new_epoch).segment.leader_epoch == new_epoch


def test_illegal_segment_transitions_raise_and_change_nothing(cat, epoch):
    finished = copy(cat, epoch, 1, 100)
    with pytest.raises(IllegalTransition) as caught:
        segment_copy_started(cat, segment("t", 0, 1, 100, epoch, 5))
    assert (caught.value.current, caught.value.target) == (S.COPY_FINISHED, S.COPY_STARTED)
    assert get_segment(cat, "t", 0, 1) == finished
    set_first_available(cat, "t", 0, 101)  # as remote retention does before deleting
    segment_delete_started(cat, "t", 0, 1, now=T0)
    with pytest.raises(IllegalTransition):
        segment_copy_finished(cat, "t", 0, 1, epoch)
    segment_delete_finished(cat, "t", 0, 1, now=T0)
    for attempt in (
        lambda: segment_copy_started(cat, segment("t", 0, 1, 100, epoch)),
        lambda: segment_copy_finished(cat, "t", 0, 1, epoch),
        lambda: segment_delete_started(cat, "t", 0, 1),
    ):
        with pytest.raises(IllegalTransition):
            attempt()
    assert get_segment(cat, "t", 0, 1).state == S.DELETE_FINISHED
    # DELETE_FINISHED straight from COPY_STARTED skips DELETE_STARTED: refused.
    segment_copy_started(cat, segment("t", 0, 101, 200, epoch), now=T0)
    with pytest.raises(IllegalTransition):
        segment_delete_finished(cat, "t", 0, 101)


def test_a_copy_under_an_older_epoch_is_abandoned_and_its_base_copied_again(cat, epoch):
    fenced = segment_copy_started(cat, segment("t", 0, 1, 100, epoch), now=T0)
    new_epoch = claim_partitions(cat, 2, "t", [0])[0]
    later = T0 + minutes(11)
    # Only the leader at the current epoch may clean up, and only a row older than `older_than`.
    with pytest.raises(StaleEpoch):
        segment_copy_abandoned(cat, "t", 0, 1, epoch, older_than=later, now=later)
    assert segment_copy_abandoned(cat, "t", 0, 1, new_epoch, older_than=T0 - minutes(1), now=later) is None
    assert segment_copy_abandoned(cat, "t", 0, 2, new_epoch, older_than=later, now=later) is None  # no row
    started = segment_copy_abandoned(cat, "t", 0, 1, new_epoch, older_than=later, now=later)
    assert (started.state, started.leader_epoch, started.updated_at) == (S.DELETE_STARTED, epoch, later)
    assert segment_copy_abandoned(cat, "t", 0, 1, new_epoch, older_than=later, now=later) == started  # retry
    assert remote_bytes(cat) == 0 and find_remote_segment(cat, "t", 0, 1) is None
    # Mid-deletion, no copy of the base may start: the objects being deleted could be its own (same keys).
    with pytest.raises(IllegalTransition):
        segment_copy_started(cat, segment("t", 0, 1, 100, new_epoch), now=later)
    segment_delete_finished(cat, "t", 0, 1, now=later)
    # Deleted, the base is free again: the leader (here the fenced broker's disk, same keys) copies it.
    again = segment_copy_started(cat, segment("t", 0, 1, 100, new_epoch), now=later)
    assert (again.state, again.leader_epoch, again.object_key) == (S.COPY_STARTED, new_epoch, fenced.object_key)
    assert segment_copy_finished(cat, "t", 0, 1, new_epoch).segment.state == S.COPY_FINISHED
    assert remote_bytes(cat) == 1100


def test_a_copy_of_the_current_epoch_or_further_along_is_never_abandoned(cat, epoch):
    later = T0 + minutes(30)
    segment_copy_started(cat, segment("t", 0, 1, 100, epoch), now=T0)
    copy(cat, epoch, 101, 200)
    assert segment_copy_abandoned(cat, "t", 0, 1, epoch, older_than=later, now=later) is None  # in flight
    new_epoch = claim_partitions(cat, 2, "t", [0])[0]
    segment_copy_started(cat, segment("t", 0, 1, 100, new_epoch), now=T0)  # the new leader took it over
    assert segment_copy_abandoned(cat, "t", 0, 1, new_epoch, older_than=later, now=later) is None
    assert segment_copy_abandoned(cat, "t", 0, 101, new_epoch, older_than=later, now=later) is None  # readable
    assert {s.base_seq: s.state for s in list_segments(cat, "t", 0)} == {1: S.COPY_STARTED, 101: S.COPY_FINISHED}


def test_unknown_segments(cat, epoch):
    for attempt in (
        lambda: segment_copy_finished(cat, "t", 0, 1, epoch),
        lambda: segment_delete_started(cat, "t", 0, 1),
        lambda: segment_delete_finished(cat, "t", 0, 1),
    ):
        with pytest.raises(UnknownSegment):
            attempt()
    assert get_segment(cat, "t", 0, 1) is None


def test_delete_stops_reads_and_uncounts_bytes(cat, epoch):
    copy(cat, epoch, 1, 100)
    copy(cat, epoch, 101, 200)
    assert remote_bytes(cat) == 2200
    started = segment_delete_started(cat, "t", 0, 1, now=T0 + minutes(2))
    assert (started.state, started.updated_at) == (S.DELETE_STARTED, T0 + minutes(2))
    assert segment_delete_started(cat, "t", 0, 1) == started  # retry: no-op, bytes not subtracted twice
    assert remote_bytes(cat) == 1100
    assert find_remote_segment(cat, "t", 0, 50).base_seq == 101  # the deleted one is no longer readable
    done = segment_delete_finished(cat, "t", 0, 1, now=T0 + minutes(3))
    assert segment_delete_finished(cat, "t", 0, 1) == done
    # Cleaning up a copy that never finished: COPY_STARTED -> DELETE_STARTED leaves remote_bytes alone.
    segment_copy_started(cat, segment("t", 0, 201, 300, epoch), now=T0)
    segment_delete_started(cat, "t", 0, 201)
    assert remote_bytes(cat) == 1100


def test_find_remote_segment_edges(cat, epoch):
    copy(cat, epoch, 1, 100)
    copy(cat, epoch, 101, 200)
    copy(cat, epoch, 301, 400)  # 201..300 never made it (a gap)
    segment_copy_started(cat, segment("t", 0, 401, 500, epoch), now=T0)  # not finished: invisible

    def base(seq):
        found = find_remote_segment(cat, "t", 0, seq)
        return found.base_seq if found else None

    assert base(1) == 1  # exact base
    assert base(100) == 1  # exact last
    assert base(101) == 101
    assert base(250) == 301  # in the gap: the next segment, whose base is past the seq asked for
    assert base(0) == 1  # below the first
    assert base(400) == 301
    assert base(401) is None  # only a COPY_STARTED segment there
    assert find_remote_segment(cat, "t", 1, 1) is None
    segment_delete_started(cat, "t", 0, 1)
    assert base(1) == 101


def test_list_segments_pages_and_filters(cat, epoch):
    for i in range(5):
        copy(cat, epoch, 100 * i + 1, 100 * i + 100)
    segment_copy_started(cat, segment("t", 0, 501, 600, epoch), now=T0)
    segment_delete_started(cat, "t", 0, 1)
    page = list_segments(cat, "t", 0, limit=4)
    assert [s.base_seq for s in page] == [1, 101, 201, 301]
    assert [s.base_seq for s in list_segments(cat, "t", 0, after_base_seq=page[-1].base_seq)] == [401, 501]
    finished = list_segments(cat, "t", 0, states=(S.COPY_FINISHED,))
    assert [s.base_seq for s in finished] == [101, 201, 301, 401]
    assert [s.base_seq for s in list_segments(cat, "t", 0, states=(S.COPY_STARTED, S.DELETE_STARTED))] == [1, 501]
    assert list_segments(cat, "t", 1) == []
    assert [s.base_seq for s in list_segments(cat, "t", 0, states=(S.DELETE_STARTED,))] == [1]
    assert [s.base_seq for s in list_segments(cat, "t", 0, states=("COPY_STARTED",))] == [501]  # plain strings too
    assert list_segments(cat, "t", 0, states=()) == []


def test_partitions_mid_deletion_names_only_those_with_an_interrupted_deletion(cat, epoch):
    epoch1 = claim_partitions(cat, 1, "t", [1])[1]
    assert partitions_mid_deletion(cat) == set()
    copy(cat, epoch, 1, 100)
    copy(cat, epoch, 101, 200)
    segment_copy_started(cat, segment("t", 1, 1, 100, epoch1), now=T0)
    assert partitions_mid_deletion(cat) == set()  # copied or copying: nothing to finish
    segment_delete_started(cat, "t", 0, 1, now=T0)
    segment_delete_started(cat, "t", 0, 101, now=T0)
    assert partitions_mid_deletion(cat) == {("t", 0)}  # one row per partition, however many are mid-deletion
    segment_delete_finished(cat, "t", 0, 1, now=T0)
    segment_delete_finished(cat, "t", 0, 101, now=T0)
    assert partitions_mid_deletion(cat) == set()


def test_partitions_with_stale_copies_names_those_with_a_copy_started_long_enough_ago(cat, epoch):
    epoch1 = claim_partitions(cat, 1, "t", [1])[1]
    copy(cat, epoch, 1, 100)  # finished: never a candidate
    segment_copy_started(cat, segment("t", 0, 101, 200, epoch), now=T0 + minutes(10))
    segment_copy_started(cat, segment("t", 1, 1, 100, epoch1), now=T0)
    segment_copy_started(cat, segment("t", 1, 101, 200, epoch1), now=T0)
    assert partitions_with_stale_copies(cat, older_than=T0 - minutes(1)) == set()
    assert partitions_with_stale_copies(cat, older_than=T0) == {("t", 1)}
    assert partitions_with_stale_copies(cat, older_than=T0 + minutes(10)) == {("t", 0), ("t", 1)}
    segment_copy_finished(cat, "t", 0, 101, epoch, now=T0 + minutes(11))
    assert partitions_with_stale_copies(cat, older_than=T0 + minutes(20)) == {("t", 1)}


def test_readable_segments_pages_by_seq_through_every_readable_segment(cat, epoch):
    for i in range(7):
        copy(cat, epoch, 100 * i + 1, 100 * i + 100)
    segment_copy_started(cat, segment("t", 0, 701, 800, epoch), now=T0)  # not readable yet
    segment_delete_started(cat, "t", 0, 201)
    expected = [1, 101, 301, 401, 501, 601]
    for page in (1, 2, 3, 6, 1000):
        assert [s.base_seq for s in readable_segments(cat, "t", 0, page=page)] == expected, page
    assert readable_segments(cat, "t", 1) == []


def test_list_segments_refuses_unknown_states(cat, epoch):
    copy(cat, epoch, 1, 100)
    for bad in ("deleted", "COPY_FINISHED' OR '1'='1"):  # states reach the SQL as literals: only real ones
        with pytest.raises(ValueError):
            list_segments(cat, "t", 0, states=(bad,))


def test_remote_retention_by_age(cat, epoch):
    for i in range(4):
        copy(cat, epoch, 100 * i + 1, 100 * i + 100, freeze_ts=T0 + minutes(10 * i))
    now = T0 + minutes(65)
    due = retention(cat, "t", 0, now=now, max_age=minutes(50), max_bytes=None)
    assert [s.base_seq for s in due] == [1, 101]  # frozen at 0, 10 and 20 minutes: 0+50, 10+50 < 65 <= 20+50
    assert retention(cat, "t", 0, now=now, max_age=minutes(45), max_bytes=None, limit=1)[0].base_seq == 1
    assert retention(cat, "t", 0, now=now, max_age=minutes(65), max_bytes=None) == []  # 0 + 65 is not < 65
    assert retention(cat, "t", 0, now=now, max_age=None, max_bytes=None) == []


def test_remote_retention_by_bytes_deletes_a_prefix(cat, epoch):
    for i in range(4):
        copy(cat, epoch, 100 * i + 1, 100 * i + 100, size=1000)  # 1100 bytes each, 4400 in all
    due = segments_for_remote_retention(cat, "t", 0, now=T0, max_age=None, max_bytes=2300)
    assert [s.base_seq for s in due] == [1, 101]  # 4400 -> 3300 -> 2200 <= 2300
    assert retention(cat, "t", 0, now=T0, max_age=None, max_bytes=4400) == []
    assert len(retention(cat, "t", 0, now=T0, max_age=None, max_bytes=0)) == 4
    # Deletions already started are out of remote_bytes and out of the candidates.
    segment_delete_started(cat, "t", 0, 1)
    assert [s.base_seq for s in retention(cat, "t", 0, now=T0, max_age=None, max_bytes=2300)] == [101]


def test_retention_never_skips_a_kept_segment(cat, epoch):
    copy(cat, epoch, 1, 100, freeze_ts=T0 + minutes(50))  # oldest seqs, but frozen late (young)
    copy(cat, epoch, 101, 200, freeze_ts=T0)
    assert retention(cat, "t", 0, now=T0 + minutes(60), max_age=minutes(30), max_bytes=None) == []


def test_highest_copied_seq(cat, epoch):
    assert highest_copied_seq(cat, "t", 0) == 0
    copy(cat, epoch, 1, 100)
    segment_copy_started(cat, segment("t", 0, 101, 200, epoch), now=T0)
    assert highest_copied_seq(cat, "t", 0) == 100
    segment_copy_finished(cat, "t", 0, 101, epoch)
    assert highest_copied_seq(cat, "t", 0) == 200
    assert highest_copied_seq(cat, "t", 1) == 0


def test_segment_times_are_utc(cat, epoch):
    tokyo = T0.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    meta = segment("t", 0, 1, 100, epoch, freeze_ts=tokyo)
    stored = segment_copy_started(cat, meta, now=tokyo + timedelta(hours=1))
    row = get_segment(cat, "t", 0, 1)
    assert row.freeze_ts == T0 and row.freeze_ts.utcoffset() == timedelta(0)
    assert row.updated_at == stored.updated_at == T0 + timedelta(hours=1)
    with pytest.raises(Exception, match="naive datetime"):
        segment_copy_started(cat, segment("t", 0, 101, 200, epoch, freeze_ts=T0.replace(tzinfo=None)))


def copy_to(cat, topic, partition, epoch, base, last, size=1000, freeze_ts=T0):
    segment_copy_started(cat, segment(topic, partition, base, last, epoch, size, freeze_ts), now=T0)
    segment_copy_finished(cat, topic, partition, base, epoch, now=T0)


def due(cat, limits, now, **kwargs):
    return partitions_due_for_retention(cat, limits, now=now, **kwargs)


def test_partitions_due_by_age_just_under_and_just_over(cat, epoch):
    copy(cat, epoch, 1, 100, freeze_ts=T0)
    copy(cat, epoch, 101, 200, freeze_ts=T0 + minutes(10))
    limits = [RetentionLimits(("t",), minutes(50), None)]
    assert due(cat, limits, T0 + minutes(50)) == []  # 0 + 50 is not < 50: kept, as segments_for_remote_retention
    assert retention(cat, "t", 0, now=T0 + minutes(50), max_age=minutes(50), max_bytes=None) == []
    just_over = T0 + minutes(50) + timedelta(microseconds=1)
    assert due(cat, limits, just_over) == [("t", 0)]
    assert [s.base_seq for s in retention(cat, "t", 0, now=just_over, max_age=minutes(50), max_bytes=None)] == [1]


def test_partitions_due_by_bytes_just_under_and_just_over(cat, epoch):
    copy(cat, epoch, 1, 100, size=1000)
    copy(cat, epoch, 101, 200, size=1000)  # 2200 bytes with the indexes
    assert due(cat, [RetentionLimits(("t",), None, 2200)], T0) == []
    assert retention(cat, "t", 0, now=T0, max_age=None, max_bytes=2200) == []
    assert due(cat, [RetentionLimits(("t",), None, 2199)], T0) == [("t", 0)]
    assert len(retention(cat, "t", 0, now=T0, max_age=None, max_bytes=2199)) == 1


def test_a_partition_with_nothing_readable_is_never_due(cat, epoch):
    copy(cat, epoch, 1, 100, freeze_ts=T0)
    segment_delete_started(cat, "t", 0, 1)  # no longer readable, out of remote_bytes
    limits = [RetentionLimits(("t",), minutes(1), 0)]  # the smallest limits: anything readable would be due
    assert due(cat, limits, T0 + minutes(60)) == []
    segment_delete_finished(cat, "t", 0, 1)
    assert due(cat, limits, T0 + minutes(60)) == []
    assert due(cat, [], T0 + minutes(60)) == []


def test_partitions_due_across_topics_of_different_limits(cat):
    """Each topic is held to its own limits; a topic left out (no retention configured) is never named, however old
    or large its segments; a topic in two groups is due by either."""
    old = T0 - timedelta(days=30)
    for name in ("age", "size", "both", "none"):
        create_topic(cat, name, 3)
        epochs = claim_partitions(cat, 1, name, [0, 1, 2])
        copy_to(cat, name, 0, epochs[0], 1, 100, freeze_ts=old)  # old and 1100 bytes
        copy_to(cat, name, 1, epochs[1], 1, 100, size=5000)  # young and 5100 bytes
        copy_to(cat, name, 2, epochs[2], 1, 100)  # young and 1100 bytes: never due
    limits = [
        RetentionLimits(("age",), timedelta(days=7), None),
        RetentionLimits(("size",), None, 2000),
        RetentionLimits(("both",), timedelta(days=7), 2000),
    ]
    assert due(cat, limits, T0) == [("age", 0), ("both", 0), ("both", 1), ("size", 1)]
    # Topics of equal limits share a subselect; a longer age lets the old segment of `age` be.
    limits = [RetentionLimits(("age", "both"), timedelta(days=60), None), RetentionLimits(("both", "size"), None, 6000)]
    assert due(cat, limits, T0) == []
    for name in ("age", "size", "both", "none"):
        for p in range(3):  # the selection names exactly the partitions whose pass expires something
            group = {"age": (timedelta(days=7), None), "size": (None, 2000), "both": (timedelta(days=7), 2000),
                     "none": (None, None)}[name]
            expires = retention(cat, name, p, now=T0, max_age=group[0], max_bytes=group[1]) != []
            assert expires == ((name, p) in due(cat, [RetentionLimits((name,), *group)], T0)), (name, p)


def test_many_partitions_are_named_page_by_page(cat):
    """300 partitions, every 7th holding an old segment and every 11th too many bytes (some both): the pages, 16 at a
    time from the last one named, give each due partition once, in order."""
    create_topic(cat, "many", 300)
    epochs = claim_partitions(cat, 1, "many", range(300))
    for p in range(300):
        copy_to(cat, "many", p, epochs[p], 1, 100, size=5000 if p % 11 == 0 else 100,
                freeze_ts=T0 - timedelta(days=30) if p % 7 == 0 else T0)
        copy_to(cat, "many", p, epochs[p], 101, 200, size=100, freeze_ts=T0 - timedelta(days=3))  # later seqs, frozen earlier
    expected = [("many", p) for p in range(300) if p % 7 == 0 or p % 11 == 0]
    limits = [RetentionLimits(("many",), timedelta(days=7), 2000)]
    named, after = [], None
    while True:
        page = due(cat, limits, T0, after=after, limit=16)
        named.extend(page)
        if len(page) < 16:
            break
        after = page[-1]
    assert named == expected
    # The second segment, frozen earlier than the first, names every partition by age; the pass then expires only
    # where the oldest readable one is old (or the bytes are over).
    assert len(due(cat, [RetentionLimits(("many",), timedelta(days=2), None)], T0, limit=1000)) == 300
    assert retention(cat, "many", 1, now=T0, max_age=timedelta(days=2), max_bytes=None) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_the_selection_names_every_partition_retention_expires_something_of(cat, seed):
    """Seeded: 3 topics of random limits, 12 partitions each holding 0-4 readable segments of random sizes and freeze
    times (out of seq order at times), some deleted: every partition segments_for_remote_retention expires something
    of is named, and a partition named where it expires nothing holds a readable segment past the age cutoff behind
    a younger oldest one."""
    import random

    rng = random.Random(seed)
    now = T0 + timedelta(days=30)
    limits, named_by = [], {}
    for t in range(3):
        name = f"r{t}"
        create_topic(cat, name, 12)
        epochs = claim_partitions(cat, 1, name, range(12))
        max_age = rng.choice([None, timedelta(days=rng.randint(1, 20))])
        max_bytes = rng.choice([None, rng.randint(1, 6) * 1000]) if max_age is not None else rng.randint(1, 6) * 1000
        limits.append(RetentionLimits((name,), max_age, max_bytes))
        named_by[name] = (max_age, max_bytes)
        for p in range(12):
            for i in range(rng.randint(0, 4)):
                base = 100 * i + 1
                copy_to(cat, name, p, epochs[p], base, base + 99, size=rng.randint(100, 2000),
                        freeze_ts=now - timedelta(days=rng.randint(0, 30), hours=rng.randint(0, 23)))
                if i == 0 and rng.random() < 0.2:
                    segment_delete_started(cat, name, p, base)
    named = set(due(cat, limits, now, limit=1000))
    assert 0 < len(named) < 36  # the seeds give both
    for name, (max_age, max_bytes) in named_by.items():
        for p in range(12):
            expires = retention(cat, name, p, now=now, max_age=max_age, max_bytes=max_bytes, limit=1) != []
            readable = list_segments(cat, name, p, states=(S.COPY_FINISHED,))
            if expires:
                assert (name, p) in named, (name, p)
            elif (name, p) in named:
                assert max_age is not None and any(s.freeze_ts + max_age < now for s in readable[1:]), (name, p)
