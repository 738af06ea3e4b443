"""Replay planning without Spark, a catalog or a store: pruning, run grouping, and splitting at index entries."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.errors import ProtocolError
from tiered.spark.decoding import iter_messages
from tiered.spark.planning import (
    RunEntry,
    RunPiece,
    SegmentEntry,
    SegmentPiece,
    SeqRange,
    SegmentRange,
    Split,
    TimeRange,
    cut_segment_range,
    load_segment_index,
    order_splits,
    plan_partition,
    resolve_segment_range,
)
from tiered.storage.index import SparseIndex
from tiered.storage.partition_log import PartitionLog
from tiered.storage.topic_config import TopicConfig

T = 1_700_000_000_000


def seg(base: int, last: int, size: int = 1000, min_ts: int | None = None, max_ts: int | None = None) -> SegmentEntry:
    return SegmentEntry(base, last, f"s/{base}.ilog", f"s/{base}.index", size,
                        T + base if min_ts is None else min_ts, T + last if max_ts is None else max_ts)


def run(first: int, last: int, length: int = 100, key: str | None = None, min_ts: int | None = None,
        max_ts: int | None = None) -> RunEntry:
    return RunEntry(first, last, key or f"b/{first}.blk", 0, length,
                    T + first if min_ts is None else min_ts, T + last if max_ts is None else max_ts)


def seq_windows(splits: list[Split]) -> list[tuple[str, int, int]]:
    return [(type(p).__name__[:3], p.min_seq, p.max_seq) for s in splits for p in s.pieces]


def test_segments_then_runs_for_the_tail_above_the_copied_seq_share_a_split_when_small():
    splits = plan_partition("t", 0, [seg(101, 200), seg(1, 100)], [run(150, 210), run(211, 230)], 200, SeqRange())
    assert seq_windows(splits) == [("Seg", 1, 100), ("Seg", 101, 200), ("Run", 201, 210), ("Run", 211, 230)]
    assert [len(s.pieces) for s in splits] == [4]
    assert all(s.topic == "t" and s.partition == 0 for s in splits)


def test_seq_range_prunes_segments_and_runs_and_bounds_the_edge_pieces():
    segments = [seg(1, 100), seg(101, 200), seg(201, 300)]
    runs = [run(301, 320), run(321, 340), run(341, 360)]
    splits = plan_partition("t", 0, segments, runs, 300, SeqRange(150, 325))
    assert seq_windows(splits) == [("Seg", 150, 200), ("Seg", 201, 300), ("Run", 301, 320), ("Run", 321, 325)]
    assert plan_partition("t", 0, segments, runs, 300, SeqRange(400, 500)) == []
    assert plan_partition("t", 0, segments, runs, 300, SeqRange(10, 5)) == []


def test_time_range_prunes_segments_from_their_catalog_timestamps():
    segments = [seg(1, 100, min_ts=1000, max_ts=1999), seg(101, 200, min_ts=2000, max_ts=2999),
                seg(201, 300, min_ts=2500, max_ts=3500)]
    # [2_000_000 us, 2_500_000 us): the first segment ends before it, the third starts at its (exclusive) end.
    splits = plan_partition("t", 0, segments, [], 300, SeqRange(), TimeRange(2_000_000, 2_500_000))
    assert seq_windows(splits) == [("Seg", 101, 200)]
    # Inclusive start at the microsecond: a segment whose newest message is exactly at the start is kept.
    splits = plan_partition("t", 0, segments, [], 300, SeqRange(), TimeRange(1_999_000, 1_999_001))
    assert seq_windows(splits) == [("Seg", 1, 100)]
    assert plan_partition("t", 0, segments, [], 300, SeqRange(), TimeRange(5, 5)) == []


def test_time_range_prunes_runs_from_their_catalog_timestamps():
    runs = [run(1, 10, min_ts=1000, max_ts=1999), run(11, 20, min_ts=3000, max_ts=3999),
            run(21, 30, min_ts=2500, max_ts=4500), run(31, 40, min_ts=4000, max_ts=4999)]
    # [3_000_000 us, 4_000_000 us): the first run ends before it, the last starts at its (exclusive) end.
    splits = plan_partition("t", 0, [], runs, 0, SeqRange(), TimeRange(3_000_000, 4_000_000))
    assert seq_windows(splits) == [("Run", 11, 20), ("Run", 21, 30)]
    splits = plan_partition("t", 0, [], runs, 0, SeqRange(), TimeRange(1_999_000, 1_999_001))
    assert seq_windows(splits) == [("Run", 1, 10)]  # a run whose newest message is exactly at the start is kept
    # A skipped run does not move the seq window: the next run kept still starts at its own first seq.
    splits = plan_partition("t", 0, [], runs, 0, SeqRange(5, 40), TimeRange(4_600_000, None))
    assert seq_windows(splits) == [("Run", 31, 40)]


def test_runs_are_grouped_into_splits_of_at_most_max_split_bytes_in_seq_order():
    runs = [run(i * 10 + 1, i * 10 + 10, length=3000) for i in range(7)]
    splits = plan_partition("t", 3, [], reversed(runs), 0, SeqRange(), max_split_bytes=8192)
    assert [[p.min_seq for p in s.pieces] for s in splits] == [[1, 11], [21, 31], [41], [51, 61]]
    assert all(s.planned_bytes <= 8192 for s in splits)


def test_splits_are_about_equal_in_size():
    """Ten 5,000-byte segments and a tail of 6,000 bytes of runs under a 48,000-byte cap: two splits of about half
    each, which two executor cores read side by side, where filling the first to the cap would leave 11,000 bytes."""
    segments = [seg(i * 100 + 1, i * 100 + 100, size=5000) for i in range(10)]
    runs = [run(1001 + i * 10, 1010 + i * 10, length=1000) for i in range(6)]
    splits = plan_partition("t", 0, segments, runs, 1000, SeqRange(), max_split_bytes=48_000)
    assert [s.planned_bytes for s in splits] == [30_000, 26_000]
    whole = plan_partition("t", 0, segments, runs, 1000, SeqRange(), max_split_bytes=1 << 30)
    assert [p for s in splits for p in s.pieces] == list(whole[0].pieces)


def test_a_large_segment_is_split_into_windows_that_tile_it():
    splits = plan_partition("t", 0, [seg(1, 1000, size=100_000)], [], 1000, SeqRange(), max_split_bytes=30_000)
    windows = [(p.window_start, p.window_end) for s in splits for p in s.pieces]
    assert windows == [(0, 25_000), (25_000, 50_000), (50_000, 75_000), (75_000, 100_000)]
    assert all(p.needs_index for s in splits for p in s.pieces)


def test_overlapping_segments_never_yield_a_seq_twice():
    splits = plan_partition("t", 0, [seg(1, 100), seg(50, 150), seg(120, 140)], [run(100, 200)], 150, SeqRange())
    assert seq_windows(splits) == [("Seg", 1, 100), ("Seg", 101, 150), ("Run", 151, 200)]


def test_only_the_pieces_that_can_skip_need_the_index():
    (whole,) = plan_partition("t", 0, [seg(1, 100)], [], 100, SeqRange())[0].pieces
    assert not whole.needs_index
    assert resolve_segment_range(whole, None).start == 0
    (cut,) = plan_partition("t", 0, [seg(1, 100)], [], 100, SeqRange(2, 100))[0].pieces
    assert cut.needs_index
    with pytest.raises(ValueError):
        resolve_segment_range(cut, None)


def test_resolve_moves_window_ends_and_seq_bounds_to_index_entries():
    index = SparseIndex([(0, 0), (10, 300), (20, 600), (30, 900)])
    piece = SegmentPiece("s", "i", 101, 140, 1200, 250, 700, 101, 140)
    found = resolve_segment_range(piece, index)
    assert (found.start, found.end, found.first_seq) == (300, 900, 111)
    # seq 125 lies in the record indexed at rel 20 or after it; seq 128 ends before the record at rel 30.
    piece = SegmentPiece("s", "i", 101, 140, 1200, 0, 1200, 125, 128)
    found = resolve_segment_range(piece, index)
    assert (found.start, found.end, found.first_seq) == (600, 900, 121)
    # A window with no index entry in it reads nothing: the window before it reads up to the next entry.
    assert resolve_segment_range(SegmentPiece("s", "i", 101, 140, 1200, 950, 1200, 101, 140), index) is None
    assert resolve_segment_range(SegmentPiece("s", "i", 101, 140, 1200, 310, 590, 101, 140), index) is None


def test_a_long_range_is_cut_into_parts_at_index_entries():
    index = SparseIndex([(0, 0), (10, 300), (20, 600), (30, 900)])
    whole = SegmentRange(0, 1200, 101)
    parts = [(p.start, p.end, p.first_seq) for p in cut_segment_range(whole, index, 101, 250)]
    assert parts == [(0, 300, 101), (300, 600, 111), (600, 900, 121), (900, 1200, 131)]
    assert [(p.start, p.end) for p in cut_segment_range(whole, index, 101, 500)] == [(0, 600), (600, 1200)]
    assert cut_segment_range(whole, index, 101, 1200) == [whole]
    assert cut_segment_range(whole, None, 101, 10) == [whole]
    middle = SegmentRange(300, 900, 111)  # ends at an entry: no empty part after it
    assert [(p.start, p.end, p.first_seq) for p in cut_segment_range(middle, index, 101, 100)] == [
        (300, 600, 111), (600, 900, 121)]


def test_a_bad_index_object_is_refused():
    piece = SegmentPiece("s", "i", 101, 140, 1200, 0, 600, 101, 140)
    with pytest.raises(ProtocolError, match="partial entry"):
        load_segment_index(SparseIndex([(0, 0)]).to_bytes() + b"\x01", piece)
    with pytest.raises(ProtocolError, match="outside its segment"):
        load_segment_index(SparseIndex([(0, 0), (5, 1200)]).to_bytes(), piece)
    with pytest.raises(ProtocolError):
        load_segment_index(SparseIndex([(5, 10)]).to_bytes() + SparseIndex([(4, 20)]).to_bytes(), piece)


def test_plan_rejects_a_tiny_max_split_size():
    with pytest.raises(ValueError):
        plan_partition("t", 0, [], [], 0, SeqRange(), max_split_bytes=100)


def test_order_splits_sorts_by_partition_then_seq():
    a = Split("t", 1, (RunPiece("b", 0, 1, 5, 5, 9),))
    b = Split("t", 0, (RunPiece("b", 0, 1, 50, 50, 60),))
    c = Split("t", 0, (RunPiece("b", 0, 1, 1, 1, 4),))
    assert order_splits([a, b, c]) == [c, b, a]


# --- splitting a real segment file at its index entries ------------------------------------------------------------


@pytest.fixture(scope="module")
def segment_file(tmp_path_factory) -> tuple[bytes, bytes, list[Message], int, int]:
    """A sealed TANK segment of plain, snappy and sparse bundles, indexed every ~200 bytes."""
    directory = tmp_path_factory.mktemp("segment")
    log = PartitionLog.open(str(directory), TopicConfig(log_index_interval_bytes=200))
    rng = random.Random(7)
    messages: list[Message] = []
    for i in range(120):
        n = rng.randint(1, 12)
        if i % 5 == 4:
            seqs = sorted(rng.sample(range(log.last_assigned + 1, log.last_assigned + 3 * n + 2), n))
            batch = [Message(b"s%d" % s, None, T + s, s) for s in seqs]
            log.append(encode_bundle(batch, sparse=True))
        else:
            first = log.last_assigned + 1
            batch = [Message(b"p%d" % (first + j) * rng.randint(1, 40), b"k", T + first + j, first + j)
                     for j in range(n)]
            log.append(encode_bundle(batch, codec=1 if i % 3 == 0 else 0))
        messages += batch
    sealed = log.seal_active()
    data, index = Path(sealed.path).read_bytes(), Path(sealed.index_path).read_bytes()
    log.close()
    return data, index, messages, sealed.base, sealed.last


@settings(max_examples=60, deadline=None)
@given(max_split=st.integers(4096, 20_000), first=st.integers(1, 700), span=st.integers(0, 700),
       start_ms=st.integers(0, 400), end_ms=st.integers(0, 800))
def test_windows_and_seq_bounds_read_each_wanted_message_exactly_once(segment_file, max_split, first, span,
                                                                        start_ms, end_ms):
    data, index_bytes, messages, base, last = segment_file
    entry = SegmentEntry(base, last, "s.ilog", "s.index", len(data), T + base, T + last)
    seqs = SeqRange(first, first + span)
    times = TimeRange((T + start_ms) * 1000, (T + start_ms + end_ms) * 1000)
    splits = plan_partition("t", 0, [entry], [], last, seqs, times, max_split_bytes=max_split)
    got = []
    for split in splits:
        (piece,) = split.pieces
        index = load_segment_index(index_bytes, piece) if piece.needs_index else None
        found = resolve_segment_range(piece, index)
        if found is not None:
            assert found.end - found.start <= len(data)
            got += iter_messages(data[found.start:found.end], found.first_seq, SeqRange(piece.min_seq, piece.max_seq),
                                 times)
    expected = [m for m in messages if seqs.first <= m.seq <= seqs.last and times.contains_ms(m.ts_ms)]
    assert got == expected


def test_windows_start_only_at_index_entries(segment_file):
    data, index_bytes, _, base, last = segment_file
    index = SparseIndex.from_bytes(index_bytes)[0]
    assert len(index) > 10
    entry = SegmentEntry(base, last, "s.ilog", "s.index", len(data), T, T + last)
    starts = []
    for split in plan_partition("t", 0, [entry], [], last, SeqRange(), max_split_bytes=4096):
        found = resolve_segment_range(split.pieces[0], index)
        if found is not None:
            starts.append(found.start)
    assert len(starts) > 1 and set(starts) <= set(index.positions)
