"""Compaction of remote segments against moto's S3 server and both catalog backends: from local copies and from the
bucket alone, against the reference model; the catalog check after every swap; a crash at every step leaving the
old or the new set; a reader holding old locations; a new leader's epoch refusing the swap."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.compaction import Model, append_workload, log_messages, random_workload, rows
from tests.support.storage_helpers import FakeClock, storage_config
from tests.tiering.tier_state import led_state
from tiered.clock import SYSTEM_CLOCK
from tiered.catalog import blocks as catalog_blocks
from tiered.catalog import partitions as catalog_partitions
from tiered.catalog import segments as catalog_segments
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import RunRow
from tiered.catalog.check import check_partition
from tiered.catalog.compaction import SwapRefused, readable_segments, swap_compacted_segments
from tiered.catalog.segments import SegmentMeta
from tiered.protocol.bundle import decode_bundle, maybe_record
from tiered.protocol.varint import read_varint
from tiered.storage.compaction import compact_partition
from tiered.storage.partition_log import PartitionLog
from tiered.tiering.objects import keys
from tiered.tiering.recovery.reconciler import reconcile, sweep_deleted_blocks
from tiered.tiering.compaction.remote_compaction import RemoteCompactor, _groups_from_local
from tiered.tiering.segments.segment_copier import CopyJob, SegmentCopier
from tiered.storage.index import SparseIndex
from tiered.storage.segment import SealedSegment
from tiered.catalog.segments import SegmentRow
from tiered.tiering.reads.remote_fetch import RemoteReader
from tiered.tier_interface import RemoteChunk
from tiered.metrics import Metrics
from tiered.tiering.segments.segment_copier import segment_timestamp_bounds
from tiered.tiering.objects.store import ObjectNotFound
from tiered.topic_partition import TopicPartition

BROKER = 1
RETENTION_S = 100
CONFIG = storage_config(log_segment_bytes=600, log_index_interval_bytes=128, log_cleanup_policy="cleanup",
                        log_cleaner_delete_retention_secs=RETENTION_S)
NOW_S = 1_800_000_000.0
GRACE = timedelta(minutes=10)


class FixedClock:
    """The wall clock of a pass (tombstone retention, delete_after), stopped at `now_s`."""

    def __init__(self, now_s: float):
        self.now_s = now_s

    def now_ms(self) -> float:
        return self.now_s * 1000

    def monotonic(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


def open_log(directory) -> PartitionLog:
    return PartitionLog.open(str(directory), CONFIG, now_s=FakeClock())


async def copy_history(store, cat, topic: str, plog: PartitionLog) -> int:
    """What the durable path and the copier leave: block runs committed up to the last sealed seq, then every
    sealed segment copied (COPY_FINISHED prunes the runs it answers for). Returns the leader epoch."""
    catalog_topics.create_topic(cat, topic, 1, now=at(NOW_S))
    epoch = catalog_partitions.claim_partitions(cat, BROKER, topic, [0])[0]
    committed = 0
    for segment in plog.segments:
        block_id = catalog_blocks.insert_pending_block(cat, f"blocks/{topic}-{segment.base}.blk", BROKER, 10,
                                                       now=at(NOW_S))
        run = RunRow(topic, 0, committed + 1, segment.base, segment.last, 1, 0, 0, epoch, 0, 10)
        catalog_blocks.commit_block(cat, block_id, BROKER, [run], {(topic, 0): epoch}, now=at(NOW_S))
        committed = segment.last
        low, high = segment_timestamp_bounds(segment.path, segment.base, segment.size)
        meta = SegmentMeta(topic, 0, segment.base, segment.last,
                           keys.segment_key(topic, 0, segment.base, segment.last, segment.freeze_ts),
                           keys.segment_index_key(topic, 0, segment.base, segment.last, segment.freeze_ts),
                           segment.size, segment.index.size_bytes, low, high, at(segment.freeze_ts), epoch)
        catalog_segments.segment_copy_started(cat, meta, now=at(NOW_S))
        await store.put_file(meta.object_key, segment.path)
        await store.put_file(meta.index_object_key, segment.index_path)
        catalog_segments.segment_copy_finished(cat, topic, 0, segment.base, epoch, grace=GRACE, now=at(NOW_S))
    return epoch


async def remote_messages(store, cat, topic: str) -> list:
    """Every message the readable remote segments hold, read from the bucket."""
    out = []
    for row in readable_segments(cat, topic, 0):
        out.extend(decode_segment(await store.get(row.object_key), row.base_seq))
    return out


def decode_segment(data: bytes, base: int) -> list:
    messages, position, next_seq = [], 0, base
    while position < len(data):
        length, start = read_varint(data, position)
        got = maybe_record(data, position)
        assert got is not None
        bundle = data[got[0]:got[1]]
        decoded = decode_bundle(bundle, next_seq)
        messages.extend(decoded)
        next_seq = decoded[-1].seq + 1
        position = start + length
    return messages


async def crash_at_every_step(run_pass: Callable[[Callable[[str], None]], Awaitable[object]],
                             sample: random.Random | None = None) -> AsyncIterator[str]:
    """Runs `run_pass(on_step)` again and again, the n-th run dying at the n-th step it announces (KeyboardInterrupt:
    no handler catches it, so the pass stops there as under kill -9); yields the step each run died at, and ends once
    a run gets through. The caller checks what a crash left between two runs.

    With `sample`, a seeded sample of the steps instead, spread over the whole pass: each run dies 1 to 5 steps
    further than the one before (about one step in three). The tests crash every step on one catalog backend and
    a sample on the other (`every_step_on`): what a crash leaves depends on the pass, the backend only commits it."""
    crash_at = sample.randrange(3) if sample else 0
    while True:
        seen: list[str] = []

        def crash(name: str) -> None:
            seen.append(name)
            if len(seen) == crash_at + 1:
                raise KeyboardInterrupt(name)

        try:
            await run_pass(crash)
        except KeyboardInterrupt:
            yield seen[-1]
        else:
            return
        crash_at += 1 + sample.randrange(5) if sample else 1


def every_step_on(catalog_url: str, backend: str, seed: int) -> random.Random | None:
    """For crash_at_every_step: None (every step) on `backend` ("sqlite" or "postgresql"), else a seeded sample."""
    return None if catalog_url.startswith(backend) else random.Random(seed)


async def assert_bucket_holds_what_the_catalog_names(store, acat, cat, topic: str, partition: int) -> None:
    """After the grace period: the reconciler deletes uploads of crashed passes that were never swapped in, the sweep
    deletes what swaps replaced, and the partition's segment objects are then exactly those its catalog rows name."""
    later = at(NOW_S) + GRACE + timedelta(minutes=1)
    await sweep_deleted_blocks(store, acat, later)
    await reconcile(store, acat, later, grace=GRACE)
    listed = {o.object_key async for o in store.list(keys.partition_segments_prefix(topic, partition))}
    assert listed == {k for r in readable_segments(cat, topic, partition) for k in (r.object_key, r.index_object_key)}


async def exists(store, object_key: str) -> bool:
    try:
        await store.head(object_key)
        return True
    except ObjectNotFound:
        return False


def history(tmp_path, seed: int = 1, bundles: int = 120) -> tuple[PartitionLog, list]:
    plog = open_log(tmp_path / "local")
    append_workload(plog, random_workload(random.Random(seed), bundles, 12))
    plog.seal_active()
    return plog, log_messages(plog)


def compactor(store, acat, tmp_path, now_s: float = NOW_S) -> RemoteCompactor:
    return RemoteCompactor(store, acat, broker_id=BROKER, workdir=str(tmp_path / "work"), grace=GRACE,
                           clock=FixedClock(now_s))


async def test_local_copies_replace_the_remote_segments(s3_store, cat, acat, tmp_path):
    plog, before = history(tmp_path)
    epoch = await copy_history(s3_store, cat, "t", plog)
    old_rows = readable_segments(cat, "t", 0)
    expected = Model(RETENTION_S * 1000).compact(before, int(NOW_S * 1000))
    local = compact_partition(plog, NOW_S, force=True)
    assert local.groups and rows(log_messages(plog)) == rows(expected)

    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, plog, epoch)
    assert report.groups and report.stopped is None and report.downloaded_bytes == 0
    assert report.bytes_after < report.bytes_before == sum(r.total_bytes for r in old_rows
                                                           if any(r.object_key in old for old, _ in report.swapped))
    assert rows(await remote_messages(s3_store, cat, "t")) == rows(expected)
    check = check_partition(cat, "t", 0)
    assert check.problems == [] and check.hwmark == plog.segments[-1].last
    new_rows = readable_segments(cat, "t", 0)
    state = catalog_partitions.get_partition_states(cat, "t")[0]
    assert state.remote_bytes == sum(r.total_bytes for r in new_rows)
    assert [(r.base_seq, r.last_seq, r.size_bytes) for r in new_rows] == [(s.base, s.last, s.size)
                                                                          for s in plog.segments]

    # The old objects wait for their grace period as `deleting` blocks; a reader that looked them up still reads them.
    replaced = [r for r in old_rows if r.object_key not in {n.object_key for n in new_rows}]
    assert replaced and all([await exists(s3_store, r.object_key) for r in replaced])
    assert decode_segment(await s3_store.get(replaced[0].object_key), replaced[0].base_seq)
    assert not [b for b in await sweep_deleted_blocks(s3_store, acat, at(NOW_S + 60))
                if b.object_key.startswith(keys.SEGMENTS_PREFIX)]
    swept = await sweep_deleted_blocks(s3_store, acat, at(NOW_S) + GRACE + timedelta(seconds=1))
    swept_segments = {b.object_key for b in swept if b.object_key.startswith(keys.SEGMENTS_PREFIX)}
    assert swept_segments == {k for r in replaced for k in (r.object_key, r.index_object_key)}
    assert not any([await exists(s3_store, r.object_key) for r in replaced])
    assert rows(await remote_messages(s3_store, cat, "t")) == rows(expected)

    # In sync: a second pass changes nothing.
    again = await compactor(s3_store, acat, tmp_path).compact("t", 0, plog, epoch)
    assert again.groups == 0 and again.stopped is None
    plog.close()


async def test_history_only_in_the_bucket_is_compacted_from_the_bucket(s3_store, cat, acat, tmp_path):
    plog, before = history(tmp_path, seed=2)
    epoch = await copy_history(s3_store, cat, "t", plog)
    plog.close()
    empty = open_log(tmp_path / "new-leader")  # a broker whose disk holds none of it
    model = Model(RETENTION_S * 1000)
    expected = model.compact(before, int(NOW_S * 1000))
    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, empty, epoch)
    assert report.groups and report.downloaded_bytes > 0 and report.stopped is None
    assert rows(await remote_messages(s3_store, cat, "t")) == rows(expected)
    assert check_partition(cat, "t", 0).problems == []
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())

    # Nothing new: no pass. Asked for by hand after the tombstones' retention: they go (the checkpoint kept when
    # the first pass ran).
    assert (await compactor(s3_store, acat, tmp_path).compact("t", 0, empty, epoch)).groups == 0
    later = NOW_S + RETENTION_S + 1
    forced = await compactor(s3_store, acat, tmp_path, later).compact("t", 0, empty, epoch, force=True)
    expected_later = model.compact(expected, int(later * 1000))
    assert forced.groups and rows(await remote_messages(s3_store, cat, "t")) == rows(expected_later)
    assert any(m.key and not m.value for m in expected) and not any(m.key and not m.value for m in expected_later[:-1])
    assert check_partition(cat, "t", 0).problems == []
    empty.close()


# Every step on PostgreSQL, a sample on SQLite (the kill -9 of a real process at every step of this pass runs on SQLite
# in test_bucket_compaction.py).
@pytest.mark.parametrize("source", ["local", "bucket"])
async def test_a_crash_at_every_step_leaves_the_old_or_the_new_set(s3_store, catalog_url, cat, acat, tmp_path,
                                                                  source):
    sample = every_step_on(catalog_url, "postgresql", seed=3)
    plog, before = history(tmp_path, seed=3, bundles=30)
    original = {m.seq: (m.key, m.value) for m in before}
    expected = Model(RETENTION_S * 1000).compact(before, int(NOW_S * 1000))
    kept = {m.seq for m in expected}
    epoch = await copy_history(s3_store, cat, "t", plog)
    if source == "local":
        compact_partition(plog, NOW_S, force=True)
        reader = plog
    else:
        plog.close()
        reader = open_log(tmp_path / "new-leader")

    steps: list[str] = []
    async for step in crash_at_every_step(
        lambda crash: compactor(s3_store, acat, tmp_path).compact("t", 0, reader, epoch, force=True, on_step=crash),
        sample,
    ):
        steps.append(step)
        # Old or new, group by group: every readable remote segment holds either its original messages or the
        # model's for its seqs, and the catalog check passes.
        assert check_partition(cat, "t", 0).problems == []
        for row in readable_segments(cat, "t", 0):
            got = decode_segment(await s3_store.get(row.object_key), row.base_seq)
            span = range(row.base_seq, row.last_seq + 1)
            assert all(original[m.seq] == (m.key, m.value) for m in got)
            assert {m.seq for m in got} in ({s for s in original if s in span}, {s for s in kept if s in span})
    if sample is None:
        assert len(steps) >= 2
        assert any(s.startswith("swap") for s in steps) and any(s.startswith("upload") for s in steps)
    else:
        assert steps  # at least one crash was checked
    assert rows(await remote_messages(s3_store, cat, "t")) == rows(expected)
    assert check_partition(cat, "t", 0).problems == []
    await assert_bucket_holds_what_the_catalog_names(s3_store, acat, cat, "t", 0)
    reader.close()


async def test_a_new_leaders_epoch_refuses_the_swap(s3_store, cat, acat, tmp_path):
    plog, _ = history(tmp_path, seed=4)
    epoch = await copy_history(s3_store, cat, "t", plog)
    compact_partition(plog, NOW_S, force=True)
    before = readable_segments(cat, "t", 0)
    catalog_partitions.claim_partitions(cat, 2, "t", [0])  # another broker claims the partition
    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, plog, epoch)
    assert report.groups == 0 and "epoch" in report.stopped
    assert readable_segments(cat, "t", 0) == before
    plog.close()


def test_the_swap_checks_the_rows_and_the_tiling(cat):
    catalog_topics.create_topic(cat, "t", 1, now=at(NOW_S))
    epoch = catalog_partitions.claim_partitions(cat, BROKER, "t", [0])[0]

    def meta(base: int, last: int, name: str) -> SegmentMeta:
        return SegmentMeta("t", 0, base, last, f"segments/t/0/{name}.ilog", f"segments/t/0/{name}.index", 10, 1, 0, 0,
                           at(NOW_S), epoch)

    for base, last in ((1, 10), (11, 20)):
        block_id = catalog_blocks.insert_pending_block(cat, f"blocks/{base}.blk", BROKER, 10, now=at(NOW_S))
        catalog_blocks.commit_block(cat, block_id, BROKER, [RunRow("t", 0, base, base, last, 1, 0, 0, epoch, 0, 10)],
                                    {("t", 0): epoch}, now=at(NOW_S))
        catalog_segments.segment_copy_started(cat, meta(base, last, f"old{base}"), now=at(NOW_S))
        catalog_segments.segment_copy_finished(cat, "t", 0, base, epoch, now=at(NOW_S))
    swap = lambda old, new: swap_compacted_segments(cat, "t", 0, epoch, old, new, broker_id=BROKER,  # noqa: E731
                                                     now=at(NOW_S))
    with pytest.raises(SwapRefused):
        swap([1, 11], [meta(1, 15, "a")])  # ends short
    with pytest.raises(SwapRefused):
        swap([1, 11], [meta(1, 12, "b"), meta(11, 20, "c")])  # two locations for 11 and 12
    with pytest.raises(SwapRefused):
        swap([1, 5], [meta(1, 20, "d")])  # no such row
    result = swap([1, 11], [meta(1, 20, "e")])
    assert (result.bytes_before, result.bytes_after, result.objects_deleting) == (22, 11, 4)
    # New segments with a jump between them: the later one answers for the seqs in the jump.
    result = swap([1], [meta(1, 8, "g"), meta(12, 20, "h")])
    assert [(r.from_seq, r.base_seq, r.last_seq) for r in result.added] == [(1, 1, 8), (9, 12, 20)]
    assert check_partition(cat, "t", 0).problems == []
    assert check_partition(cat, "t", 0).problems == []
    with pytest.raises(SwapRefused):
        swap([1, 11], [meta(1, 20, "f")])  # a retry after it landed: the rows are gone
    assert catalog_partitions.get_partition_states(cat, "t")[0].remote_bytes == 22
    due = catalog_blocks.blocks_to_sweep(cat, at(NOW_S) + GRACE, 10)
    swept = sorted(b.object_key for b in due if b.object_key.startswith("segments/"))
    assert swept == sorted(f"segments/t/0/{name}{s}" for name in ("old1", "old11", "e") for s in (".ilog", ".index"))


async def chunk_bytes(chunk: RemoteChunk) -> bytes:
    """A remote chunk's bytes: a block run's are in memory, a remote segment's stream in (and give their memory back)."""
    if isinstance(chunk.data, bytes):
        return chunk.data
    try:
        return b"".join([bytes(piece) async for piece in chunk.data.pieces()])
    finally:
        chunk.data.close()


async def read_through(reader: RemoteReader, topic: str, first: int, last: int) -> list:
    """Every message a consumer reading the bucket from `first` to `last` gets, chunk by chunk."""
    out, seq = [], first
    while seq <= last:
        chunk = await reader.fetch(TopicPartition(topic, 0), seq, 4096)
        assert isinstance(chunk, RemoteChunk), chunk
        got = [m for m in decode_segment(await chunk_bytes(chunk), chunk.first_bundle_seq) if m.seq >= seq]
        if got:
            out.extend(got)
            seq = got[-1].seq + 1
        else:
            seq += 1
    return out


async def test_consumers_of_the_bucket_read_a_consistent_history_across_a_swap(s3_store, cat, acat, tmp_path):
    plog, before = history(tmp_path, seed=5, bundles=60)
    epoch = await copy_history(s3_store, cat, "t", plog)
    last = plog.segments[-1].last
    expected = Model(RETENTION_S * 1000).compact(before, int(NOW_S * 1000))
    compact_partition(plog, NOW_S, force=True)
    planned = RemoteReader(s3_store, acat, Metrics(), clock=SYSTEM_CLOCK)
    assert rows(await read_through(planned, "t", 1, last)) == rows(before)  # its cache holds the old locations

    # A consumer reading while the groups are swapped one after the other gets, at every point, messages that
    # are the original ones, in seq order, and every message the model keeps.
    async def consume_during() -> list[list]:
        reads = []
        for _ in range(3):
            reads.append(await read_through(RemoteReader(s3_store, acat, Metrics(), clock=SYSTEM_CLOCK), "t", 1, last))
        return reads

    report, reads = await asyncio.gather(compactor(s3_store, acat, tmp_path).compact("t", 0, plog, epoch),
                                         consume_during())
    assert report.groups
    original = {m.seq: (m.key, m.value) for m in before}
    kept = {m.seq for m in expected}
    for got in reads:
        seqs = [m.seq for m in got]
        assert seqs == sorted(set(seqs)) and kept <= set(seqs)
        assert all(original[m.seq] == (m.key, m.value) for m in got)
    # The reader that planned before the swap still reads the old objects (within the grace period); a new one
    # reads the compacted history.
    assert rows(await read_through(planned, "t", 1, last)) == rows(before)
    assert rows(await read_through(RemoteReader(s3_store, acat, Metrics(), clock=SYSTEM_CLOCK), "t", 1, last)) == rows(expected)
    plog.close()


def test_runs_of_local_segments_are_matched_with_runs_of_remote_ones():
    def row(from_seq: int, base: int, last: int, size: int = 100) -> SegmentRow:
        index_size = SparseIndex([(0, 0)]).size_bytes
        return SegmentRow("t", 0, base, last, f"o{base}", f"i{base}", size, index_size, 0, 0, at(NOW_S), 1,
                          "COPY_FINISHED", at(NOW_S), from_seq)

    def seg(base: int, last: int, size: int = 50) -> SealedSegment:
        return SealedSegment("/nonexistent", base, last, 1, size, index=SparseIndex([(0, 0)]))

    rows_ = [row(1, 1, 10), row(11, 11, 20), row(21, 24, 30), row(31, 31, 40, size=50), row(41, 41, 60)]
    local = [seg(1, 20),  # merged two remote segments
             seg(24, 27), seg(28, 30),  # one remote segment (after a jump) cut in two
             seg(31, 40),  # the bucket's copy already: same seqs and sizes
             seg(41, 45), seg(46, 60)]  # past cleaned_upto: not compacted yet
    groups = _groups_from_local(rows_, local, cleaned_upto=40)
    assert [([r.base_seq for r in g.old], [(s.base, s.last) for s in g.new]) for g in groups] == [
        ([1, 11], [(1, 20)]), ([24], [(24, 27), (28, 30)])]
    # A local segment whose seqs end inside a remote one with nothing local after: no group.
    assert _groups_from_local([row(1, 1, 20)], [seg(1, 10)], cleaned_upto=40) == []


async def test_the_copier_leaves_a_segment_whose_seqs_the_bucket_holds(s3_store, cat, acat, tmp_path):
    plog, _ = history(tmp_path, seed=6, bundles=40)
    epoch = await copy_history(s3_store, cat, "t", plog)
    before = readable_segments(cat, "t", 0)
    copier = SegmentCopier(s3_store, acat, metrics=Metrics(), state=led_state({("t", 0): epoch}, committed_seq=10**9),
                           on_copied=lambda job: None, fence=lambda key, epoch, reason: None, grace=GRACE,
                           clock=SYSTEM_CLOCK)
    # A compaction output based inside a copied segment (a large group cut in two): already in the bucket.
    inner = plog.segments[1]
    cut = SealedSegment(inner.directory, inner.base + 1, inner.last, inner.freeze_ts, inner.size,
                        filename=inner.filename, index=inner.index)
    await copier.copy(CopyJob("t", 0, cut))
    assert readable_segments(cat, "t", 0) == before and copier.is_copied(TopicPartition("t", 0), cut.base)
    assert check_partition(cat, "t", 0).problems == []
    plog.close()


async def test_local_outputs_cut_smaller_than_the_remote_segments_replace_them(s3_store, cat, acat, tmp_path):
    plog = PartitionLog.open(str(tmp_path / "local"), replace(CONFIG, log_segment_bytes=4000), now_s=FakeClock())
    append_workload(plog, random_workload(random.Random(7), 80, 200))  # many keys: a pass keeps a lot
    plog.seal_active()
    before = log_messages(plog)
    epoch = await copy_history(s3_store, cat, "t", plog)
    plog.reconfigure(CONFIG)  # smaller segments now: a group's output is cut into several
    compact_partition(plog, NOW_S, force=True)
    assert len(plog.segments) > len(readable_segments(cat, "t", 0))
    report = await compactor(s3_store, acat, tmp_path).compact("t", 0, plog, epoch)
    assert report.groups and report.segments_after > report.segments_before
    expected = Model(RETENTION_S * 1000).compact(before, int(NOW_S * 1000))
    assert rows(await remote_messages(s3_store, cat, "t")) == rows(expected)
    assert check_partition(cat, "t", 0).problems == []
    assert [(r.base_seq, r.last_seq) for r in readable_segments(cat, "t", 0)] == [(s.base, s.last)
                                                                                 for s in plog.segments]
    plog.close()
