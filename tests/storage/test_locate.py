"""TANK's consume semantics over local segments (docs/protocol.md §3.3, §3.4, §10): tiered.bounds.locate decides,
PartitionLog.read carries it out (tests.support.storage_helpers.locate composes the two as a local-only broker)."""

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.storage_helpers import bundle_for_record, locate, plain_bundle, sparse_bundle, storage_config
from tiered.protocol.bundle import decode_bundle, maybe_record
from tiered.bounds import Boundary, Eof
from tiered.storage import PartitionLog, ReadRange

U64_MAX = (1 << 64) - 1


def chunk_seqs(chunk: ReadRange) -> list[int]:
    """Decodes a ReadRange's bytes as a consumer would: whole records, seqs from first_bundle_seq."""
    data = os.pread(chunk.file.fileno(), chunk.size, chunk.start_position)
    seqs, position, next_seq = [], 0, chunk.first_bundle_seq
    while position < len(data):
        start, end = maybe_record(data, position)
        messages = decode_bundle(data[start:end], next_seq)
        seqs += [m.seq for m in messages]
        next_seq = messages[-1].seq + 1
        position = end
    assert position == len(data)
    return seqs


def ten_records(open_storage_log, **kwargs):
    log = open_storage_log(storage_config(log_index_interval_bytes=128), **kwargs)
    for _ in range(10):
        log.append(bundle_for_record(107))
    return log


def test_empty_partition(open_storage_log):
    log = open_storage_log()
    assert locate(log, 0, 1000) == Eof(0, 0)
    assert locate(log, 1, 1000) == Eof(0, 0)
    assert locate(log, U64_MAX, 1000) == Eof(0, 0)
    assert locate(log, 2, 1000) == Boundary(0, 0)


def test_seq_zero_is_first_available(open_storage_log):
    log = ten_records(open_storage_log)
    chunk = locate(log, 0, 100_000)
    assert (chunk.first_bundle_seq, chunk.start_position, chunk.end_position, chunk.hwmark) == (1, 0, 1070, 10)
    assert chunk.file is log.active.reader() and chunk.segment is log.active
    assert chunk_seqs(chunk) == list(range(1, 11))


def test_tail_and_beyond(open_storage_log):
    log = ten_records(open_storage_log)
    assert locate(log, 11, 1000) == Eof(1, 10)
    assert locate(log, U64_MAX, 1000) == Eof(1, 10)
    assert locate(log, 12, 1000) == Boundary(1, 10)
    assert locate(log, 10, 1000).start_position == 963


def test_middle_of_a_bundle_starts_at_the_whole_bundle(open_storage_log):
    # Observed: request seq 2 -> base 1 with the 3-message bundle.
    log = open_storage_log()
    log.append(plain_bundle(b"a1", b"a2", b"a3"))
    log.append(plain_bundle(b"b1"))
    chunk = locate(log, 2, 1000)
    assert (chunk.first_bundle_seq, chunk.start_position, chunk.first_bundle_sparse) == (1, 0, False)
    assert chunk_seqs(chunk) == [1, 2, 3, 4]
    chunk = locate(log, 4, 1000)
    assert chunk.first_bundle_seq == 4 and chunk_seqs(chunk) == [4]


def test_fetch_size_smaller_than_a_bundle_still_returns_it(open_storage_log):
    log = open_storage_log()
    first = log.append(plain_bundle(b"a" * 20, b"b"))
    log.append(plain_bundle(b"c"))
    chunk = locate(log, 1, 5)
    assert (chunk.start_position, chunk.end_position) == (0, first.end_position)
    assert locate(log, 1, 0).end_position == first.end_position


def test_end_snaps_to_segment_end_index_entry_or_walk(open_storage_log):
    log = ten_records(open_storage_log)  # index (0,0) (2,214) (4,428) (6,642) (8,856), size 1070
    assert locate(log, 1, 1070).end_position == 1070  # the rest fits
    assert locate(log, 1, 1069).end_position == 856  # index entry <= start + fetch_size
    assert locate(log, 1, 700).end_position == 642
    assert locate(log, 1, 641).end_position == 428
    assert locate(log, 3, 214).end_position == 428  # start 214: entry at 428 exactly
    assert locate(log, 3, 200).end_position == 321  # no entry in (214, 414]: walk, stop before 321..428
    assert locate(log, 3, 106).end_position == 321  # at least the first bundle


def test_chunks_never_pass_the_hwmark(open_storage_log):
    log = ten_records(open_storage_log)
    chunk = locate(log, 1, 100_000, hwmark=5)
    assert chunk.hwmark == 5 and chunk.end_position == 428  # index entry (4, 428): seqs 1..4
    assert chunk_seqs(chunk) == [1, 2, 3, 4]
    chunk = locate(log, 5, 100_000, hwmark=5)
    assert (chunk.start_position, chunk.end_position) == (428, 535)  # the walk stops before seq 6
    assert locate(log, 6, 100_000, hwmark=5) == Eof(1, 5)
    assert log.read(6, 100_000, 5) is None  # asked directly: nothing visible at or after 6
    assert locate(log, 6, 100_000, hwmark=10).end_position == 1070


def test_a_gap_between_segments_is_not_answered_when_a_lower_tier_may_hold_it(open_storage_log):
    log = open_storage_log()
    log.append(plain_bundle(b"a", b"b", b"c"))
    log.ensure_next_seq(10)  # 4..9 are held elsewhere (a disk behind the catalog)
    log.append(plain_bundle(b"j"))
    assert [s.base for s in (*log.segments, log.active)] == [1, 10]
    assert log.read(5, 1000, 10, across_gaps=False) is None
    assert log.read(5, 1000, 10).first_bundle_seq == 10  # local-only: TANK's gap, the next bundle
    assert log.read(10, 1000, 10, across_gaps=False).first_bundle_seq == 10


def test_gap_inside_a_segment_starts_at_the_next_bundle(open_storage_log):
    log = open_storage_log()
    log.append(plain_bundle(b"a", b"b", b"c"))
    sparse = log.append(sparse_bundle(10, 12))
    log.append(plain_bundle(b"d"))
    for seq in (4, 9, 10, 11, 12):
        chunk = locate(log, seq, 1000)
        assert (chunk.start_position, chunk.first_bundle_seq, chunk.first_bundle_sparse) == (sparse.position, 10, True)
        assert chunk_seqs(chunk) == [10, 12, 13]
    assert locate(log, 13, 1000).first_bundle_sparse is False


def test_one_segment_per_range_and_gaps_between_segments(open_storage_log):
    log = open_storage_log()
    log.append(plain_bundle(b"a", b"b", b"c"))
    log.seal_active()
    log.append(plain_bundle(b"d"))  # segment 4
    log.append(plain_bundle(b"j"), base_seq=10)  # segment 10
    chunk = locate(log, 2, 100_000)
    assert chunk.segment is log.segments[0] and chunk_seqs(chunk) == [1, 2, 3]
    assert chunk.file is log.segments[0].reader()
    chunk = locate(log, 4, 100_000)
    assert chunk.segment is log.segments[1] and chunk_seqs(chunk) == [4]
    for seq in (5, 9):
        chunk = locate(log, seq, 100_000)
        assert chunk.segment is log.active and chunk.first_bundle_seq == 10 and chunk_seqs(chunk) == [10]


def test_below_first_available_is_a_boundary(open_storage_log):
    config = storage_config(log_segment_bytes=64, retention_segments_count=2)
    log = open_storage_log(config)
    for _ in range(6):
        log.append(bundle_for_record(107))
    assert [s.base for s in log.segments] == [4, 5] and log.first_available == 4
    assert locate(log, 3, 1000) == Boundary(4, 6)
    assert locate(log, 1, 1000) == Boundary(4, 6)
    assert locate(log, 0, 1000).first_bundle_seq == 4
    assert chunk_seqs(locate(log, 5, 1000)) == [5]


RECORD = st.one_of(
    st.tuples(st.just("plain"), st.integers(1, 4), st.integers(0, 200)),  # messages, content bytes
    st.tuples(st.just("sparse"), st.integers(1, 5), st.integers(1, 3)),  # jump, message count
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(RECORD, min_size=1, max_size=40),
    interval=st.sampled_from([128, 256, 4096]),
    segment_bytes=st.sampled_from([64, 700, 1 << 30]),
    fetch_size=st.integers(0, 3000),
    visible_cut=st.floats(0, 1),
    seq_pick=st.floats(0, 1),
)
def test_locate_properties(tmp_path_factory, records, interval, segment_bytes, fetch_size, visible_cut, seq_pick):
    config = storage_config(log_index_interval_bytes=interval, log_segment_bytes=segment_bytes)
    log = PartitionLog.open(str(tmp_path_factory.mktemp("p")), config)
    try:
        written = []
        for kind, a, b in records:
            if kind == "plain":
                written.append(log.append(plain_bundle(*[bytes([65 + i]) * b for i in range(a)])))
            else:
                first = log.last_assigned + a
                written.append(log.append(sparse_bundle(*range(first, first + 2 * b, 2))))
        visible = written[int(visible_cut * (len(written) - 1))].last_seq
        first = log.first_available
        seq = first + int(seq_pick * (visible + 1 - first))
        if first > 1:
            assert locate(log, first - 1, fetch_size, visible) == Boundary(first, visible)
        result = locate(log, seq, fetch_size, visible)
        if seq == visible + 1:
            assert result == Eof(log.first_available, visible)
            return
        assert isinstance(result, ReadRange)
        holding = [w for w in written if w.last_seq >= seq][0]  # the record holding seq, or the next after a gap
        assert (result.start_position, result.first_bundle_seq) == (holding.position, holding.first_seq)
        assert result.segment.base == holding.segment_base
        in_range = [w for w in written if w.segment_base == holding.segment_base and w.position >= holding.position]
        ends = {w.end_position: w for w in in_range}
        assert result.end_position in ends  # whole records only
        included = [w for w in in_range if w.end_position <= result.end_position]
        assert included[0] is holding
        assert all(w.last_seq <= visible for w in included)
        assert result.size <= max(fetch_size, holding.end_position - holding.position)
        data = os.pread(result.file.fileno(), result.size, result.start_position)
        assert data == b"".join(w.record for w in included)
    finally:
        log.close()
