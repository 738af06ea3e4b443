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
from tests.tiering.test_abandoned_copies import StatementCountingCatalog

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
        catalog_blocks.expand_blocks(cat, [block_id])  # as the broker does after the acknowledgements
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


async def test_the_broker_is_told_the_new_start_before_any_segment_stops_being_readable(s3_store, cat, acat):
    await _history(s3_store, cat)
    told: list[tuple[int, dict[int, str]]] = []
    report = await enforce_remote_retention(s3_store, acat, TOPIC, 0, TopicConfig(remote_retention_bytes=1500), T0,
                                            moved=lambda seq: told.append((seq, _states(cat))))
    assert [s.base_seq for s in report.deleted] == [1, 11]
    assert told == [(21, {1: SegmentState.COPY_FINISHED, 11: SegmentState.COPY_FINISHED,
                          21: SegmentState.COPY_FINISHED})]
    told.clear()  # nothing expires: nobody is told from inside the pass (its report carries the start)
    await enforce_remote_retention(s3_store, acat, TOPIC, 0, TopicConfig(remote_retention_bytes=1500), T0,
                                   moved=lambda seq: told.append((seq, {})))
    assert told == []


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


# -- the pass over every led partition (RemoteTier) ---------------------------------------------------------------


class _Sink:
    def __init__(self) -> None:
        self.moved: dict = {}

    def copied(self, tp, base, last):
        pass

    def first_available_moved(self, tp, seq):
        self.moved[tp] = seq


QUIET = 40


async def _led(s3_store, cat, acat, now: datetime):
    """`logs` (the history above, 90 minutes of retention) and `quiet`: 40 partitions of one segment frozen at `now`
    each, a day of retention and 2,000 bytes at most (each holds 1,100): led here, by a RemoteTier on a clock at
    `now`."""
    from tests.support.clock import ManualClock
    from tests.tiering.tier_state import configure, led_state
    from tiered.metrics import Metrics
    from tiered.tiering.remote_tier import RemoteTier
    from tiered.topic_partition import TopicPartition

    metas = await _history(s3_store, cat)
    catalog_topics.create_topic(cat, "quiet", QUIET, now=T0)
    epochs = {("quiet", p): e for p, e in catalog_partitions.claim_partitions(cat, BROKER, "quiet", range(QUIET)).items()}
    epochs[(TOPIC, 0)] = catalog_partitions.get_partition_states(cat, TOPIC)[0].leader_epoch
    for p in range(QUIET):
        block_id = catalog_blocks.insert_pending_block(cat, f"blocks/quiet/{p}.blk", BROKER, 100, now=now)
        run = RunRow("quiet", p, 1, 1, 10, 10, 1, 2, epochs[("quiet", p)], 0, 100)
        catalog_blocks.commit_block(cat, block_id, BROKER, [run], {("quiet", p): epochs[("quiet", p)]}, now=now)
        meta = SegmentMeta("quiet", p, 1, 10, f"quiet/{p}.ilog", f"quiet/{p}.index", ILOG_BYTES, INDEX_BYTES, 1, 2,
                           now, epochs[("quiet", p)])
        catalog_segments.segment_copy_started(cat, meta, now=now)
        catalog_segments.segment_copy_finished(cat, "quiet", p, 1, epochs[("quiet", p)], now=now)
    counting = StatementCountingCatalog(acat)
    sink = _Sink()
    clock = ManualClock(start_ms=now.timestamp() * 1000)
    tier = RemoteTier(s3_store, counting, sink, metrics=Metrics(), state=led_state(epochs, committed_seq=1 << 62),
                      fence=lambda tp, epoch, reason: None, grace=timedelta(minutes=10), clock=clock)
    led = [(TopicPartition(TOPIC, 0), TopicConfig(remote_retention_secs=90 * 60))]
    led += [(TopicPartition("quiet", p), TopicConfig(remote_retention_secs=86400, remote_retention_bytes=2000))
            for p in range(QUIET)]
    configure(tier.state, led)
    return metas, tier, counting, sink, clock, led


def _check_all(cat, before: set[str] | None = None) -> set[str]:
    """`tiered catalog check`: the quiet topic is clean; `logs` keeps the double locations of its history's runs
    (from before copies pruned them, see _history) and a pass adds no problem to them. Returns logs' problems."""
    from tiered.catalog.check import check_catalog

    assert check_catalog(cat, "quiet").problems == []
    problems = set(check_catalog(cat, TOPIC).problems)
    if before is not None:
        assert problems <= before, problems - before
    return problems


async def test_a_pass_over_led_partitions_visits_only_those_past_a_limit(s3_store, cat, acat):
    """Of 41 led partitions with a retention, only the one holding an expired segment is read further: a pass with
    nothing to expire is two statements (interrupted deletions, what is past a limit), however many are led. What
    the visited partition's pass does is what enforce_remote_retention does alone."""
    now = T0 + timedelta(hours=2, minutes=1)
    metas, tier, counting, sink, clock, led = await _led(s3_store, cat, acat, now)
    before = _check_all(cat)

    assert await tier.remote_retention_pass() == 1
    assert counting.calls.count("segments_for_remote_retention") == 1  # logs/0 only
    assert _states(cat) == {1: SegmentState.DELETE_FINISHED, 11: SegmentState.COPY_FINISHED,
                            21: SegmentState.COPY_FINISHED}
    assert _state(cat).first_available_seq == 11 and list(sink.moved.values()) == [11]
    assert not await _exists(s3_store, metas[1].object_key) and await _exists(s3_store, metas[11].object_key)
    assert catalog_blocks.find_run(cat, TOPIC, 0, 1).first_seq == 11  # the run below went with it
    assert await s3_store.get(keys.partition_start_key(TOPIC, 0)) == b"11"
    _check_all(cat, before)

    counting.calls.clear()
    clock.advance(60)
    assert await tier.remote_retention_pass() == 0
    assert counting.calls == ["partitions_mid_deletion", "partitions_due_for_retention"]

    # An hour later the second segment of logs is past 90 minutes; a quiet partition grows past 2,000 bytes.
    clock.advance(3600)
    meta = SegmentMeta("quiet", 7, 11, 20, "quiet/7b.ilog", "quiet/7b.index", ILOG_BYTES, INDEX_BYTES, 1, 2,
                       now, catalog_partitions.get_partition_states(cat, "quiet")[7].leader_epoch)
    block_id = catalog_blocks.insert_pending_block(cat, "blocks/quiet/7b.blk", BROKER, 100, now=now)
    catalog_blocks.commit_block(cat, block_id, BROKER, [RunRow("quiet", 7, 11, 11, 20, 10, 1, 2, meta.leader_epoch, 0,
                                                               100)], {("quiet", 7): meta.leader_epoch}, now=now)
    catalog_segments.segment_copy_started(cat, meta, now=now)
    catalog_segments.segment_copy_finished(cat, "quiet", 7, 11, meta.leader_epoch, now=now)
    counting.calls.clear()
    assert await tier.remote_retention_pass() == 2
    assert counting.calls.count("segments_for_remote_retention") == 2
    assert _states(cat)[11] == SegmentState.DELETE_FINISHED
    assert [s.base_seq for s in catalog_segments.list_segments(cat, "quiet", 7, states=(SegmentState.COPY_FINISHED,))] == [11]
    _check_all(cat, before)


async def test_runs_left_below_the_start_by_an_interrupted_pass_are_pruned_by_the_scan(s3_store, cat, acat):
    """A pass that moved the first available seq and deleted the segment, then stopped before its prune, leaves
    runs below the start and nothing past a limit: the pass that scans (its first, then once a grace period) finds
    them and prunes them; the passes in between cost their two statements."""
    from tests.tiering.tier_state import configure
    from tiered.tiering.segments.remote_retention import delete_objects

    now = T0 + timedelta(hours=2, minutes=1)
    metas, tier, counting, sink, clock, led = await _led(s3_store, cat, acat, now)
    led = [(tp, TopicConfig(remote_retention_secs=86400)) for tp, _ in led]  # nothing past a limit
    configure(tier.state, led)
    before = _check_all(cat)
    await tier.remote_retention_pass()  # the first pass scans: nothing below any start yet
    assert "prune_runs_below" not in counting.calls and _state(cat).first_available_seq == 1
    catalog_partitions.set_first_available(cat, TOPIC, 0, 21)
    for base in (1, 11):
        catalog_segments.segment_delete_started(cat, TOPIC, 0, base, now=now)
        await delete_objects(s3_store, catalog_segments.get_segment(cat, TOPIC, 0, base))
        catalog_segments.segment_delete_finished(cat, TOPIC, 0, base, now=now)
    counting.calls.clear()
    clock.advance(60)
    await tier.remote_retention_pass()
    assert counting.calls == ["partitions_mid_deletion", "partitions_due_for_retention"]
    clock.advance(600)
    await tier.remote_retention_pass()
    assert "partitions_with_runs_below_start" in counting.calls and "prune_runs_below" in counting.calls
    assert catalog_blocks.find_run(cat, TOPIC, 0, 1).first_seq == 21
    _check_all(cat, before)


async def test_a_partition_a_limit_stopped_is_visited_again_until_done(s3_store, cat, acat, monkeypatch):
    """A pass that stops at its limit of block runs pruned (`more`) leaves runs below the start and nothing past a
    limit: neither the statement naming what is past a limit nor the scan (once a grace period) names the partition,
    so only the pass's own list of partitions to visit again brings it back, pass after pass, until a visit reaches no
    limit; then the partition costs nothing again."""
    import functools

    from tiered.tiering import remote_tier

    # One run pruned per visit (1000 in a broker): the two runs below the start take two visits.
    monkeypatch.setattr(remote_tier, "enforce_remote_retention",
                        functools.partial(enforce_remote_retention, run_limit=1))
    now = T0 + timedelta(hours=3, minutes=1)  # segments 1 and 11 are past 90 minutes, 21 is not
    metas, tier, counting, sink, clock, led = await _led(s3_store, cat, acat, now)
    before = _check_all(cat)

    assert await tier.remote_retention_pass() == 2
    assert _state(cat).first_available_seq == 21 and sink.moved[led[0][0]] == 21
    assert catalog_blocks.find_run(cat, TOPIC, 0, 1).first_seq == 11  # one of the two runs below 21 pruned

    counting.calls.clear()
    clock.advance(60)  # before the next scan (a grace period): only the list to visit again names logs/0
    assert await tier.remote_retention_pass() == 0
    assert "partitions_with_runs_below_start" not in counting.calls
    assert counting.calls.count("segments_for_remote_retention") == 1 and "prune_runs_below" in counting.calls
    assert catalog_blocks.find_run(cat, TOPIC, 0, 1).first_seq == 21

    # That visit pruned as many runs as its limit, so it is visited once more; it finds nothing left below the start.
    counting.calls.clear()
    clock.advance(60)
    assert await tier.remote_retention_pass() == 0
    assert counting.calls.count("segments_for_remote_retention") == 1 and "prune_runs_below" not in counting.calls

    counting.calls.clear()
    clock.advance(60)
    assert await tier.remote_retention_pass() == 0
    assert counting.calls == ["partitions_mid_deletion", "partitions_due_for_retention"]
    assert _states(cat) == {1: SegmentState.DELETE_FINISHED, 11: SegmentState.DELETE_FINISHED,
                            21: SegmentState.COPY_FINISHED}
    assert not await _exists(s3_store, metas[11].object_key) and await _exists(s3_store, metas[21].object_key)
    _check_all(cat, before)


async def test_a_pass_follows_the_tier_state_as_configs_change_and_partitions_come_and_go(s3_store, cat, acat):
    """The pass walks no led partition: what it asks the catalog about comes from the tier state. A topic whose
    retention is turned on by a config change is expired by the next pass; a partition lost to another broker is
    left alone however far past its limit, and taken up again by the pass after it is claimed back."""
    from tests.tiering.tier_state import configure
    from tiered.topic_partition import TopicPartition

    now = T0 + timedelta(hours=3, minutes=1)  # segments 1 and 11 are past 90 minutes, 21 is not
    metas, tier, counting, sink, clock, led = await _led(s3_store, cat, acat, now)
    logs = TopicPartition(TOPIC, 0)
    before = _check_all(cat)
    configure(tier.state, [(logs, TopicConfig())])  # no retention on logs: nothing asked about it
    assert await tier.remote_retention_pass() == 0
    assert counting.calls.count("segments_for_remote_retention") == 0
    assert _states(cat)[1] == SegmentState.COPY_FINISHED

    epoch = tier.state.epoch_of(logs)
    assert epoch is not None
    tier.state.lose(logs)  # claimed by another broker, which now has the retention configured
    configure(tier.state, [(logs, TopicConfig(remote_retention_secs=90 * 60))])
    clock.advance(60)
    assert await tier.remote_retention_pass() == 0
    assert _states(cat)[1] == SegmentState.COPY_FINISHED  # not this broker's to expire

    tier.state.lead(logs, epoch, TopicConfig(remote_retention_secs=90 * 60), 1 << 62)  # led here again
    clock.advance(60)
    assert await tier.remote_retention_pass() == 2
    assert _states(cat) == {1: SegmentState.DELETE_FINISHED, 11: SegmentState.DELETE_FINISHED,
                            21: SegmentState.COPY_FINISHED}
    _check_all(cat, before)
