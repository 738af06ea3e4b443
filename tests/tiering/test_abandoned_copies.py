"""Cleanup of abandoned copies (tiered.tiering.segments.abandoned_copies) against moto's S3 server and both catalog backends:
a fenced broker's COPY_STARTED row and its objects go once the new leader's pass finds them old enough; a copy the
leader is about to redo is left to it, and finishes; a crash at each step is finished by the next pass; a copy of
the same base after the cleanup works; and a seeded run of random fences, takeovers, copies and passes. After each,
the catalog check is green and every committed seq reads back from the bucket byte for byte."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.clock import ManualClock
from tests.support.polling import eventually
from tests.support.storage_helpers import FakeClock, plain_bundle, storage_config
from tests.tiering.test_remote_compaction import exists
from tests.tiering.tier_state import led_state
from tiered.clock import SYSTEM_CLOCK
from tiered import metrics as m
from tiered.catalog import IllegalTransition, SegmentState, StaleEpoch
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import RunMeta
from tiered.catalog.check import check_partition
from tiered.catalog.segments import SegmentMeta
from tiered.metrics import Metrics
from tiered.protocol.bundle import bundle_seq_range, maybe_record, read_bundle_header
from tiered.storage.partition_log import PartitionLog
from tiered.storage.segment import SealedSegment
from tiered.storage.topic_config import TopicConfig
from tiered.tier_interface import RemoteChunk
from tiered.tiering.objects import keys
from tiered.tiering.segments.abandoned_copies import clean_abandoned_copies
from tiered.tiering.blocks.block_format import encode_block
from tiered.tiering.reads.remote_fetch import RemoteReader
from tiered.tiering.segments.remote_retention import delete_objects
from tiered.tiering.remote_tier import RemoteTier
from tiered.tiering.segments.segment_copier import CopyJob, SegmentCopier, segment_timestamp_bounds
from tiered.tiering.objects.store import StoreError
from tiered.topic_partition import TopicPartition

TOPIC = "events"
TP = TopicPartition(TOPIC, 0)
A, B = 1, 2  # broker ids
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
GRACE = timedelta(minutes=10)
S = SegmentState


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


@dataclass
class Partition:
    """One partition whose sealed segments are all committed, each as one block run holding the segment file's bytes
    (what the durable path leaves), with their objects in the bucket; no segment copied yet."""

    log: PartitionLog
    segments: tuple[SealedSegment, ...]
    data: bytes  # every segment file, in order: what reading the partition from seq 1 must return

    def segment(self, base: int) -> SealedSegment:
        return next(s for s in self.segments if s.base == base)


async def committed_partition(tmp_path, store, cat) -> Partition:
    catalog_topics.create_topic(cat, TOPIC, 1, now=T0)
    epoch = catalog_partitions.claim_partitions(cat, A, TOPIC, [0])[0]
    log = PartitionLog.open(str(tmp_path / "disk"), storage_config(log_segment_bytes=400), now_s=FakeClock())
    for i in range(60):
        log.append(plain_bundle(*(b"message %d.%d" % (i, j) for j in range(3))))
    log.seal_active()
    data = b""
    for seg in log.segments:
        with open(seg.path, "rb") as f:
            records = f.read()
        data += records
        meta = RunMeta(TOPIC, 0, seg.base, seg.base, seg.last, seg.last - seg.base + 1, 1, 1, epoch)
        block, [row] = encode_block([(meta, records)])
        object_key = f"blocks/test/{seg.base:020d}.blk"
        block_id = catalog_blocks.insert_pending_block(cat, object_key, A, len(block), now=T0)
        await store.put(object_key, block)
        catalog_blocks.commit_block(cat, block_id, A, [row], {(TOPIC, 0): epoch}, now=T0)
    return Partition(log, log.segments, data)


def segment_meta(seg: SealedSegment, epoch: int) -> SegmentMeta:
    low, high = segment_timestamp_bounds(seg.path, seg.base, seg.size)
    return SegmentMeta(TOPIC, 0, seg.base, seg.last, keys.segment_key(TOPIC, 0, seg.base, seg.last, seg.freeze_ts),
                       keys.segment_index_key(TOPIC, 0, seg.base, seg.last, seg.freeze_ts), seg.size,
                       seg.index.size_bytes, low, high, datetime.fromtimestamp(seg.freeze_ts, timezone.utc), epoch)


async def start_copy(store, cat, seg: SealedSegment, epoch: int, at: datetime, uploads: int = 2) -> SegmentMeta:
    """What a copier leaves when it stops after COPY_STARTED and `uploads` of the two PUTs (fenced or crashed)."""
    meta = segment_meta(seg, epoch)
    catalog_segments.segment_copy_started(cat, meta, now=at)
    if uploads >= 1:
        await store.put_file(meta.object_key, seg.path)
    if uploads >= 2:
        await store.put_file(meta.index_object_key, seg.index_path)
    return meta


def epoch_now(cat) -> int:
    return catalog_partitions.get_partition_states(cat, TOPIC)[0].leader_epoch


def copier(store, acat, epoch: int, metrics: Metrics | None = None) -> SegmentCopier:
    return SegmentCopier(store, acat, metrics=metrics or Metrics(),
                         state=led_state({(TOPIC, 0): epoch}, committed_seq=1 << 62), on_copied=lambda job: None,
                         fence=lambda key, epoch, reason: None, grace=GRACE, clock=SYSTEM_CLOCK)


async def clean(store, acat, cat, at: datetime, will_copy=lambda base: False, **kwargs):
    return await clean_abandoned_copies(store, acat, TOPIC, 0, epoch_now(cat), at, will_copy=will_copy, grace=GRACE,
                                        **kwargs)




def states(cat) -> dict[int, str]:
    return {s.base_seq: s.state for s in catalog_segments.list_segments(cat, TOPIC, 0)}


async def read_everything(store, acat) -> bytes:
    """The partition read from the bucket from seq 1 to its high-water mark, chunk after chunk, as a consumer would."""
    reader = RemoteReader(store, acat, Metrics(), read_ahead=False, clock=SYSTEM_CLOCK)
    hwmark = (await acat.read(catalog_partitions.get_partition_states, TOPIC))[0].hwmark_seq
    out, seq = b"", 1
    while seq <= hwmark:
        chunk = await reader.fetch(TP, seq, 1 << 20)
        assert isinstance(chunk, RemoteChunk), (seq, chunk)
        data = chunk.data if isinstance(chunk.data, bytes) else b"".join([bytes(p) async for p in chunk.data.pieces()])
        position, last = 0, seq - 1
        while position < len(data):
            start, end = maybe_record(data, position)
            last = bundle_seq_range(read_bundle_header(memoryview(data)[start:end]), last + 1)[1]
            position = end
        out += data
        seq = last + 1
    return out


async def assert_consistent(store, acat, cat, part: Partition) -> None:
    """The catalog check is green, every readable segment's objects are there, and every committed seq reads back
    byte for byte."""
    assert check_partition(cat, TOPIC, 0).problems == []
    for row in catalog_segments.list_segments(cat, TOPIC, 0, states=(S.COPY_FINISHED,)):
        assert await exists(store, row.object_key) and await exists(store, row.index_object_key)
    assert await read_everything(store, acat) == part.data


async def test_a_fenced_broker_s_copy_is_cleaned_after_the_new_leader_takes_over(s3_store, cat, acat, tmp_path):
    part = await committed_partition(tmp_path, s3_store, cat)
    seg = part.segments[1]
    fenced = await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(0))
    catalog_partitions.claim_partitions(cat, B, TOPIC, [0])  # B takes over; A's copy can never finish
    with pytest.raises(StaleEpoch):
        catalog_segments.segment_copy_finished(cat, TOPIC, 0, seg.base, fenced.leader_epoch)

    early = await clean(s3_store, acat, cat, minutes(9))  # within the grace period: a slow upload may be in flight
    assert early.deleted == [] and states(cat) == {seg.base: S.COPY_STARTED}
    report = await clean(s3_store, acat, cat, minutes(11))
    assert [s.base_seq for s in report.deleted] == [seg.base]
    assert states(cat) == {seg.base: S.DELETE_FINISHED}
    assert not await exists(s3_store, fenced.object_key) and not await exists(s3_store, fenced.index_object_key)
    assert (await clean(s3_store, acat, cat, minutes(12))).deleted == []  # nothing left to do
    await assert_consistent(s3_store, acat, cat, part)

    # The base is not lost for good: a later copy of it (here A's own disk, leading again: the same keys) works.
    catalog_partitions.claim_partitions(cat, A, TOPIC, [0])
    await copier(s3_store, acat, epoch_now(cat)).copy(CopyJob(TOPIC, 0, seg))
    assert states(cat) == {seg.base: S.COPY_FINISHED}
    await assert_consistent(s3_store, acat, cat, part)


async def test_a_copy_the_leader_will_redo_is_left_to_it_and_finishes(s3_store, cat, acat, tmp_path):
    part = await committed_partition(tmp_path, s3_store, cat)
    seg = part.segments[0]
    await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(0), uploads=1)  # crashed mid-upload
    catalog_partitions.claim_partitions(cat, A, TOPIC, [0])  # the same broker, restarted, leads again
    leader = copier(s3_store, acat, epoch_now(cat))
    leader.enqueue(TP, seg)
    report = await clean(s3_store, acat, cat, minutes(30), will_copy=lambda base: leader.will_copy(TP, base))
    assert report.deleted == [] and states(cat) == {seg.base: S.COPY_STARTED}
    await leader.copy(CopyJob(TOPIC, 0, seg))
    assert states(cat) == {seg.base: S.COPY_FINISHED}
    # Taken over by the new epoch's copy, the row is not an abandoned copy any more, whatever the copier's queue.
    assert (await clean(s3_store, acat, cat, minutes(60))).deleted == []
    await assert_consistent(s3_store, acat, cat, part)


async def test_a_copy_started_meanwhile_under_the_current_epoch_is_not_touched(s3_store, cat, acat, tmp_path):
    part = await committed_partition(tmp_path, s3_store, cat)
    seg = part.segments[0]
    await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(0))
    catalog_partitions.claim_partitions(cat, B, TOPIC, [0])
    # The page is read with the old row; before the cleanup's transaction, B's copier takes the row over.
    original = acat.write

    async def copy_first(fn, *args, **kwargs):
        if fn is catalog_segments.segment_copy_abandoned:
            await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(20), uploads=0)
        return await original(fn, *args, **kwargs)

    acat.write = copy_first
    try:
        report = await clean(s3_store, acat, cat, minutes(30))
    finally:
        acat.write = original
    assert report.deleted == [] and states(cat) == {seg.base: S.COPY_STARTED}
    meta = segment_meta(seg, epoch_now(cat))
    assert await exists(s3_store, meta.object_key)
    await copier(s3_store, acat, epoch_now(cat)).copy(CopyJob(TOPIC, 0, seg))
    await assert_consistent(s3_store, acat, cat, part)


async def test_a_crash_between_each_step_is_finished_by_the_next_pass(s3_store, s3_faults, cat, acat, tmp_path):
    part = await committed_partition(tmp_path, s3_store, cat)
    first, second = part.segments[0], part.segments[1]
    metas = [await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(0)) for seg in (first, second)]
    catalog_partitions.claim_partitions(cat, B, TOPIC, [0])

    # Crash after DELETE_STARTED: every attempt of the DeleteObjects request fails.
    s3_faults.fail_next(3, 500, match=lambda method, path: method == "POST" and "delete" in path)
    with pytest.raises(StoreError):
        await clean(s3_store, acat, cat, minutes(11))
    assert states(cat) == {first.base: S.DELETE_STARTED, second.base: S.COPY_STARTED}
    assert await exists(s3_store, metas[0].object_key)
    # Meanwhile a copy of that base is refused: the objects being deleted have its keys.
    with pytest.raises(IllegalTransition):
        await copier(s3_store, acat, epoch_now(cat)).copy(CopyJob(TOPIC, 0, first))
    await assert_consistent(s3_store, acat, cat, part)

    # Crash after the objects are deleted, before DELETE_FINISHED.
    epoch = epoch_now(cat)
    catalog_segments.segment_copy_abandoned(cat, TOPIC, 0, second.base, epoch, older_than=minutes(11), now=minutes(11))
    await s3_store.delete_many([metas[1].object_key, metas[1].index_object_key])
    assert states(cat) == {first.base: S.DELETE_STARTED, second.base: S.DELETE_STARTED}

    report = await clean(s3_store, acat, cat, minutes(12))
    assert sorted(s.base_seq for s in report.finished) == [first.base, second.base] and report.deleted == []
    assert states(cat) == {first.base: S.DELETE_FINISHED, second.base: S.DELETE_FINISHED}
    for meta in metas:
        assert not await exists(s3_store, meta.object_key) and not await exists(s3_store, meta.index_object_key)
    # A repeated pass changes nothing; the copy of the first base now goes through.
    assert (await clean(s3_store, acat, cat, minutes(13))).finished == []
    await copier(s3_store, acat, epoch_now(cat)).copy(CopyJob(TOPIC, 0, first))
    await assert_consistent(s3_store, acat, cat, part)


async def test_a_pass_reads_one_page_and_the_next_continues(s3_store, cat, acat, tmp_path):
    part = await committed_partition(tmp_path, s3_store, cat)
    for seg in part.segments[:5]:
        await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(0), uploads=0)
    catalog_partitions.claim_partitions(cat, B, TOPIC, [0])
    cursor, passes = 0, 0
    while S.COPY_STARTED in states(cat).values():
        report = await clean(s3_store, acat, cat, minutes(20), after_base_seq=cursor, page=2, limit=1)
        assert len(report.deleted) <= 1
        cursor, passes = report.next_after_base_seq, passes + 1
        assert passes <= 10
    assert set(states(cat).values()) == {S.DELETE_FINISHED} and passes >= 5


async def test_a_copy_retention_deleted_is_not_brought_back(s3_store, cat, acat, tmp_path):
    """The first available seq tells a cleaned-up copy (a new copy may take its row over) from a segment remote
    retention deleted (its seqs are gone): the latter's DELETE_FINISHED row refuses a copy, as before."""
    part = await committed_partition(tmp_path, s3_store, cat)
    seg = part.segments[0]
    await copier(s3_store, acat, epoch_now(cat)).copy(CopyJob(TOPIC, 0, seg))
    catalog_partitions.set_first_available(cat, TOPIC, 0, seg.last + 1)
    catalog_segments.segment_delete_started(cat, TOPIC, 0, seg.base)
    catalog_segments.segment_delete_finished(cat, TOPIC, 0, seg.base)
    with pytest.raises(IllegalTransition):
        catalog_segments.segment_copy_started(cat, segment_meta(seg, epoch_now(cat)))
    # The broker's copier, given that local segment again (a restart, with local retention longer than remote),
    # drops it once instead of retrying forever: counted as done, no failure, no object written back.
    row = catalog_segments.get_segment(cat, TOPIC, 0, seg.base)
    await delete_objects(s3_store, row)  # as the retention pass did between its two transitions
    metrics = Metrics()
    again = copier(s3_store, acat, epoch_now(cat), metrics=metrics)
    await again.copy(CopyJob(TOPIC, 0, seg))
    assert again.is_copied(TP, seg.base) and metrics.count(m.SEGMENT_COPY_FAILURES) == 0
    assert states(cat)[seg.base] == S.DELETE_FINISHED
    assert not await exists(s3_store, row.object_key) and not await exists(s3_store, row.index_object_key)
    # A refusal for another reason still fails the copy: a row mid-deletion above the history's start.
    second = part.segments[1]
    await again.copy(CopyJob(TOPIC, 0, second))
    catalog_segments.segment_delete_started(cat, TOPIC, 0, second.base)
    again.copied.discard((TOPIC, 0, second.base))
    with pytest.raises(IllegalTransition):
        await again.copy(CopyJob(TOPIC, 0, second))


@pytest.mark.parametrize("seed", [7])
async def test_random_fences_takeovers_copies_and_passes(s3_store, cat, acat, tmp_path, seed):
    """20 rounds of random events on one partition led in turn by A and B, both disks holding its segments: a copy
    started and then fenced (or crashed) under the current epoch, a takeover, a whole copy by the leader (of a base
    whose row may be abandoned, mid-nothing or cleaned up), and a cleanup pass at a random later time with a random
    share of the segments queued at the leader. After every round the catalog is consistent and every committed
    seq reads back; at the end, past the grace period, no abandoned copy or object of one is left."""
    rng = random.Random(seed)
    part = await committed_partition(tmp_path, s3_store, cat)
    now = 0.0
    leader = A
    seen = {"cleaned": 0, "copied over a cleaned-up copy": 0, "left to the leader": 0}
    for _ in range(20):
        now += rng.uniform(0, 12)
        event = rng.choice(["fenced copy", "takeover", "copy", "pass", "pass"])
        # A few segments, so that events meet on the same bases.
        pending = [s for s in part.segments[:4] if states(cat).get(s.base) != S.COPY_FINISHED]
        if event == "fenced copy" and pending:
            seg = rng.choice(pending)
            if states(cat).get(seg.base) in (None, S.COPY_STARTED, S.DELETE_FINISHED):
                await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(now), uploads=rng.randint(0, 2))
            leader = B if leader == A else A
            catalog_partitions.claim_partitions(cat, leader, TOPIC, [0])
        elif event == "takeover":
            leader = B if leader == A else A
            catalog_partitions.claim_partitions(cat, leader, TOPIC, [0])
        elif event == "copy" and pending:
            seg = rng.choice(pending)
            seen["copied over a cleaned-up copy"] += states(cat).get(seg.base) == S.DELETE_FINISHED
            try:
                await copier(s3_store, acat, epoch_now(cat)).copy(CopyJob(TOPIC, 0, seg))
            except IllegalTransition:
                assert states(cat)[seg.base] == S.DELETE_STARTED  # mid-deletion only: tried again later
        else:
            queued = {s.base for s in part.segments[:4] if rng.random() < 0.3}
            before = catalog_segments.list_segments(cat, TOPIC, 0, states=(S.COPY_STARTED,))
            report = await clean(s3_store, acat, cat, minutes(now), will_copy=lambda base: base in queued)
            seen["cleaned"] += len(report.deleted)
            seen["left to the leader"] += sum(r.base_seq in queued and r.updated_at <= minutes(now - 10)
                                              and r.leader_epoch < epoch_now(cat) for r in before)
            assert not {r.base_seq for r in report.deleted} & queued
        await assert_consistent(s3_store, acat, cat, part)

    assert all(seen.values()), seen  # the seed exercises every path
    await clean(s3_store, acat, cat, minutes(now + 11))
    rows = catalog_segments.list_segments(cat, TOPIC, 0)
    epoch = epoch_now(cat)
    assert [r.base_seq for r in rows if r.state == S.COPY_STARTED and r.leader_epoch < epoch] == []
    assert [r.base_seq for r in rows if r.state == S.DELETE_STARTED] == []
    named = {k for r in rows if r.state in (S.COPY_STARTED, S.COPY_FINISHED) for k in (r.object_key, r.index_object_key)}
    in_bucket = {info.object_key async for info in s3_store.list("segments/")}
    assert in_bucket <= named
    await assert_consistent(s3_store, acat, cat, part)


class Sink:
    def copied(self, tp, base, last):
        pass

    def first_available_moved(self, tp, seq):
        pass


async def test_the_leader_s_pass_cleans_and_its_copier_waits_for_a_deletion_in_progress(s3_store, cat, acat,
                                                                                         tmp_path):
    """In the broker's remote tier: the retention pass (here with no retention configured) finishes an interrupted
    cleanup and cleans a fenced copy, counted; the copier, refused while the row of its segment's base is mid-deletion,
    keeps the segment and copies it once the pass finished. Abandoned copies are looked for once a grace period;
    interrupted deletions are finished at every pass."""
    part = await committed_partition(tmp_path, s3_store, cat)
    first, second, third, fourth = part.segments[:4]
    for seg in (first, second):
        await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(0))
    for seg in (third, fourth):
        await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(5))
    epoch = catalog_partitions.claim_partitions(cat, B, TOPIC, [0])[0]
    catalog_segments.segment_copy_abandoned(cat, TOPIC, 0, first.base, epoch, older_than=minutes(11), now=minutes(11))
    clock = ManualClock(start_ms=minutes(11).timestamp() * 1000)
    metrics = Metrics()
    tier = RemoteTier(s3_store, acat, Sink(), metrics=metrics, state=led_state({(TOPIC, 0): epoch},
                                                                               committed_seq=1 << 62),
                      fence=lambda key, epoch, reason: None, grace=GRACE, clock=clock)
    tier.copier.enqueue(TP, first)
    copying = asyncio.ensure_future(tier.copier.run())
    try:
        await eventually(lambda: metrics.count(m.SEGMENT_COPY_FAILURES) == 1 and clock.sleeping == 1,
                         what="the copy refused by the row mid-deletion, waiting to try again")
        assert states(cat)[first.base] == S.DELETE_STARTED

        await tier.remote_retention_pass()
        assert states(cat) == {first.base: S.DELETE_FINISHED, second.base: S.DELETE_FINISHED,
                               third.base: S.COPY_STARTED, fourth.base: S.COPY_STARTED}  # those two are too young
        assert metrics.count(m.ABANDONED_COPIES_DELETED) == 1  # the second; the first was an interrupted pass's

        clock.advance(1.0)
        await eventually(lambda: tier.copier.is_copied(TP, first.base), what="the copy after the deletion")
    finally:
        copying.cancel()
    assert states(cat)[first.base] == S.COPY_FINISHED

    # A pass 60 s later does not look for abandoned copies, but finishes a deletion an interrupted pass left.
    catalog_segments.segment_copy_abandoned(cat, TOPIC, 0, fourth.base, epoch, older_than=minutes(16), now=minutes(16))
    clock.advance(60)
    await tier.remote_retention_pass()
    assert (states(cat)[third.base], states(cat)[fourth.base]) == (S.COPY_STARTED, S.DELETE_FINISHED)
    # A grace period after the last look, the next pass looks again.
    clock.advance(GRACE.total_seconds())
    await tier.remote_retention_pass()
    assert states(cat)[third.base] == S.DELETE_FINISHED and metrics.count(m.ABANDONED_COPIES_DELETED) == 2
    await assert_consistent(s3_store, acat, cat, part)


class CountingCatalog:
    """The real async catalog, counting the reads that look for interrupted deletions."""

    def __init__(self, acat) -> None:
        self.acat = acat
        self.leftover_looks = 0

    def __getattr__(self, name):
        return getattr(self.acat, name)

    async def read(self, fn, *args, **kwargs):
        if fn is catalog_segments.list_segments and kwargs.get("states") == (S.DELETE_STARTED,):
            self.leftover_looks += 1
        return await self.acat.read(fn, *args, **kwargs)


async def test_a_pass_with_remote_retention_looks_for_interrupted_deletions_once(s3_store, cat, acat, tmp_path):
    """With remote retention configured, the cleanup scan or retention finishes interrupted deletions, never both:
    one look per partition and pass, and the interrupted deletion is finished either way."""
    part = await committed_partition(tmp_path, s3_store, cat)
    first, second = part.segments[:2]
    metas = [await start_copy(s3_store, cat, seg, epoch_now(cat), minutes(0)) for seg in (first, second)]
    epoch = catalog_partitions.claim_partitions(cat, B, TOPIC, [0])[0]
    counting = CountingCatalog(acat)
    clock = ManualClock(start_ms=minutes(1).timestamp() * 1000)
    config = TopicConfig(remote_retention_secs=10 * 365 * 86400)  # nothing expires
    tier = RemoteTier(s3_store, counting, Sink(), metrics=Metrics(), state=led_state({(TOPIC, 0): epoch},
                                                                                    committed_seq=1 << 62,
                                                                                    config=config),
                      fence=lambda key, epoch, reason: None, grace=GRACE, clock=clock)
    for seg, meta, scan in ((first, metas[0], True), (second, metas[1], False)):
        catalog_segments.segment_copy_abandoned(cat, TOPIC, 0, seg.base, epoch, older_than=minutes(1),
                                                now=minutes(1))
        counting.leftover_looks = 0
        await tier.remote_retention_pass()
        assert counting.leftover_looks == 1, f"scan={scan}"
        assert states(cat)[seg.base] == S.DELETE_FINISHED
        assert not await exists(s3_store, meta.object_key) and not await exists(s3_store, meta.index_object_key)
        clock.advance(60)  # the next pass is within the grace period: no cleanup scan
    await assert_consistent(s3_store, acat, cat, part)


class StatementCountingCatalog:
    """The real async catalog, counting every read and write the pass sends."""

    def __init__(self, acat) -> None:
        self.acat = acat
        self.calls: list[str] = []

    def __getattr__(self, name):
        return getattr(self.acat, name)

    async def read(self, fn, *args, **kwargs):
        self.calls.append(fn.__name__)
        return await self.acat.read(fn, *args, **kwargs)

    async def write(self, fn, *args, **kwargs):
        self.calls.append(fn.__name__)
        return await self.acat.write(fn, *args, **kwargs)


async def test_a_pass_over_partitions_with_nothing_to_do_costs_two_statements(s3_store, cat, acat, tmp_path):
    """A pass, cleanup scan included, over many led partitions with no interrupted deletion and no stale copy reads
    two statements (which partitions have either), however many partitions are led; the one partition with an
    abandoned copy is the only one read further, and its copy is deleted."""
    part = await committed_partition(tmp_path, s3_store, cat)
    meta = await start_copy(s3_store, cat, part.segments[0], epoch_now(cat), minutes(0))
    catalog_topics.create_topic(cat, "quiet", 64)
    epochs = catalog_partitions.claim_partitions(cat, B, "quiet", range(64))
    epochs = {("quiet", p): e for p, e in epochs.items()}
    epoch = catalog_partitions.claim_partitions(cat, B, TOPIC, [0])[0]
    counting = StatementCountingCatalog(acat)
    clock = ManualClock(start_ms=(minutes(0) + GRACE + timedelta(minutes=1)).timestamp() * 1000)
    tier = RemoteTier(s3_store, counting, Sink(), metrics=Metrics(), state=led_state(epochs, committed_seq=1 << 62),
                      fence=lambda key, epoch, reason: None, grace=GRACE, clock=clock)
    await tier.remote_retention_pass()  # its abandoned copy is not this broker's to clean: TP is not led here
    assert sorted(counting.calls) == ["partitions_mid_deletion", "partitions_with_stale_copies"]
    counting.calls.clear()
    tier.state.lead(TP, epoch, TopicConfig(), 1 << 62)  # claimed here: the next scan cleans it
    await tier.remote_retention_pass()  # within the grace period: no scan
    assert counting.calls == ["partitions_mid_deletion"]
    clock.advance(GRACE.total_seconds())
    await tier.remote_retention_pass()
    assert states(cat)[part.segments[0].base] == S.DELETE_FINISHED
    assert not await exists(s3_store, meta.object_key)
    assert "list_segments" in counting.calls and len(counting.calls) < 64
    await assert_consistent(s3_store, acat, cat, part)
