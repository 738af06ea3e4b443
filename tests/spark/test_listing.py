"""The driver's catalog side and the executors' reads, without Spark: a history built as a broker leaves it (remote
segments, pruned runs, a tail of runs) on SQLite and PostgreSQL, planned and read back from a file store."""

from __future__ import annotations

import pytest

from tiered.catalog import Catalog
from tiered.catalog import topics as catalog_topics
from tiered.spark import listing
from tiered.spark.decoding import decode_pieces, iter_messages
from tiered.spark.execution import iter_pieces, piece_gets, split_messages
from tiered.spark.listing import UnknownTopicError, plan_topic
from tiered.spark.objects import FileRangeReader
from tiered.spark.planning import MIN_SPLIT_BYTES, RunPiece, SegmentPiece, SeqRange, TimeRange

from tests.spark.history import FileObjects, PartitionHistory, build_history, mixed_bundles

TOPIC = "events"


@pytest.fixture
def cat(catalog_url):
    cat = Catalog.open(catalog_url)
    catalog_topics.create_topic(cat, TOPIC, 2)
    yield cat
    cat.close()


@pytest.fixture
def objects(tmp_path) -> FileObjects:
    return FileObjects(tmp_path / "objects")


@pytest.fixture
def histories(cat, objects, tmp_path):
    built = [build_history(cat, objects, TOPIC, p, tmp_path / f"log{p}", seed=p) for p in (0, 1)]
    yield built
    for h in built:
        h.close()


def read_all(cat, objects, **kwargs) -> dict[int, list]:
    reader = FileRangeReader(str(objects.root))
    times = kwargs.get("times", TimeRange())
    out: dict[int, list] = {}
    for plan in plan_topic(cat, TOPIC, **kwargs):
        out[plan.partition] = [m for split in plan.splits for m in split_messages(reader, split, times)]
    return out


def test_a_topic_reads_back_exactly_from_segments_and_runs(cat, objects, histories):
    plans = plan_topic(cat, TOPIC)
    for plan, history in zip(plans, histories):
        kinds = {type(p) for s in plan.splits for p in s.pieces}
        assert kinds == {SegmentPiece, RunPiece}
        assert sum(isinstance(p, SegmentPiece) for s in plan.splits for p in s.pieces) == 3  # a piece per segment
        assert plan.seqs.last == history.log.last_assigned  # the catalog's high-water mark
    got = read_all(cat, objects)
    assert got == {0: histories[0].messages, 1: histories[1].messages}


def test_seq_ranges_and_partitions_read_exactly_what_they_name(cat, objects, histories):
    messages = histories[1].messages
    middle = messages[len(messages) // 3].seq
    late = messages[-len(messages) // 5].seq  # inside the tail of runs
    got = read_all(cat, objects, partitions=[1], seqs=SeqRange(middle, late))
    assert list(got) == [1]
    assert got[1] == [m for m in messages if middle <= m.seq <= late]
    assert read_all(cat, objects, partitions=[7]) == {}


def test_time_ranges_read_exactly_the_messages_inside_them(cat, objects, histories):
    messages = histories[0].messages
    stamps = sorted(m.ts_ms for m in messages)
    start, end = stamps[len(stamps) // 4], stamps[3 * len(stamps) // 4]
    times = TimeRange(start * 1000, end * 1000)
    got = read_all(cat, objects, times=times)
    assert got[0] == [m for m in messages if start <= m.ts_ms < end]
    assert got[1] == [m for m in histories[1].messages if start <= m.ts_ms < end]
    # Segments wholly outside the range are pruned from their catalog timestamps.
    plans = plan_topic(cat, TOPIC, partitions=[0], times=TimeRange(0, histories[0].segments[0].min_ts_ms * 1000))
    assert plans[0].splits == [] or all(isinstance(p, RunPiece) for s in plans[0].splits for p in s.pieces)


def test_a_time_range_skips_the_runs_outside_it(cat, objects, tmp_path):
    """Runs carry their timestamp bounds from the catalog: a run wholly outside the range is never planned."""
    import random

    history = PartitionHistory(cat, objects, TOPIC, 0, tmp_path / "times")
    rng = random.Random(5)
    for t0_ms in (1_000_000, 2_000_000, 3_000_000):  # three runs, far apart in time
        mixed_bundles(rng, history, 4, t0_ms=t0_ms)
        history.commit_run()
    early, middle, late = history.runs
    assert early.max_ts_ms < middle.min_ts_ms and middle.max_ts_ms < late.min_ts_ms
    times = TimeRange(middle.min_ts_ms * 1000, (middle.max_ts_ms + 1) * 1000)
    [plan] = plan_topic(cat, TOPIC, partitions=[0], times=times)
    pieces = [p for s in plan.splits for p in s.pieces]
    assert [(p.first_seq, p.max_seq) for p in pieces] == [(middle.first_seq, middle.last_seq)]
    assert read_all(cat, objects, partitions=[0], times=times)[0] == [
        m for m in history.messages if middle.first_seq <= m.seq <= middle.last_seq]
    history.close()


def test_small_splits_and_small_pages_read_the_same(cat, objects, histories, monkeypatch):
    monkeypatch.setattr(listing, "FIRST_PAGE_ROWS", 1)
    monkeypatch.setattr(listing, "PAGE_ROWS", 3)
    plans = plan_topic(cat, TOPIC, max_split_bytes=MIN_SPLIT_BYTES)
    assert max(len(p.splits) for p in plans) > 8
    assert read_all(cat, objects, max_split_bytes=MIN_SPLIT_BYTES) == {0: histories[0].messages,
                                                                        1: histories[1].messages}


@pytest.mark.parametrize("seqs", [SeqRange(), SeqRange(300, 2000)])
def test_segments_read_in_parts_at_index_entries_read_the_same(cat, objects, histories, seqs):
    """Parts of 700 bytes and 2 KiB of read-ahead: many GETs per segment, each decoded on its own, the same messages
    and the same batches from both decoders."""
    reader = FileRangeReader(str(objects.root))
    for plan in plan_topic(cat, TOPIC, seqs=seqs):
        expected = [m for m in histories[plan.partition].messages if seqs.first <= m.seq <= seqs.last]
        parts = [got for split in plan.splits for got in iter_pieces(reader, split, read_ahead=2048, part_bytes=700)]
        gets = sum(len(piece_gets(reader, p, 700)) for s in plan.splits for p in s.pieces)
        assert len(parts) == gets > 3 * sum(len(s.pieces) for s in plan.splits)
        assert [m for got in parts for m in iter_messages(got.data, got.first_seq, got.seqs)] == expected
        pure = list(decode_pieces(parts, TOPIC, plan.partition, batch_rows=100, decoder="python"))
        native = list(decode_pieces(parts, TOPIC, plan.partition, batch_rows=100, decoder="native"))
        assert [b.num_rows for b in native] == [b.num_rows for b in pure]
        assert all(a.equals(b) for a, b in zip(native, pure))
        assert sum(b.num_rows for b in native) == len(expected)


class CountingReader(FileRangeReader):
    """Counts the bytes range-GET so far."""

    requested = 0

    def get_range(self, object_key: str, start: int, end: int) -> bytes:
        self.requested += end - start
        return super().get_range(object_key, start, end)


def test_read_ahead_stays_within_its_budget(cat, objects, histories):
    reader = CountingReader(str(objects.root))
    for plan in plan_topic(cat, TOPIC):
        for split in plan.splits:
            largest = max(g.size for p in split.pieces for g in piece_gets(reader, p, 700))
            reader.requested = consumed = 0
            for got in iter_pieces(reader, split, read_ahead=2048, part_bytes=700):
                assert reader.requested - consumed <= 2048 + largest
                consumed += len(got.data)
            assert consumed == reader.requested


def test_a_run_straddling_the_last_copied_segment_is_read_above_it_only(cat, objects, tmp_path):
    import random

    history = PartitionHistory(cat, objects, TOPIC, 0, tmp_path / "straddle")
    rng = random.Random(3)
    mixed_bundles(rng, history, 5)
    history.commit_run()
    mixed_bundles(rng, history, 5)
    sealed = history.log.seal_active()  # rolled mid-run: the pending run covers this segment's end ...
    mixed_bundles(rng, history, 5)
    straddling = history.commit_run()  # ... and the next segment's start
    history.copy_sealed(sealed)
    assert straddling.first_seq <= sealed.last < straddling.last_seq
    got = read_all(cat, objects, partitions=[0])[0]
    assert got == history.messages
    history.close()


def test_an_unknown_topic_is_refused(cat):
    with pytest.raises(UnknownTopicError):
        plan_topic(cat, "nope")


def test_an_empty_partition_plans_nothing(cat):
    plans = plan_topic(cat, TOPIC)
    assert [(p.partition, p.splits, p.seqs.empty) for p in plans] == [(0, [], True), (1, [], True)]
